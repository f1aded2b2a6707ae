"""The ``auto`` checkpoint cadence toward ``completeByTime`` (issue #21, ADR-0019 "Deadlines"): at most a
quarter of the time left, never below the floor (2m, or twice the last checkpoint's cost), the floor once
the deadline has passed; an explicit interval is used as given. Pure, with an explicit ``now``."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodus_agent import preparing
from nodus_agent.checkpointing import (
    AUTO_FIRST,
    DEADLINE_FLOOR,
    checkpoint_interval,
    next_due,
    toward_deadline,
)
from nodus_agent.settings import AgentSettings
from nodus_schema.jobs import CheckpointPolicy
from nodus_schema.messages import StartAttempt

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
M = timedelta(minutes=1)


def auto(deadline: datetime | None, *, cost: timedelta | None = None, now: datetime = NOW) -> timedelta:
    return checkpoint_interval("auto", last_cost=cost, deadline=deadline, now=now)


def test_without_a_deadline_auto_is_unchanged() -> None:
    assert auto(None) == AUTO_FIRST == timedelta(minutes=30)
    assert auto(None, cost=timedelta(seconds=30)) == checkpoint_interval(
        "auto", last_cost=timedelta(seconds=30)
    )


def test_a_far_deadline_changes_nothing() -> None:
    assert auto(NOW + timedelta(hours=10)) == 30 * M  # a quarter of 10h is 2h30m: auto's 30m is shorter
    assert auto(NOW + timedelta(hours=2)) == 30 * M  # exactly a quarter


def test_at_most_a_quarter_of_the_time_left() -> None:
    assert auto(NOW + timedelta(hours=1)) == 15 * M
    assert auto(NOW + 20 * M) == 5 * M
    # Young's 38m for a 30 s checkpoint on on-demand capacity, cut to a quarter of 1h.
    assert auto(NOW + timedelta(hours=1), cost=timedelta(seconds=30)) == 15 * M


def test_never_below_the_floor_nor_twice_the_cost() -> None:
    assert DEADLINE_FLOOR == 2 * M
    assert auto(NOW + 4 * M) == 2 * M  # a quarter would be 1m
    assert auto(NOW + 4 * M, cost=90 * timedelta(seconds=1)) == 3 * M  # twice a 90 s checkpoint
    assert auto(NOW + 20 * M, cost=4 * M) == 8 * M  # a quarter (5m) is below twice the cost


def test_past_the_deadline_the_floor() -> None:
    assert auto(NOW) == 2 * M
    assert auto(NOW - timedelta(days=20000)) == 2 * M  # completeByTime: 1970-01-01T00:00:00Z
    assert auto(NOW - M, cost=5 * M) == 10 * M


def test_an_explicit_interval_is_used_as_given() -> None:
    assert checkpoint_interval("15m", deadline=NOW + 4 * M, now=NOW) == 15 * M
    assert checkpoint_interval("1h", deadline=NOW - M, now=NOW) == timedelta(hours=1)


def test_next_due_counts_from_the_last_checkpoint() -> None:
    last = NOW + timedelta(hours=1)
    assert next_due(last, "auto", deadline=last + timedelta(hours=1)) == last + 15 * M
    assert next_due(last, "auto") == last + 30 * M


def test_recomputed_after_every_checkpoint_it_shrinks_toward_the_floor() -> None:
    """running.py recomputes the interval after each checkpoint: the steps shrink as the deadline nears."""
    deadline, now, cost = NOW + timedelta(hours=3), NOW, timedelta(seconds=20)
    steps: list[timedelta] = []
    while now < deadline + 10 * M:
        step = auto(deadline, cost=cost, now=now)
        steps.append(step)
        now += step + cost
    assert steps[0] == checkpoint_interval("auto", last_cost=cost)  # Young's 31m: below a quarter of 3h
    assert all(b <= a for a, b in itertools.pairwise(steps))  # never longer as the deadline nears
    assert steps[-1] == DEADLINE_FLOOR


@given(
    st.integers(min_value=-(10**7), max_value=10**7),  # seconds to the deadline
    st.one_of(st.none(), st.integers(min_value=0, max_value=4 * 3600)),  # last cost, seconds
    st.booleans(),
)
def test_the_deadline_only_shortens_and_respects_the_floor(
    left_s: int, cost_s: int | None, spot: bool
) -> None:
    cost = None if cost_s is None else timedelta(seconds=cost_s)
    plain = checkpoint_interval("auto", last_cost=cost, interruptible=spot)
    got = checkpoint_interval(
        "auto", last_cost=cost, interruptible=spot, deadline=NOW + timedelta(seconds=left_s), now=NOW
    )
    floor = max(DEADLINE_FLOOR, 2 * cost) if cost is not None else DEADLINE_FLOOR
    assert got <= plain
    assert got >= min(plain, floor)
    if left_s > 0:
        assert got <= max(timedelta(seconds=left_s) / 4, floor)
    else:
        assert got == min(plain, floor)
    assert toward_deadline(plain, deadline=NOW + timedelta(seconds=left_s), now=NOW, last_cost=cost) == got


# -- the agent's seam: the StartAttempt's complete_by_time ------------------------------------------------


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> AgentSettings:
    work = tmp_path_factory.mktemp("work")
    return AgentSettings.from_env({"NODUS_AGENT_NODE": "n1", "NODUS_AGENT_WORKDIR": str(work)})


def start(
    complete_by_time: str | None, interval: str | None = None, continuity: str = "Checkpointed"
) -> StartAttempt:
    return StartAttempt(
        namespace="p",
        job="train",
        attempt="train-1234abcd-0-a1",
        index=0,
        attempt_no=1,
        node="n1",
        continuity=continuity,
        checkpoint=CheckpointPolicy(interval=interval) if interval else None,
        complete_by_time=complete_by_time,
    )


def test_the_start_messages_deadline_shortens_auto(settings: AgentSettings) -> None:
    msg = start("2026-11-30T06:00:00Z")
    assert preparing.checkpoint_interval(msg, settings, None, NOW) == 15 * M
    assert preparing.checkpoint_interval(msg, settings, None, NOW + 50 * M) == timedelta(seconds=150)  # 10m/4
    assert preparing.checkpoint_interval(msg, settings, None, NOW + 54 * M) == 2 * M  # 6m left: the floor
    assert preparing.checkpoint_interval(msg, settings, None, NOW + timedelta(hours=2)) == 2 * M  # past it
    assert preparing.checkpoint_interval(start(None), settings, None, NOW) == 30 * M


def test_the_start_messages_deadline_leaves_an_explicit_interval_and_other_continuities(
    settings: AgentSettings,
) -> None:
    assert preparing.checkpoint_interval(start("2026-11-30T05:04:00Z", "45m"), settings, None, NOW) == 45 * M
    # A bad explicit interval falls back to auto, which the deadline then shortens.
    assert preparing.checkpoint_interval(start("2026-11-30T06:00:00Z", "9h"), settings, None, NOW) == 15 * M
    assert (
        preparing.checkpoint_interval(
            start("2026-11-30T06:00:00Z", continuity="Restartable"), settings, None, NOW
        )
        is None
    )


def test_a_deadline_the_agent_cannot_read_is_ignored(settings: AgentSettings) -> None:
    assert preparing.checkpoint_interval(start("tomorrow"), settings, None, NOW) == 30 * M
