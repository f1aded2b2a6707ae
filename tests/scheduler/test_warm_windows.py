"""Warm windows (``spec.scaledownWindow``, issue #21): the real scheduler and billing on the scripted fleet.

* a run of a Job with a window keeps its node for its project: a Job of another project waits, the next
  run of the same project goes there first (``spec.warmFrom``, ``placement.warmReuse``, StartAttempt
  ``warmReuse``), and that reuse ends the window;
* the window is paid by the Job that kept it, as Teardown, and never past its cap: billing ends it where
  the cap's funding ends, and the node is free for everyone from then;
* a node that stops heartbeating ends the window it kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nodus_billing.archiving import Archive
from nodus_billing.books import Books
from nodus_schema.attempts import Attempt
from nodus_schema.jobs import Job
from nodus_schema.quantities import usd_to_micros
from nodus_testing.waiting import eventually
from tests.scheduler.test_funding import TERMS

pytestmark = pytest.mark.timeout(120)


async def _one(rig: Any, name: str, namespace: str = "t") -> Attempt:
    found: list[Attempt] = await rig.attempts_of(name, namespace)
    assert len(found) == 1, f"{len(found)} attempts of {namespace}/{name}"
    return found[0]


async def _finished(rig: Any, name: str, namespace: str = "t") -> Attempt:
    a = await _one(rig, name, namespace)
    assert a.status.phase == "Succeeded", a.status.phase
    return a


async def _final(rig: Any, name: str, namespace: str = "a") -> Job:
    """The Job once its cost is final (every hold of it captured, its window included)."""

    async def final() -> Job:
        job: Job = await rig.job(name, namespace)
        assert job.status.cost is not None and job.status.cost.final
        return job

    return await eventually(
        final, deadline_s=30, message=f"the cost of {namespace}/{name} never became final"
    )


async def test_a_kept_node_goes_to_its_project_first_and_to_nobody_else(make_rig: Callable[..., Any]) -> None:
    async with make_rig(nodes=1, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        await rig.submit("keeper", "a", scaledownWindow="10m")
        kept = await eventually(lambda: _finished(rig, "keeper", "a"), deadline_s=30)
        assert kept.status.warm_since_ms is not None and kept.status.warm_until_ms is not None
        assert kept.status.warm_until_ms - kept.status.warm_since_ms == 600_000

        await rig.submit("stranger", "b")
        await rig.submit("friend", "a")
        friend = await eventually(lambda: _one(rig, "friend", "a"), deadline_s=30)
        assert friend.spec.node == kept.spec.node and friend.spec.warm_from == kept.metadata.name
        assert friend.status.placement is not None and friend.status.placement.warm_reuse
        start = next(s for s in rig.fleet.started if s.attempt == friend.metadata.name)
        assert start.warm_reuse
        # The stranger joined the line first and found the only node kept for project a.
        assert await rig.attempts_of("stranger", "b") == []
        job = await rig.job("stranger", "b")
        assert job.status.phase not in ("Running", "Succeeded")

        # The reuse ended the keeper's window (written down by the scheduler), and its hold is captured
        # with the window up to the reuse as Teardown.
        async def closed() -> Attempt:
            a = await _one(rig, "keeper", "a")
            assert a.status.warm_end_ms is not None
            return a

        await eventually(closed, deadline_s=30, message="the reuse never closed the keeper's window")

        await _final(rig, "keeper")
        # friend had no window of its own: the node is free for the stranger once friend is done.
        await eventually(lambda: _finished(rig, "stranger", "b"), deadline_s=30)


async def test_billing_ends_a_window_at_the_jobs_cap(make_rig: Callable[..., Any]) -> None:
    async with make_rig(nodes=1, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        # 0.002 USD at 0.79 USD/h funds about 9 s of node time: the run takes one, the 20m window the rest.
        await rig.submit("capped", "a", scaledownWindow="20m", maxCostUSD="0.002")
        await eventually(lambda: _finished(rig, "capped", "a"), deadline_s=30)

        async def ended() -> Attempt:
            a = await _one(rig, "capped", "a")
            assert a.status.warm_end_ms is not None, "window still open"
            return a

        a = await eventually(ended, deadline_s=40, message="billing never ended the window at the cap")
        assert a.status.warm_until_ms is not None and a.status.warm_end_ms is not None
        assert a.status.warm_end_ms < a.status.warm_until_ms

        job = await _final(rig, "capped")
        cost = job.status.cost
        assert cost is not None and cost.by_segment is not None
        assert usd_to_micros(cost.total_usd or "0") <= usd_to_micros("0.002")
        assert usd_to_micros(cost.by_segment.teardown_usd or "0") > 0
        state = await Books(rig.nc).read("a")
        runs = await Archive(rig.nc).runs("a", state)  # filed out of the book once final (issue #23)
        assert runs and all(h.status == "Captured" for h in runs.values())
        # From the window's end the node is anybody's.
        await rig.submit("next", "b")
        await eventually(lambda: _finished(rig, "next", "b"), deadline_s=30)


async def test_a_node_that_goes_silent_ends_its_window(make_rig: Callable[..., Any]) -> None:
    async with make_rig(nodes=1, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        await rig.submit("keeper", "a", scaledownWindow="20m")
        kept = await eventually(lambda: _finished(rig, "keeper", "a"), deadline_s=30)
        rig.fleet.go_silent(kept.spec.node)

        async def ended() -> Attempt:
            a = await _one(rig, "keeper", "a")
            assert a.status.warm_end_ms is not None, "window still open"
            return a

        await eventually(ended, deadline_s=40, message="a silent node's window never ended")

        await _final(rig, "keeper")
