"""``NODUS_REPORT``: the JSON lines a program appends (``{"unitsPerSecond": 812.5}``) turned into throughput.

Numbers are parsed as :class:`~decimal.Decimal`, never float: ``812.1`` stays ``812.1`` on its way to the
Sweep's best cell. A line may carry other keys (loss, step, ...); only ``unitsPerSecond`` is read today.
A line that is not such JSON is skipped with one warning per attempt, since a program's bug there must
not flood the agent's log.
"""

from __future__ import annotations

import json
import logging
from decimal import Context, Decimal, InvalidOperation
from pathlib import Path

log = logging.getLogger(__name__)

KEY = "unitsPerSecond"
MAX_EXPONENT = 30  # beyond 1e30 units/s a value is a bug, and "f" formatting would print its digits
MAX_LINE = 64 * 1024  # a "line" longer than this without a newline is garbage, not a report
READ_CHUNK = 1024 * 1024


def parse_line(line: str) -> Decimal | None:
    """The line's ``unitsPerSecond``, None if it has none; ValueError if the line is not a report."""

    def no_constants(name: str) -> None:
        raise ValueError(f"{name} is not a number")

    try:
        obj = json.loads(line, parse_float=Decimal, parse_int=Decimal, parse_constant=no_constants)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    if KEY not in obj:
        return None
    return _rate(obj[KEY])


def _rate(value: object) -> Decimal:
    if isinstance(value, str):  # a decimal string is as exact as a JSON number
        try:
            value = Decimal(value)
        except InvalidOperation:
            raise ValueError(f"{KEY} {value!r} is not a decimal number") from None
    if not isinstance(value, Decimal) or not value.is_finite():
        raise ValueError(f"{KEY} {value!r} is not a finite number")
    if value < 0:
        raise ValueError(f"{KEY} {value} is negative")
    if value and abs(value.adjusted()) > MAX_EXPONENT:
        raise ValueError(f"{KEY} {value} is out of range")
    return value


def format_rate(value: Decimal) -> str:
    """A canonical decimal string without exponent or trailing zeros.

    ``812.50`` -> ``812.5``, ``8E+2`` -> ``800``: what the Sweep shows, so equal rates read equal.
    """
    if not value:
        return "0"
    # A context as precise as the value itself, so normalising never rounds a digit away.
    exact = Context(prec=max(len(value.as_tuple().digits), 1))
    return format(value.normalize(exact), "f")


class ReportTail:
    """Follows one ``report.jsonl`` from where it last stopped, keeping the latest throughput."""

    def __init__(self, path: Path, attempt: str) -> None:
        self.path, self.attempt = path, attempt
        self.offset = 0
        self.partial = b""
        self.latest: Decimal | None = None
        self._warned = False

    def poll(self, *, final: bool = False) -> Decimal | None:
        """Read what was appended; ``final`` also takes a last line that lacks its newline."""
        while True:
            chunk = self._read()
            self._consume(chunk)
            if not final or len(chunk) < READ_CHUNK:
                break
        if final and self.partial:
            self._take(self.partial)
            self.partial = b""
        return self.latest

    def _read(self) -> bytes:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read(READ_CHUNK)
        except FileNotFoundError:  # the program may delete or not yet have written it
            return b""
        self.offset += len(chunk)
        return chunk

    def _consume(self, chunk: bytes) -> None:
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for line in lines:
            self._take(line)
        if len(self.partial) > MAX_LINE:
            self._bad(f"a line longer than {MAX_LINE} bytes")
            self.partial = b""

    def _take(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            return
        try:
            rate = parse_line(text)
        except ValueError as e:
            self._bad(str(e))
            return
        if rate is not None:
            self.latest = rate

    def _bad(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "ignoring lines of NODUS_REPORT that are not reports (%s); further ones are ignored silently",
                why,
                extra={"attempt": self.attempt, "file": str(self.path)},
            )
