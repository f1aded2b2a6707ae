"""Typed settings from the environment (nodus_kit.configuring, issue #19): each field names its variable,
an unset one keeps its default, a bad one is refused with its name, its value and what it accepts."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest
from msgspec import Meta

from nodus_kit.configuring import Env, SettingError, read_settings
from nodus_kit.leasing import LeaderSettings
from nodus_schema.quantities import usd_to_micros


class Knobs(msgspec.Struct, frozen=True, kw_only=True):
    period_s: Annotated[float, Meta(gt=0), Env("NODUS_T_PERIOD_S", "seconds")] = 600.0
    workers: Annotated[int, Meta(ge=1, le=64), Env("NODUS_T_WORKERS")] = 4
    enabled: Annotated[bool, Env("NODUS_T_ENABLED")] = True
    name: Annotated[str, Meta(min_length=2), Env("NODUS_T_NAME")] = "sim"
    path: Annotated[str | None, Env("NODUS_T_PATH")] = None
    credits_micros: Annotated[int, Env("NODUS_T_CREDITS_USD", parse=usd_to_micros)] = 0


class Needs(msgspec.Struct, frozen=True):
    token: Annotated[str, Env("NODUS_T_TOKEN")]


class Unnamed(msgspec.Struct, frozen=True):
    period_s: float = 1.0


def test_unset_and_empty_variables_keep_the_defaults() -> None:
    assert read_settings(Knobs, {}) == Knobs()
    assert read_settings(Knobs, {"NODUS_T_PERIOD_S": "", "NODUS_T_WORKERS": "  "}) == Knobs()


def test_each_variable_is_converted_to_its_fields_type() -> None:
    env = {
        "NODUS_T_PERIOD_S": " 2.5 ",
        "NODUS_T_WORKERS": "8",
        "NODUS_T_ENABLED": "off",
        "NODUS_T_NAME": "fleet",
        "NODUS_T_PATH": "/etc/nodus/catalog.json",
        "NODUS_T_CREDITS_USD": "12.50",
        "NODUS_UNRELATED": "ignored",
    }
    assert read_settings(Knobs, env) == Knobs(
        period_s=2.5,
        workers=8,
        enabled=False,
        name="fleet",
        path="/etc/nodus/catalog.json",
        credits_micros=12_500_000,
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("on", True),
        ("TRUE", True),
        ("yes", True),
        ("1", True),
        ("Off", False),
        ("false", False),
        ("0", False),
    ],
)
def test_a_switch_takes_the_usual_words(text: str, want: bool) -> None:
    assert read_settings(Knobs, {"NODUS_T_ENABLED": text}).enabled is want


@pytest.mark.parametrize("bad", ["0", "-5", "ten", "nan", "inf", "-inf"])
def test_a_bad_number_is_refused_with_the_variable_and_what_it_takes(bad: str) -> None:
    with pytest.raises(SettingError) as refused:
        read_settings(Knobs, {"NODUS_T_PERIOD_S": bad})
    want = f"NODUS_T_PERIOD_S={bad!r}: give a number of seconds more than 0 (e.g. 600)"
    assert str(refused.value) == want
    assert isinstance(refused.value, ValueError)  # callers that catch ValueError keep working


def test_bounds_lengths_and_switches_say_what_they_accept() -> None:
    cases = {
        "NODUS_T_WORKERS": ("1.5", "give a whole number at least 1 and at most 64 (e.g. 4)"),
        "NODUS_T_ENABLED": ("maybe", "give on or off, true or false, yes or no, 1 or 0 (e.g. on)"),
        "NODUS_T_NAME": ("x", "give text of at least 2 characters (e.g. sim)"),
    }
    for name, (bad, accepts) in cases.items():
        with pytest.raises(SettingError, match=f"^{name}='{bad}': ") as refused:
            read_settings(Knobs, {name: bad})
        assert str(refused.value).endswith(accepts)
    with pytest.raises(SettingError, match=r"NODUS_T_WORKERS='65': give a whole number at least 1"):
        read_settings(Knobs, {"NODUS_T_WORKERS": "65"})


def test_a_fields_own_parser_says_what_it_accepts() -> None:
    with pytest.raises(SettingError, match=r"NODUS_T_CREDITS_USD='1e3': .*exponent"):
        read_settings(Knobs, {"NODUS_T_CREDITS_USD": "1e3"})


def test_every_bad_variable_is_named_in_one_error() -> None:
    with pytest.raises(SettingError) as refused:
        read_settings(Knobs, {"NODUS_T_PERIOD_S": "soon", "NODUS_T_WORKERS": "0", "NODUS_T_NAME": "ok"})
    assert [p.split("=")[0] for p in refused.value.problems] == ["NODUS_T_PERIOD_S", "NODUS_T_WORKERS"]


def test_a_field_without_a_default_must_be_set() -> None:
    assert read_settings(Needs, {"NODUS_T_TOKEN": "s3cret"}) == Needs("s3cret")
    with pytest.raises(SettingError, match=r"^NODUS_T_TOKEN is not set: give text$"):
        read_settings(Needs, {})


def test_a_field_that_names_no_variable_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match=r"Unnamed.period_s names no variable"):
        read_settings(Unnamed, {})


def test_the_leaders_settings_extend_to_a_services_own() -> None:
    class Own(LeaderSettings, frozen=True, kw_only=True):
        hold_s: Annotated[float, Meta(ge=0), Env("NODUS_T_HOLD_S", "seconds")] = 1.0

    own = read_settings(Own, {"NODUS_LEASE_TTL_S": "3", "NODUS_RESYNC_S": "0.5", "NODUS_T_HOLD_S": "0"})
    assert (own.lease_ttl_s, own.resync_s, own.hold_s) == (3, 0.5, 0.0)
    assert read_settings(Own, {}) == Own(lease_ttl_s=15, resync_s=30.0, hold_s=1.0)
    for bad in ("0", "2.5", "ten"):
        with pytest.raises(SettingError, match=rf"NODUS_LEASE_TTL_S='{bad}': give a whole number of seconds"):
            read_settings(Own, {"NODUS_LEASE_TTL_S": bad})
