"""Quantities, Go durations and USD amounts: exact parsing, canonical formatting, human errors."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodus_schema.quantities import (
    duration_micros,
    format_bytes,
    format_cpu,
    format_duration,
    format_usd,
    micros_to_usd,
    parse_bytes,
    parse_cpu_millis,
    parse_decimal,
    parse_duration,
    parse_quantity,
    parse_usd,
    usd_to_micros,
)

# --- quantities ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4", Decimal(4)),
        ("500m", Decimal("0.5")),
        ("64Gi", Decimal(64 * 2**30)),
        ("1Ti", Decimal(2**40)),
        ("2T", Decimal(2 * 10**12)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("1e3", Decimal(1000)),
        ("100k", Decimal(100_000)),
        ("1Ei", Decimal(2**60)),
        ("3E", Decimal(3 * 10**18)),
        ("0", Decimal(0)),
        ("250u", Decimal("0.000250")),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("64GB", "did you mean"),
        ("-1Gi", "never negative"),
        ("", "not a Kubernetes quantity"),
        ("Gi", "not a Kubernetes quantity"),
        ("1 Gi", "not a Kubernetes quantity"),
        ("1x", "unknown suffix"),
        ("9" * 80, "too long"),
    ],
)
def test_parse_quantity_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_quantity(text)


def test_parse_quantity_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        parse_quantity(4)  # type: ignore[arg-type]


def test_bytes_and_cpu() -> None:
    assert parse_bytes("64Gi") == 68_719_476_736
    assert parse_bytes("2T") == 2_000_000_000_000
    with pytest.raises(ValueError, match="whole number of bytes"):
        parse_bytes("500m")
    assert parse_cpu_millis("4") == 4000
    assert parse_cpu_millis("500m") == 500
    assert parse_cpu_millis("0.25") == 250
    with pytest.raises(ValueError, match="millicore"):
        parse_cpu_millis("1u")


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0"), (1023, "1023"), (2**36, "64Gi"), (2**40, "1Ti"), (3072, "3Ki"), (1536, "1536")]
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text
    assert parse_bytes(text) == n


@given(st.integers(min_value=0, max_value=2**70))
def test_bytes_round_trip(n: int) -> None:
    assert parse_bytes(format_bytes(n)) == n


@given(st.integers(min_value=0, max_value=10**9))
def test_cpu_round_trip(millis: int) -> None:
    assert parse_cpu_millis(format_cpu(millis)) == millis


# --- durations ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("15m", timedelta(minutes=15)),
        ("0s", timedelta(0)),
        ("0", timedelta(0)),
        ("1.5h", timedelta(minutes=90)),
        ("300ms", timedelta(milliseconds=300)),
        ("168h", timedelta(days=7)),
        ("1h0m0s", timedelta(hours=1)),
        ("2us", timedelta(microseconds=2)),
        ("2\u00b5s", timedelta(microseconds=2)),
        ("1000ns", timedelta(microseconds=1)),
        (".5s", timedelta(milliseconds=500)),
    ],
)
def test_parse_duration(text: str, value: timedelta) -> None:
    assert parse_duration(text) == value


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("15", "missing unit"),
        ("1d", "unknown unit"),
        ("", "write a Go duration"),
        ("m", "write a Go duration"),
        ("1h 30m", "write a Go duration"),
        ("-5m", "must not be negative"),
        ("1ns", "finer than a microsecond"),
    ],
)
def test_parse_duration_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_duration(text)


def test_negative_duration_when_allowed() -> None:
    assert parse_duration("-1m30s", allow_negative=True) == -timedelta(seconds=90)
    assert format_duration(-timedelta(seconds=90)) == "-1m30s"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(minutes=90), "1h30m0s"),
        (timedelta(minutes=15), "15m0s"),
        (timedelta(0), "0s"),
        (timedelta(milliseconds=300), "300ms"),
        (timedelta(milliseconds=1500), "1.5s"),
        (timedelta(microseconds=1500), "1.5ms"),
        (timedelta(microseconds=7), "7\u00b5s"),
        (timedelta(days=7), "168h0m0s"),
        (timedelta(minutes=1, milliseconds=500), "1m0.5s"),
    ],
)
def test_format_duration_is_go(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@given(st.timedeltas(min_value=timedelta(days=-400), max_value=timedelta(days=400)))
def test_duration_round_trip(td: timedelta) -> None:
    assert parse_duration(format_duration(td), allow_negative=True) == td


def test_duration_micros_is_exact() -> None:
    assert duration_micros(timedelta(days=3, microseconds=1)) == 3 * 86_400_000_000 + 1


# --- USD --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "micros"),
    [("12.50", 12_500_000), ("0.000001", 1), ("0", 0), ("100", 100_000_000), ("0.1", 100_000)],
)
def test_usd(text: str, micros: int) -> None:
    assert parse_usd(text) == Decimal(text)
    assert usd_to_micros(text) == micros


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("1e-6", "exponent"),
        ("-1.00", "must not be negative"),
        ("0.0000001", "more than 6 decimal places"),
        ("$12", "not a decimal string"),
        ("12,50", "not a decimal string"),
        ("", "not a decimal string"),
        (12, r"not 12 \(int\)"),
        (True, r"not True \(bool\)"),
    ],
)
def test_usd_rejects(value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_usd(value)  # type: ignore[arg-type]


def test_usd_rejects_floats() -> None:
    # Built without a float literal: the module keeps floats out on purpose.
    value = Decimal("12.5").__float__()
    with pytest.raises(ValueError, match="decimal string"):
        usd_to_micros(value)  # type: ignore[arg-type]


def test_negative_usd_when_allowed() -> None:
    assert usd_to_micros("-1.25", allow_negative=True) == -1_250_000
    assert micros_to_usd(-1_250_000) == "-1.25"


@pytest.mark.parametrize(
    ("micros", "text"),
    [(12_500_000, "12.50"), (1, "0.000001"), (0, "0.00"), (100_000_000, "100.00"), (1_234_567, "1.234567")],
)
def test_micros_to_usd(micros: int, text: str) -> None:
    assert micros_to_usd(micros) == text


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_usd_round_trip(micros: int) -> None:
    assert usd_to_micros(micros_to_usd(micros), allow_negative=True) == micros


def test_format_usd_and_decimal_input() -> None:
    assert format_usd(Decimal("3.1")) == "3.10"
    assert usd_to_micros(Decimal("0.000001")) == 1
    with pytest.raises(ValueError, match="more than 6"):
        usd_to_micros(Decimal("1E-7"))


def test_parse_decimal_for_throughput() -> None:
    assert parse_decimal("812.5", what="unitsPerSecond") == Decimal("812.5")
    with pytest.raises(ValueError, match="unitsPerSecond"):
        parse_decimal("fast", what="unitsPerSecond")
