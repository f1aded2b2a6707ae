"""The one backoff helper: capped exponential ceilings, full and decorrelated jitter within their bounds and
spread out (seeded draws), and the work queue's use of it."""

from __future__ import annotations

import random
import statistics
from itertools import islice

import pytest

from nodus_kit.backingoff import Backoff
from nodus_kit.queueing import WorkQueue

DRAWS = 2000


def test_the_ceiling_doubles_from_base_and_stops_at_the_cap() -> None:
    b = Backoff(base=0.5, cap=30.0)
    assert [b.ceiling(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert b.ceiling(0) == b.ceiling(1) == 0.5  # "no failure yet" waits as the first does
    assert b.ceiling(10_000) == 30.0  # no float overflow however long the retries go on


@pytest.mark.parametrize(("base", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_backoff_needs_a_positive_base_under_its_cap(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="0 < base <= cap"):
        Backoff(base=base, cap=cap)


@pytest.mark.parametrize("attempt", [1, 3, 7, 50])
def test_full_jitter_stays_within_zero_and_the_ceiling(attempt: int) -> None:
    b, rng = Backoff(base=0.5, cap=30.0), random.Random(attempt)
    delays = [b.delay(attempt, rng) for _ in range(DRAWS)]
    assert all(0.0 <= d <= b.ceiling(attempt) for d in delays)


def test_full_jitter_spreads_over_the_whole_range() -> None:
    """Uniform on [0, ceiling]: mean about half, and both ends reached, so retries do not bunch up."""
    b, rng = Backoff(base=1.0, cap=8.0), random.Random(19)
    delays = [b.delay(4, rng) for _ in range(DRAWS)]  # ceiling 8
    assert statistics.fmean(delays) == pytest.approx(4.0, abs=0.3)
    assert min(delays) < 0.1 and max(delays) > 7.9
    assert len({round(d, 2) for d in delays}) > 500  # not a handful of values


def test_a_seeded_random_gives_the_same_delays() -> None:
    b = Backoff(base=0.5, cap=30.0)
    first = [b.delay(n, random.Random(7)) for n in range(1, 10)]
    assert first == [b.delay(n, random.Random(7)) for n in range(1, 10)]


def test_decorrelated_pauses_stay_within_base_and_cap() -> None:
    b = Backoff(base=0.1, cap=2.0)
    pauses = list(islice(b.pauses(random.Random(3)), DRAWS))
    assert all(0.1 <= p <= 2.0 for p in pauses)


def test_decorrelated_pauses_grow_then_spread_below_the_cap() -> None:
    """Each pause is drawn from [base, 3 x the last]: the early ones grow, the later ones stay spread
    between base and the cap instead of all sitting on it."""
    b, rng = Backoff(base=0.1, cap=2.0), random.Random(11)
    runs = [list(islice(b.pauses(rng), 12)) for _ in range(300)]
    first, tenth = [r[0] for r in runs], [r[9] for r in runs]
    assert statistics.fmean(first) < statistics.fmean(tenth)
    assert max(first) <= 0.3  # the first is at most 3 x base
    assert min(tenth) < 1.0 < statistics.fmean(tenth) < 2.0


async def test_the_work_queue_backs_off_with_jitter_and_takes_a_chosen_delay() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.04)
    waits = [q.add_rate_limited("a") for _ in range(6)]
    assert all(0.0 <= w <= c for w, c in zip(waits, [0.01, 0.02, 0.04, 0.04, 0.04, 0.04], strict=True))
    assert q.add_rate_limited("b", 0.5) == 0.5  # a TemporaryError's own delay: a failure all the same
    assert q.failures("a") == 6 and q.failures("b") == 1
    await q.shut_down()
