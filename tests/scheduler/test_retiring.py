"""Nodes left behind by stopped or killed agents (issue #18): out of placement and its explanations after
NODUS_NODE_UNREACHABLE_GRACE_S, deleted after NODUS_NODE_DELETE_AFTER_S, by compare-and-set; against the
real scheduler service (or its retirer alone) and a scripted fleet on a nats-server of each test's own."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from nodus_kit.errors import NotFound
from nodus_kit.informing import Informer
from nodus_kit.storing import ObjectStore
from nodus_scheduler.retiring import (
    DELETE_AFTER,
    DELETE_AFTER_ENV,
    NODE_DELETED,
    UNREACHABLE_GRACE_ENV,
    NodeTimes,
    Retirer,
    check_period,
)
from nodus_schema.messages import ObjectEvent, StartAttempt
from nodus_schema.meta import ObjectMeta, format_time, now_rfc3339
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_testing.waiting import eventually

from .conftest import OFFERING, REGION

pytestmark = pytest.mark.slow


async def left_behind(rig: Any, name: str, *, beat_age_s: float, phase: str = "NotReady") -> Node:
    """The record of an agent that is gone: it beat ``beat_age_s`` ago and never again (an agent that
    stopped said NotReady on its way out; one that was killed left it Ready)."""
    beat = format_time(datetime.now(UTC) - timedelta(seconds=beat_age_s))
    node = Node(
        metadata=ObjectMeta(name=name),
        spec=NodeSpec(offering=OFFERING, region_class=REGION),
        status=NodeStatus(phase=phase, last_heartbeat_time=beat),
    )
    made: Node = await rig.fleet.store.create(node)
    return made


def beat(node: Node) -> Node:
    """What an agent's heartbeat writes (nodus_agent.registering)."""
    status = msgspec.structs.replace(node.status, phase="Ready", last_heartbeat_time=now_rfc3339())
    return msgspec.structs.replace(node, status=status)


async def exists(rig: Any, name: str) -> bool:
    try:
        await rig.fleet.store.get(None, name)
    except NotFound:
        return False
    return True


def test_the_two_periods_come_from_the_settings() -> None:
    assert NodeTimes.from_env({}) == NodeTimes(timedelta(seconds=600), DELETE_AFTER)
    times = NodeTimes.from_env({UNREACHABLE_GRACE_ENV: "90", DELETE_AFTER_ENV: "3600.5"})
    assert times == NodeTimes(timedelta(seconds=90), timedelta(seconds=3600.5))
    for bad in ("0", "-5", "ten", "nan", "inf"):
        with pytest.raises(ValueError, match=UNREACHABLE_GRACE_ENV):
            NodeTimes.from_env({UNREACHABLE_GRACE_ENV: bad})
    assert check_period(DELETE_AFTER) == 60.0 and check_period(timedelta(seconds=2)) == 0.5


async def test_a_node_not_ready_past_the_grace_is_neither_counted_nor_placed_on(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(lambda s: (None, 0), nodes=1, env={UNREACHABLE_GRACE_ENV: "30"}) as rig:
        await left_behind(rig, "killed", beat_age_s=60, phase="Ready")  # never marked NotReady
        await left_behind(rig, "stopped", beat_age_s=90)
        await left_behind(rig, "stopping", beat_age_s=0)  # NotReady within the grace: still counted
        await rig.submit("hog")
        await eventually(lambda: rig.fleet.running, message="the hog never started on n0")
        await rig.submit("wait")

        async def explained() -> Any:
            job = await rig.job("wait")
            assert (job.status.phase, job.status.reason) == ("Queued", "Unschedulable")
            assert job.status.message == "0/2 nodes: 1 not ready, 1 busy", job.status.message
            return job

        await eventually(explained, deadline_s=15, message="the gone nodes were counted")
        assert {s.node for s in rig.fleet.started} == {"n0"}
        assert {a.spec.node for a in await rig.attempts_of("wait")} == set()
        # Only placement forgets them: the scheduler still knows their records, which stay (for now).
        assert {"killed", "stopped", "stopping"} <= {n.metadata.name for n in rig.scheduler.world.nodes}
        assert await exists(rig, "stopped")


async def test_a_node_not_ready_past_the_delete_period_is_deleted(make_rig: Callable[..., Any]) -> None:
    async with make_rig(nodes=1, env={DELETE_AFTER_ENV: "2"}) as rig:
        events: list[ObjectEvent] = []

        async def on_event(msg: Any) -> None:
            events.append(msgspec.json.decode(msg.data, type=ObjectEvent))

        await rig.nc.subscribe("nodus.events._.nodes.>", cb=on_event)
        stopped = await left_behind(rig, "stopped", beat_age_s=0)

        async def deleted() -> bool:
            return not await exists(rig, "stopped")

        await eventually(deleted, deadline_s=15, message="the stopped node was never deleted")
        await eventually(lambda: any(e.name == "stopped" for e in events), message="no event")
        (event,) = [e for e in events if e.name == "stopped"]
        assert (event.reason, event.kind, event.uid) == (NODE_DELETED, "Node", stopped.metadata.uid)
        assert "NODUS_NODE_DELETE_AFTER_S=2" in event.message
        assert rig.scheduler.world.node("stopped") is None
        # The fleet's node heartbeats: NotReady never, deleted never.
        assert rig.scheduler.retirer.deleted == 1 and await exists(rig, "n0")


async def test_the_retirer_deletes_by_compare_and_set_on_the_revision_it_judged(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(nodes=0, scheduler=False) as rig:
        store: ObjectStore[Node] = rig.fleet.store
        cache = Informer(store)
        await cache.start()
        try:
            retirer = Retirer(rig.nc, store, cache, delete_after=timedelta(minutes=10))
            await left_behind(rig, "back", beat_age_s=3600)
            await left_behind(rig, "left", beat_age_s=3600)
            await left_behind(rig, "recent", beat_age_s=60)
            await eventually(
                lambda: {"back", "left", "recent"} <= {n.metadata.name for n in cache}, message="not cached"
            )
            judged = cache.get(None, "back")
            # Its agent restarts between the judgement and the delete: a heartbeat, a new revision.
            await store.mutate(None, "back", beat)
            assert not await retirer.retire(judged)
            assert (await store.get(None, "back")).status.phase == "Ready"
            # The next look judges the heartbeat: only the node still silent goes, once.
            await eventually(lambda: cache.get(None, "back").status.phase == "Ready", message="no beat seen")
            left = cache.get(None, "left")
            assert await retirer.sweep() == ["left"]
            assert await retirer.sweep() == []
            assert not await retirer.retire(left)  # deleted already (a look before a crash): no error
            assert not await exists(rig, "left")
            assert await exists(rig, "back") and await exists(rig, "recent")
            # A retirer started again (a new leader) decides the same from the same records.
            again = Retirer(rig.nc, store, cache, delete_after=timedelta(seconds=30))
            assert await again.sweep() == ["recent"]
            assert retirer.deleted == 1 and again.deleted == 1
        finally:
            await cache.stop()


async def test_a_killed_agent_loses_its_run_and_then_its_node(make_rig: Callable[..., Any]) -> None:
    def hang_first(s: StartAttempt) -> tuple[float | None, int]:
        return (None, 0) if s.attempt_no == 1 else (0.0, 0)  # the first runs until its node vanishes

    env = {UNREACHABLE_GRACE_ENV: "1", DELETE_AFTER_ENV: "2"}
    async with make_rig(hang_first, nodes=2, env=env) as rig:
        await rig.submit("lost", backoffLimit=0)
        await eventually(lambda: rig.fleet.running, message="the first run never started")
        (first,) = rig.fleet.running.values()
        rig.fleet.go_silent(first.node)  # killed: no NotReady of its own, no more beats or reports

        async def succeeded() -> Any:
            job = await rig.job("lost")
            assert job.status.phase == "Succeeded", (job.status.phase, job.status.message)
            return job

        job = await eventually(succeeded, deadline_s=40, message="the lost run was never replaced")
        assert job.status.failed == 0
        attempts = sorted(await rig.attempts_of("lost"), key=lambda a: a.spec.attempt)
        assert [(a.status.phase, a.status.reason) for a in attempts] == [
            ("Lost", "NodeLost"),
            ("Succeeded", "Completed"),
        ]

        async def deleted() -> bool:
            return not await exists(rig, first.node)

        await eventually(deleted, deadline_s=30, message="the killed agent's node was never deleted")
        other = attempts[1].spec.node
        assert other != first.node and await exists(rig, other)
