"""metav1.Time as nodus_schema.meta writes and reads it: format_time (cached by the second) against
strftime of the same instant, over every aware datetime Python holds (a year below 1000 with four
digits, which strftime does not write); parse_time reads each back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodus_schema.meta import format_time, now_rfc3339, parse_time

ZONES = st.builds(lambda m: timezone(timedelta(minutes=m)), st.integers(-1439, 1439))


def _strftime(dt: datetime) -> str:
    """What format_time wrote before its cache: strftime, which pads no year below 1000."""
    text = dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return text.zfill(20)  # "999-01-01T00:00:00Z" -> "0999-01-01T00:00:00Z"


@given(st.datetimes(timezones=st.just(UTC)))
def test_format_time_is_strftime_of_the_utc_second(dt: datetime) -> None:
    assert format_time(dt) == _strftime(dt)


@given(
    st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30, 23, 59, 59, 999_999), timezones=ZONES
    )
)
def test_format_time_of_any_zone_is_its_utc_instant(dt: datetime) -> None:
    text = format_time(dt)
    assert text == _strftime(dt)
    assert parse_time(text) == dt.replace(microsecond=0).astimezone(UTC)


@pytest.mark.parametrize(
    "dt",
    [
        datetime.min.replace(tzinfo=UTC),
        datetime.max.replace(tzinfo=UTC),  # a float timestamp of it rounds up into year 10000
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),  # the second before the epoch
        datetime(2026, 12, 6, 4, 59, 59, 999_999, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
def test_format_time_at_the_edges(dt: datetime) -> None:
    assert format_time(dt) == _strftime(dt)


def test_format_time_refuses_a_naive_datetime() -> None:
    with pytest.raises(ValueError, match="aware"):
        format_time(datetime(2026, 12, 6))


def test_now_is_this_second() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    stamp = parse_time(now_rfc3339())
    assert before <= stamp <= datetime.now(UTC)
