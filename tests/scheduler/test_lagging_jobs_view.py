"""A Job missing from the scheduler's view of Jobs while its run is in the view of Attempts (after a lost
server the Jobs' watch may resume after the Attempts'): its run is not stopped as a deleted Job's. The
scheduler looks the Job up in the store first (``Informer.confirm``), and stops the runs of a Job the
store does not hold either."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.msg import Msg

from nodus_schema.attempts import Attempt
from nodus_schema.messages import StartAttempt, StopAttempt, StopReason
from nodus_testing.waiting import eventually


def forever(_: StartAttempt) -> tuple[float | None, int]:
    return (None, 0)  # runs until it is stopped


async def test_the_run_of_a_job_the_view_has_not_shown_is_not_stopped(make_rig: Callable[..., Any]) -> None:
    async with make_rig(forever, nodes=1) as rig:
        scheduler = rig.scheduler
        await rig.submit("one")

        async def running() -> Attempt:
            attempts = await rig.attempts_of("one")
            assert [a.status.phase for a in attempts] == ["Running"], attempts
            return attempts[0]

        run = (await eventually(running, deadline_s=20, message="the run never started")).metadata.name
        await eventually(
            lambda: (a := scheduler.world.attempts.get("t", run)) is not None and a.status.phase == "Running",
            deadline_s=20,
            message="the view of Attempts shows it running",
        )
        jobs = scheduler.world.jobs
        await jobs.stop()
        shown = jobs.get("t", "one")
        assert shown is not None
        jobs.replace([], int(shown.metadata.resource_version or "0"))  # the Job not shown yet
        stops: list[StopAttempt] = []

        async def heard(msg: Msg) -> None:
            sent = msgspec.json.decode(msg.data, type=StartAttempt | StopAttempt)
            if isinstance(sent, StopAttempt):
                stops.append(sent)

        await rig.nc.subscribe("nodus.assign.>", cb=heard)
        await scheduler.lifecycle.reconcile(("t", "one"))
        await rig.nc.flush()  # the scheduler publishes on this connection: a stop would be heard by now
        assert stops == [], "the run was stopped as a deleted Job's"
        assert jobs.get("t", "one") is not None  # the store's copy, taken into the view
        assert jobs.apply(await rig.jobs.delete("t", "one"), deleted=True)  # as its event tells it
        await scheduler.lifecycle.reconcile(("t", "one"))
        await eventually(lambda: stops, deadline_s=10, message="the deleted Job's run kept running")
        assert {(s.attempt, s.reason) for s in stops} == {(run, StopReason.JOB_DELETED)}
