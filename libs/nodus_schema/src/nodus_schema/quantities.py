"""Pure parsers and formatters for the string-typed amounts of the API.

The wire carries every amount as a string so that nothing is ever a float:

* Kubernetes quantities (``"4"``, ``"500m"``, ``"64Gi"``, ``"2T"``, ``"1e3"``) for cpu, memory, disk and
  checkpoint sizes;
* Go durations (``"1h30m"``, ``"15m"``, ``"0s"``, ``"1.5h"``, ``"300ms"``) for timeouts and windows;
* USD decimal strings (``"12.50"``, ``"0.000001"``) for money, held inside as :class:`~decimal.Decimal` or
  integer micro-dollars.

Every parser raises :class:`ValueError` with a sentence a person can act on; the validation rules put that
sentence into a field error with the field's path. Arithmetic is exact (``Decimal`` with a wide context and
``Inexact`` trapped, or ``int``); there is no float anywhere, by design (the design brief: money is exact).
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from decimal import Context, Decimal, Inexact, InvalidOperation, localcontext

__all__ = [
    "MAX_DURATION",
    "MAX_INT32",
    "MAX_USD",
    "MAX_USD_MICROS",
    "MICROS_PER_USD",
    "duration_micros",
    "format_bytes",
    "format_cpu",
    "format_duration",
    "format_usd",
    "micros_to_usd",
    "parse_bytes",
    "parse_cpu_millis",
    "parse_decimal",
    "parse_duration",
    "parse_quantity",
    "parse_usd",
    "usd_to_micros",
]

# The documented ranges of what admission lets through (docs/errors/Invalid.md): every service downstream
# may rely on them (billing's books, the scheduler's timers), so no admitted value can overflow a book or
# a timer. Money: at most MAX_USD with at most 6 decimals, so every amount fits an int64 of micro-dollars
# with room for sums. Counts and seconds: Kubernetes' int32. Durations: at most MAX_DURATION.
MAX_INT32 = 2**31 - 1
MAX_USD = Decimal("1000000000")  # one billion dollars
MAX_USD_MICROS = 1_000_000_000 * 1_000_000
MAX_DURATION = timedelta(seconds=MAX_INT32)  # about 68 years

# Longer inputs are refused outright: a quantity or an amount never needs more, and this bounds the work.
_MAX_LEN = 64

# A wide exact context: quantities up to exabytes with fractional digits fit, and any rounding is an error.
_EXACT = Context(prec=120, traps=[Inexact, InvalidOperation])

# ---------------------------------------------------------------------------------------------------------
# Kubernetes quantities
# ---------------------------------------------------------------------------------------------------------

_BINARY_SUFFIXES: dict[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}

# The Kubernetes grammar: a non-negative decimal number, then a binary suffix, a decimal SI suffix, or a
# decimal exponent (``1e3``). A leading sign is refused: no quantity in this API may be negative.
_QUANTITY_RE = re.compile(
    r"(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>[A-Za-z]*))",
)


def _check_str(value: object, what: str, example: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string such as {example!r}, not {type(value).__name__}")
    if len(value) > _MAX_LEN:
        raise ValueError(f"{what} is too long ({len(value)} characters; at most {_MAX_LEN})")
    return value


@functools.lru_cache(maxsize=1024)
def parse_quantity(value: str) -> Decimal:
    """Parse a Kubernetes quantity into its exact value (``"64Gi"`` → 68719476736, ``"500m"`` → 0.5).

    Suffixes: ``Ki Mi Gi Ti Pi Ei`` (powers of 1024), ``n u m k M G T P E`` (powers of 1000), or a decimal
    exponent (``"1e3"``). Negative quantities are refused.
    """
    text = _check_str(value, "a quantity", "64Gi")
    m = _QUANTITY_RE.fullmatch(text)
    if m is None:
        if text.startswith(("-", "+")):
            raise ValueError(f"quantity {text!r} must not have a sign; quantities are never negative")
        raise ValueError(
            f"quantity {text!r} is not a Kubernetes quantity: write a number with an optional suffix, "
            'such as "4", "500m", "64Gi" or "2T"'
        )
    with localcontext(_EXACT):
        number = Decimal(m["num"])
        if m["exp"] is not None:
            exponent = int(m["exp"][1:])
            if abs(exponent) > 30:
                raise ValueError(f"quantity {text!r} has an exponent out of range")
            return number.scaleb(exponent)
        suffix = m["suffix"] or ""
        if suffix in _BINARY_SUFFIXES:
            return number * _BINARY_SUFFIXES[suffix]
        if suffix in _DECIMAL_SUFFIXES:
            return number.scaleb(_DECIMAL_SUFFIXES[suffix])
    known = ", ".join([*_BINARY_SUFFIXES, *(s for s in _DECIMAL_SUFFIXES if s)])
    hint = ' (did you mean "Gi" or "G"?)' if suffix.lower() in {"gb", "gib", "g"} else ""
    raise ValueError(f"quantity {text!r} has an unknown suffix {suffix!r}{hint}; known suffixes: {known}")


def parse_bytes(value: str) -> int:
    """Parse a quantity of bytes (memory, disk, checkpoint size) into an exact whole number of bytes."""
    amount = parse_quantity(value)
    if amount != amount.to_integral_value():
        raise ValueError(f"quantity {value!r} is not a whole number of bytes")
    return int(amount)


def parse_cpu_millis(value: str) -> int:
    """Parse a CPU quantity into whole millicores (``"4"`` → 4000, ``"500m"`` → 500, ``"0.25"`` → 250)."""
    with localcontext(_EXACT):
        millis = parse_quantity(value) * 1000
    if millis != millis.to_integral_value():
        raise ValueError(f"CPU quantity {value!r} is finer than a millicore (1m)")
    return int(millis)


def format_bytes(n: int) -> str:
    """Format bytes canonically: the largest binary suffix that divides exactly (``2**36`` → ``"64Gi"``)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"bytes must be a non-negative int, not {n!r}")
    for suffix, factor in reversed(_BINARY_SUFFIXES.items()):
        if n and n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)


def format_cpu(millis: int) -> str:
    """Format millicores canonically: whole cores without suffix (``"4"``), else millicores (``"500m"``)."""
    if isinstance(millis, bool) or not isinstance(millis, int) or millis < 0:
        raise ValueError(f"millicores must be a non-negative int, not {millis!r}")
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


# ---------------------------------------------------------------------------------------------------------
# Go durations
# ---------------------------------------------------------------------------------------------------------

# Nanoseconds per unit, as Go's time.ParseDuration spells them (both micro signs and "us" are accepted).
_UNIT_NANOS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # µ MICRO SIGN, which Go prints
    "\u03bcs": 1_000,  # μ GREEK SMALL LETTER MU
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([a-zA-Z\u00b5\u03bc]+)")


@functools.lru_cache(maxsize=1024)
def parse_duration(value: str, *, allow_negative: bool = False) -> timedelta:
    """Parse a Go duration string (``"1h30m"``, ``"1.5h"``, ``"300ms"``, ``"0s"``, ``"0"``).

    The grammar is Go's ``time.ParseDuration``: an optional sign, then one or more ``<number><unit>`` with
    units ``ns us µs ms s m h``; ``"0"`` alone is zero. A :class:`~datetime.timedelta` holds microseconds,
    so a duration finer than that is refused rather than rounded. Negative durations are refused unless
    ``allow_negative``.
    """
    text = _check_str(value, "a duration", "15m")
    body = text
    sign = 1
    if body[:1] in {"+", "-"}:
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body == "0":
        return timedelta(0)
    if not body:
        raise ValueError(f'invalid duration {text!r}: write a Go duration such as "15m", "1h30m" or "300ms"')
    nanos = Decimal(0)
    pos = 0
    with localcontext(_EXACT):
        while pos < len(body):
            m = _DURATION_PART.match(body, pos)
            if m is None:
                if body[pos:].isdigit():
                    raise ValueError(
                        f"invalid duration {text!r}: missing unit after {body[pos:]!r}; "
                        f'use one of h, m, s, ms (e.g. "{body[pos:]}s")'
                    )
                raise ValueError(
                    f'invalid duration {text!r}: write a Go duration such as "15m", "1h30m" or "300ms"'
                )
            number, unit = m.groups()
            if unit not in _UNIT_NANOS:
                raise ValueError(
                    f"invalid duration {text!r}: unknown unit {unit!r}; units are h, m, s, ms, us, ns"
                )
            nanos += Decimal(number) * _UNIT_NANOS[unit]
            pos = m.end()
    if sign < 0 and nanos and not allow_negative:
        raise ValueError(f"duration {text!r} must not be negative")
    micros = nanos / 1000
    if micros != micros.to_integral_value():
        raise ValueError(f"duration {text!r} is finer than a microsecond")
    return timedelta(microseconds=sign * int(micros))


def duration_micros(td: timedelta) -> int:
    """The exact number of microseconds in ``td`` (no float on the way, unlike ``total_seconds()``)."""
    return (td.days * 86_400 + td.seconds) * 1_000_000 + td.microseconds


def _frac(whole: int, part: int, digits: int) -> str:
    """``whole`` plus ``part / 10**digits``, trailing zeros of the fraction removed."""
    if part == 0:
        return str(whole)
    return f"{whole}.{part:0{digits}d}".rstrip("0")


@functools.lru_cache(maxsize=4096)
def format_duration(td: timedelta) -> str:
    """Format as Go's ``Duration.String()``: ``"1h30m0s"``, ``"15m0s"``, ``"1.5s"``, ``"300ms"``, ``"0s"``.

    The Go form (not the shortest one) was chosen so that strings match what Go clients and kubectl print;
    :func:`parse_duration` reads both. Sub-second durations use ``ms`` or ``µs`` (U+00B5), as Go does.
    Remembered (a pure function of a hashable value): every estimate formats each candidate offering's
    startup bands, the same few durations (4.6% of the scheduler's CPU in the create bench's profile).
    """
    micros = duration_micros(td)
    if micros == 0:
        return "0s"
    sign = "-" if micros < 0 else ""
    u = abs(micros)
    if u < 1_000:
        return f"{sign}{u}\u00b5s"
    if u < 1_000_000:
        return f"{sign}{_frac(u // 1_000, u % 1_000, 3)}ms"
    hours, rest = divmod(u, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds = _frac(rest // 1_000_000, rest % 1_000_000, 6)
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{sign}{minutes}m{seconds}s"
    return f"{sign}{seconds}s"


# ---------------------------------------------------------------------------------------------------------
# Decimal strings and USD
# ---------------------------------------------------------------------------------------------------------

MICROS_PER_USD = 1_000_000
_USD_PLACES = 6  # a micro-dollar is the smallest amount the ledger knows
_DECIMAL_RE = re.compile(r"(-)?([0-9]+)(?:\.([0-9]+))?")


def parse_decimal(
    value: str | Decimal, *, what: str = "value", allow_negative: bool = False, max_places: int | None = None
) -> Decimal:
    """Parse a plain decimal string (``"812.5"``): digits, an optional fraction, no exponent, no float.

    Used for every decimal string on the wire (``unitsPerSecond``; USD through :func:`parse_usd`). A
    :class:`~decimal.Decimal` is accepted too and held to the same rules.
    """
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{what} must be a finite decimal, not {value}")
        text = format(value, "f")
    elif isinstance(value, str):
        text = value
    else:
        # bool, int and float all land here: an amount on the wire is a string, so a JSON number is a mistake.
        raise ValueError(
            f'{what} must be a decimal string such as "12.50" (quoted), '
            f"not {value!r} ({type(value).__name__})"
        )
    if len(text) > _MAX_LEN:
        raise ValueError(f"{what} is too long ({len(text)} characters; at most {_MAX_LEN})")
    m = _DECIMAL_RE.fullmatch(text)
    if m is None:
        if re.fullmatch(r"-?[0-9.]+[eE][+-]?[0-9]+", text):
            raise ValueError(f'{what} {text!r} uses an exponent; write the digits out, such as "0.000001"')
        raise ValueError(f'{what} {text!r} is not a decimal string such as "12.50"')
    negative, _, frac = m.groups()
    if negative and not allow_negative:
        raise ValueError(f"{what} {text!r} must not be negative")
    if max_places is not None and frac is not None and len(frac) > max_places:
        raise ValueError(f"{what} {text!r} has more than {max_places} decimal places")
    return Decimal(text)


def parse_usd(value: str | Decimal, *, allow_negative: bool = False) -> Decimal:
    """Parse a USD amount (``"12.50"``, ``"0.000001"``): at most 6 decimals, no exponent, no float."""
    return parse_decimal(value, what="USD amount", allow_negative=allow_negative, max_places=_USD_PLACES)


def usd_to_micros(value: str | Decimal, *, allow_negative: bool = False) -> int:
    """A USD amount as exact integer micro-dollars (``"12.50"`` → 12_500_000)."""
    amount = parse_usd(value, allow_negative=allow_negative)
    with localcontext(_EXACT):
        return int(amount * MICROS_PER_USD)


def micros_to_usd(micros: int) -> str:
    """Integer micro-dollars as the canonical USD string: at least 2 decimals, at most 6 (``"12.50"``)."""
    if isinstance(micros, bool) or not isinstance(micros, int):
        raise ValueError(f"micro-dollars must be an int, not {type(micros).__name__}")
    return _usd_text(int(micros))


@functools.lru_cache(maxsize=4096)
def _usd_text(micros: int) -> str:
    """:func:`micros_to_usd` past its type check, remembered: estimates and costs write the same few
    amounts (a rate, $0, a cap) many times (4.6% of billing's CPU in the create bench's profile). The check
    stays outside: ``True`` hashes as ``1``."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS_PER_USD)
    digits = f"{frac:06d}".rstrip("0")
    return f"{sign}{whole}.{digits.ljust(2, '0')}"


def format_usd(amount: Decimal) -> str:
    """A :class:`~decimal.Decimal` amount as the canonical USD string (refuses sub-micro-dollar amounts)."""
    return micros_to_usd(usd_to_micros(amount, allow_negative=True))
