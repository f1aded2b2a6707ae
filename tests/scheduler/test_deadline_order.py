"""The binder's line with ``spec.completeByTime`` (issue #21), against the real scheduler service and a
scripted fleet of one node: inside a project the earliest deadline runs first when capacity frees up; a
Job of another project never jumps an earlier Job with an earlier deadline, not even 1970."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.messages import StartAttempt
from nodus_schema.meta import ObjectMeta, format_time
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow


def hold_the_blocker(s: StartAttempt) -> tuple[float | None, int]:
    return (None, 0) if s.job == "blocker" else (0.0, 0)  # the blocker runs until it is cancelled


async def create(rig: Any, name: str, namespace: str, created: datetime, deadline: str | None = None) -> Job:
    """A Job whose place in line is ``created`` (the store keeps a creationTimestamp it is given), so the
    order of places does not hang on which second the test's creates land in."""
    body = {"image": "busybox", "command": ["true"], "resources": {"gpu": "L4:1"}, "completeByTime": deadline}
    meta = ObjectMeta(name=name, namespace=namespace, creation_timestamp=format_time(created))
    job: Job = await rig.jobs.create(default_job(Job(metadata=meta, spec=msgspec.convert(body, JobSpec))))
    return job


async def waiting(rig: Any, *jobs: tuple[str, str]) -> None:
    """Every one of ``jobs`` is in the binder's line and found no node (so the next free node decides)."""

    async def check() -> bool:
        for namespace, name in jobs:
            job = await rig.job(name, namespace)
            assert (job.status.phase, job.status.reason) == ("Queued", "Unschedulable"), (name, job.status)
        return True

    await eventually(check, deadline_s=15, message=f"{jobs} never all waited for the busy node")


async def free_the_node_and_finish(rig: Any, *jobs: tuple[str, str]) -> list[str]:
    """Cancel the blocker; once ``jobs`` all succeeded, the Jobs in the order the node started them."""
    await rig.set_spec("blocker", "t", state="Cancelled")

    async def done() -> bool:
        for namespace, name in jobs:
            job = await rig.job(name, namespace)
            assert job.status.phase == "Succeeded", (name, job.status.phase, job.status.reason)
        return True

    await eventually(done, deadline_s=30, message=f"{jobs} never all succeeded")
    assert rig.fleet.overlaps == []
    return [s.job for s in rig.fleet.started]


async def test_the_later_job_with_the_earlier_deadline_runs_first(make_rig: Callable[..., Any]) -> None:
    async with make_rig(hold_the_blocker, nodes=1) as rig:
        await rig.submit("blocker")
        await eventually(lambda: rig.fleet.running, message="the blocker never started")
        base = datetime.now(UTC) - timedelta(minutes=5)
        await create(rig, "first-come", "t", base)
        await create(rig, "urgent", "t", base + timedelta(seconds=10), "2030-01-01T00:00:00Z")
        await waiting(rig, ("t", "first-come"), ("t", "urgent"))
        order = await free_the_node_and_finish(rig, ("t", "first-come"), ("t", "urgent"))
        assert order == ["blocker", "urgent", "first-come"]
        # The Attempts agree: the urgent one was created (and started) first; the run knows its deadline.
        (urgent,) = await rig.attempts_of("urgent")
        (first,) = await rig.attempts_of("first-come")
        assert (urgent.metadata.creation_timestamp or "") <= (first.metadata.creation_timestamp or "")
        assert (urgent.status.start_time or "") <= (first.status.start_time or "")
        starts = {s.job: s for s in rig.fleet.started}
        assert starts["urgent"].complete_by_time == "2030-01-01T00:00:00Z"
        assert starts["first-come"].complete_by_time is None


async def test_another_projects_early_deadline_does_not_jump_an_earlier_job(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(hold_the_blocker, nodes=1) as rig:
        await rig.submit("blocker")
        await eventually(lambda: rig.fleet.running, message="the blocker never started")
        base = datetime.now(UTC) - timedelta(minutes=5)
        await create(rig, "victim", "t", base)
        await create(rig, "attacker", "u", base + timedelta(seconds=10), "1970-01-01T00:00:00Z")
        await waiting(rig, ("t", "victim"), ("u", "attacker"))
        order = await free_the_node_and_finish(rig, ("t", "victim"), ("u", "attacker"))
        assert order == ["blocker", "victim", "attacker"]
        (victim,) = await rig.attempts_of("victim", "t")
        (attacker,) = await rig.attempts_of("attacker", "u")
        assert (victim.status.start_time or "") <= (attacker.status.start_time or "")
