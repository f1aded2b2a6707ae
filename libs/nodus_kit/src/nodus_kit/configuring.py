"""Typed settings from the environment: a service declares every variable it reads as a field of one
frozen msgspec Struct, and reads them all once, in ``start()`` (issue #19).

Each field names its variable with :class:`Env` in its annotation, beside any msgspec ``Meta``
constraint::

    class SweepsSettings(msgspec.Struct, frozen=True, kw_only=True):
        resync_s: Annotated[float, Meta(gt=0), Env("NODUS_RESYNC_S", "seconds")] = 30.0

    settings = read_settings(SweepsSettings, self.settings.env)

An unset or empty variable leaves the field at its default (a field without one must be set). A set one
is converted to the field's type: ``str``, ``int``, ``float`` (finite only: ``nan`` and ``inf`` are never
a setting), ``bool`` (on/off, true/false, yes/no, 1/0) or one of those ``| None``; or by the field's own
``Env.parse`` where the text means more than its type (a USD amount into micro-dollars). msgspec then
holds the value to the field's ``Meta`` (``gt``, ``ge``, ``lt``, ``le``, ``min_length``, ``pattern``...).

Every bad variable of the Struct goes into one :class:`SettingError`, each named with its value and what
it accepts (``NODUS_RESYNC_S='ten': give a number of seconds more than 0 (e.g. 30)``), so an operator
fixes them all in one go, before the service connects to anything.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec
import msgspec.inspect as mi

__all__ = ["Env", "SettingError", "read_settings"]

S = TypeVar("S", bound=msgspec.Struct)

TRUE: Final = frozenset({"1", "true", "yes", "on"})
FALSE: Final = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, slots=True)
class Env:
    """The variable a settings field is read from (in its ``Annotated[...]``)."""

    name: str
    unit: str = ""
    """What a number counts (``"seconds"``): the error then asks for "a number of seconds"."""
    parse: Callable[[str], Any] | None = None
    """Turns the text into the field's value where its type alone cannot; its ValueError says what it
    accepts. Its result is still held to the field's type and ``Meta``."""


class SettingError(ValueError):
    """Variables a service cannot run with: one line per variable, naming it, its value and what it
    accepts."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    env: Env
    hint: Any
    """The field's annotation, ``Meta`` included: what msgspec checks a value against."""
    type: mi.Type
    default: Any
    required: bool


def read_settings(cls: type[S], env: Mapping[str, str]) -> S:
    """The settings ``cls`` from the variables in ``env``; SettingError names every bad or missing one."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for field in _fields(cls):
        raw = env.get(field.env.name, "").strip()
        if not raw:
            if field.required:
                problems.append(f"{field.env.name} is not set: give {_accepts(field)}")
            continue
        try:
            values[field.name] = _value(field, raw)
        except ValueError as e:
            problems.append(f"{field.env.name}={raw!r}: {e}")
    if problems:
        raise SettingError(problems)
    return cls(**values)


def _fields(cls: type[msgspec.Struct]) -> Iterator[_Field]:
    info = mi.type_info(cls)
    if not isinstance(info, mi.StructType):
        raise TypeError(f"{cls!r} is not a msgspec Struct")
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in info.fields:
        hint = hints[f.name]
        env = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Env)), None)
        if env is None:
            # A field no variable sets would be a constant dressed as a setting: say so at once.
            raise TypeError(f"{cls.__name__}.{f.name} names no variable: annotate it with Env(...)")
        yield _Field(f.name, env, hint, _bare(f.type), f.default, f.required)


def _bare(t: mi.Type) -> mi.Type:
    """The type without its description, and without ``| None`` (an empty variable is the default)."""
    if isinstance(t, mi.Metadata):
        return _bare(t.type)
    if isinstance(t, mi.UnionType):
        inner = [m for m in t.types if not isinstance(m, mi.NoneType)]
        if len(inner) == 1:
            return _bare(inner[0])
    return t


def _value(field: _Field, raw: str) -> Any:
    """The text as the field's value, held to its constraints; ValueError says what is accepted."""
    if field.env.parse is not None:
        value = field.env.parse(raw)  # its own ValueError already says what it accepts
    else:
        try:
            value = _parse(raw, field.type)
        except ValueError:
            raise ValueError(f"give {_accepts(field)}") from None
    try:
        return msgspec.convert(value, field.hint)
    except msgspec.ValidationError:
        raise ValueError(f"give {_accepts(field)}") from None


def _parse(raw: str, t: mi.Type) -> Any:
    if isinstance(t, mi.StrType):
        return raw
    if isinstance(t, mi.IntType):
        return int(raw)
    if isinstance(t, mi.FloatType):
        number = float(raw)
        if not math.isfinite(number):
            raise ValueError(raw)
        return number
    if isinstance(t, mi.BoolType):
        return _bool(raw)
    raise TypeError(f"a setting of type {t!r} cannot be read from a variable: use str, int, float or bool")


def _bool(raw: str) -> bool:
    text = raw.lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise ValueError(raw)


def _accepts(field: _Field) -> str:
    """What the field takes, in words, with its default as the example: ``a number of seconds more
    than 0 (e.g. 600)``."""
    t, unit = field.type, f" of {field.env.unit}" if field.env.unit else ""
    if isinstance(t, mi.BoolType):
        words = "on or off, true or false, yes or no, 1 or 0"
    elif isinstance(t, mi.IntType):
        words = " ".join(["a whole number" + unit, *_bounds(t)])
    elif isinstance(t, mi.FloatType):
        words = " ".join(["a number" + unit, *_bounds(t)])
    else:
        words = " ".join(["text", *_lengths(t)]) if isinstance(t, mi.StrType) else "a value"
    example = _show(field.default)
    return f"{words} (e.g. {example})" if example else words


def _bounds(t: mi.IntType | mi.FloatType) -> Iterator[str]:
    limits = (("more than", t.gt), ("at least", t.ge), ("less than", t.lt), ("at most", t.le))
    shown = [f"{words} {_show(limit)}" for words, limit in limits if limit is not None]
    if shown:
        yield " and ".join(shown)


def _lengths(t: mi.StrType) -> Iterator[str]:
    if t.min_length is not None:
        yield f"of at least {t.min_length} characters"
    if t.max_length is not None:
        yield f"of at most {t.max_length} characters"
    if t.pattern is not None:
        yield f"matching {t.pattern}"


def _show(value: Any) -> str:
    """A value as an operator would write it; empty for none worth showing."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if value is None or value is msgspec.NODEFAULT or value == "":
        return ""
    return str(value)
