"""NODUS_REPORT lines into throughput, exactly: Decimal all the way, canonical strings out."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from nodus_agent.throughput import ReportTail, format_rate, parse_line


@pytest.mark.parametrize(
    ("line", "rate"),
    [
        ('{"unitsPerSecond": 812.5}', Decimal("812.5")),
        ('{"unitsPerSecond": 0.1, "loss": 2.5}', Decimal("0.1")),
        ('{"unitsPerSecond": 1200}', Decimal("1200")),
        ('{"unitsPerSecond": "33.30"}', Decimal("33.30")),
        ('{"loss": 0.5}', None),
    ],
)
def test_parse_line_reads_decimals(line: str, rate: Decimal | None) -> None:
    assert parse_line(line) == rate


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"unitsPerSecond": NaN}', "NaN is not a number"),
        ('{"unitsPerSecond": Infinity}', "Infinity is not a number"),
        ('{"unitsPerSecond": -1}', "negative"),
        ('{"unitsPerSecond": true}', "not a finite number"),
        ('{"unitsPerSecond": "fast"}', "not a decimal number"),
        ('{"unitsPerSecond": 1e400}', "out of range"),
    ],
)
def test_parse_line_rejects_what_is_not_a_rate(line: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_line(line)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("812.50", "812.5"),
        ("8E+2", "800"),
        ("0.000", "0"),
        ("1e-7", "0.0000001"),
        ("812.1000000000000000000000000000001", "812.1000000000000000000000000000001"),
    ],
)
def test_format_rate_is_canonical_and_never_rounds(value: str, text: str) -> None:
    assert format_rate(Decimal(value)) == text


def test_tail_follows_appends_and_takes_a_last_unterminated_line(tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    tail = ReportTail(report, "a1")
    assert tail.poll() is None  # not written yet
    report.write_text('{"unitsPerSecond": 1}\n{"unitsPer')
    assert tail.poll() == Decimal("1")  # the half line waits for its end
    with report.open("a") as f:
        f.write('Second": 2}\ngarbage\n{"unitsPerSecond": 3.5}')
    assert tail.poll() == Decimal("2")
    assert tail.poll(final=True) == Decimal("3.5")
