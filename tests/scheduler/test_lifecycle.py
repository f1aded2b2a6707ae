"""The Job lifecycle against the real scheduler service and a scripted fleet on its own nats-server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from nodus_schema.messages import ObjectEvent, StartAttempt
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow


async def phase(rig: Any, name: str, want: str, deadline_s: float = 15.0) -> Any:
    async def check() -> Any:
        job = await rig.job(name)
        assert job.status.phase == want, (job.status.phase, job.status.reason, job.status.message)
        return job

    return await eventually(check, deadline_s=deadline_s, message=f"{name} never became {want}")


async def test_indexes_each_succeed_once_within_parallelism(make_rig: Callable[..., Any]) -> None:
    async with make_rig(nodes=4) as rig:
        events: list[ObjectEvent] = []

        async def on_event(msg: Any) -> None:
            events.append(msgspec.json.decode(msg.data, type=ObjectEvent))

        await rig.nc.subscribe("nodus.events.t.>", cb=on_event)
        await rig.submit("idx", completions=10, parallelism=3)
        job = await phase(rig, "idx", "Succeeded")
        await eventually(lambda: any(e.phase == "Succeeded" for e in events), message="no Succeeded event")
        assert sum(e.reason == "Placed" for e in events) == 10  # one per run, on the Attempt
        assert [e.phase for e in events if e.kind == "Job"][-1] == "Succeeded"
        st = job.status
        assert (st.succeeded, st.failed, st.completed_indexes, st.reason) == (10, 0, "0-9", "Completed")
        assert sorted(s.index for s in rig.fleet.started) == list(range(10))
        assert rig.fleet.max_running <= 3
        assert rig.fleet.overlaps == []
        assert all(s.restore_from is None for s in rig.fleet.started)


async def test_a_non_zero_exit_spends_backoff_limit(make_rig: Callable[..., Any]) -> None:
    def fail_index_1(s: StartAttempt) -> tuple[float, int]:
        return (0.0, 3 if s.index == 1 else 0)

    async with make_rig(fail_index_1) as rig:
        await rig.submit("bad", completions=2, parallelism=2, backoffLimit=1)
        job = await phase(rig, "bad", "Failed")
        assert job.status.reason == "BackoffLimitExceeded"
        assert job.status.failed == 2  # two customer failures: one more than backoffLimit
        assert [s.attempt_no for s in rig.fleet.started if s.index == 1] == [1, 2]
        assert job.status.succeeded == 1


async def test_a_node_lost_mid_run_gets_a_new_attempt_and_leaves_backoff_alone(
    make_rig: Callable[..., Any],
) -> None:
    def hang_first(s: StartAttempt) -> tuple[float | None, int]:
        # By attempt number, not by call order: the first run's script may never be called if its node
        # goes silent before the fleet reported it started (then a flag would hang the replacement).
        return (None, 0) if s.attempt_no == 1 else (0.0, 0)  # the first runs until its node vanishes

    async with make_rig(hang_first, nodes=2) as rig:
        await rig.submit("lost", backoffLimit=0)
        await eventually(lambda: rig.fleet.running, message="the first run never started")
        (first,) = rig.fleet.running.values()
        rig.fleet.go_silent(first.node)
        job = await phase(rig, "lost", "Succeeded", deadline_s=40)
        assert job.status.failed == 0  # infrastructure, not the user's: backoffLimit 0 is untouched
        attempts = sorted(await rig.attempts_of("lost"), key=lambda a: a.spec.attempt)
        assert [(a.spec.attempt, a.status.phase, a.status.reason) for a in attempts] == [
            (1, "Lost", "NodeLost"),
            (2, "Succeeded", "Completed"),
        ]
        assert attempts[1].spec.node != first.node
        # A Checkpointed Job's replacement restores what the lost run saved (the run had started).
        assert rig.fleet.started[-1].restore_from == first.attempt
        assert attempts[0].status.placement is not None and attempts[0].status.placement.explain

        async def not_ready() -> bool:
            return (await rig.fleet.store.get(None, first.node)).status.phase == "NotReady"

        await eventually(not_ready, message="the silent node never became NotReady")


async def test_on_interruption_fail_fails_instead_of_replacing(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: (None, 0), nodes=2) as rig:
        await rig.submit("strict", recovery={"onInterruption": "Fail"})
        await eventually(lambda: rig.fleet.running, message="the run never started")
        (run,) = rig.fleet.running.values()
        rig.fleet.go_silent(run.node)
        job = await phase(rig, "strict", "Failed", deadline_s=40)
        assert job.status.reason == "CapacityLost"
        assert len(rig.fleet.started) == 1


async def test_cancel_stops_runs_for_good(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: (None, 0)) as rig:
        await rig.submit("c", completions=2, parallelism=2)
        await eventually(lambda: len(rig.fleet.running) == 2, message="runs never started")
        await rig.set_spec("c", state="Cancelled")
        job = await phase(rig, "c", "Cancelled")
        assert job.status.reason == "Cancelled" and job.status.active == 0
        assert rig.fleet.running == {}


async def test_suspend_stops_with_a_checkpoint_and_resume_restores(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: (None, 0) if s.attempt_no == 1 else (0.0, 0)) as rig:
        await rig.submit("s")
        await eventually(lambda: rig.fleet.running, message="the run never started")
        (first,) = rig.fleet.running.values()
        await rig.set_spec("s", state="Suspended")
        job = await phase(rig, "s", "Suspended")
        assert any(c.type == "Suspended" and c.status == "True" for c in job.status.conditions)
        await rig.set_spec("s", state="Running")
        job = await phase(rig, "s", "Succeeded")
        assert rig.fleet.started[-1].restore_from == first.attempt
        assert any(c.type == "Suspended" and c.status == "False" for c in job.status.conditions)
        assert job.status.failed == 0


async def test_timeout_fails_with_deadline_exceeded(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: (None, 0)) as rig:
        await rig.submit("t", timeout="2s")
        job = await phase(rig, "t", "Failed")
        assert job.status.reason == "DeadlineExceeded"
        assert rig.fleet.running == {}


async def test_queue_timeout_fails_with_capacity_unavailable(make_rig: Callable[..., Any]) -> None:
    async with make_rig(nodes=1) as rig:
        await rig.submit("nowhere", resources={"gpu": "H100:8"}, placement={"queueTimeout": "1s"})
        job = await phase(rig, "nowhere", "Failed")
        assert job.status.reason == "CapacityUnavailable"
        assert "0/1 nodes" in (job.status.message or "")


async def test_an_unplaced_job_says_why(make_rig: Callable[..., Any]) -> None:
    async def unschedulable() -> Any:
        job = await rig.job("why")
        assert (job.status.phase, job.status.reason) == ("Queued", "Unschedulable")
        return job

    async with make_rig(nodes=2) as rig:
        await rig.submit("why", resources={"gpu": "H100:8"})
        job = await eventually(unschedulable, message="the Job never said why it waits")
        assert (job.status.message or "").startswith("0/2 nodes: 2 ")
        scheduled = [c for c in job.status.conditions if c.type == "Scheduled"]
        assert scheduled and scheduled[0].status == "False" and scheduled[0].reason == "Unschedulable"


async def test_raising_parallelism_starts_more_at_once(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: (None, 0), nodes=4) as rig:
        await rig.submit("p", completions=4, parallelism=1)
        await eventually(lambda: len(rig.fleet.running) == 1, message="the first run never started")
        await rig.set_spec("p", parallelism=3)
        await eventually(
            lambda: len(rig.fleet.running) == 3, deadline_s=30, message="parallelism 3 never ran 3"
        )


async def test_ttl_after_finished_deletes_the_job_and_its_attempts(make_rig: Callable[..., Any]) -> None:
    async with make_rig() as rig:
        await rig.submit("ttl", ttlSecondsAfterFinished=1)

        async def gone() -> bool:
            try:
                await rig.job("ttl")
            except Exception:
                return await rig.attempts_of("ttl") == []
            return False

        await eventually(gone, deadline_s=15, message="the finished Job was never deleted")


async def test_an_ephemeral_job_starts_over_after_a_suspension(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: (None, 0) if s.attempt_no == 1 else (0.0, 0)) as rig:
        await rig.submit("e", recovery={"continuity": "Ephemeral"})
        await eventually(lambda: rig.fleet.running, message="the run never started")
        await rig.set_spec("e", state="Suspended")
        await phase(rig, "e", "Suspended")
        await rig.set_spec("e", state="Running")
        await phase(rig, "e", "Succeeded")
        assert [(s.attempt_no, s.restore_from, s.continuity) for s in rig.fleet.started] == [
            (1, None, "Ephemeral"),
            (2, None, "Ephemeral"),
        ]
