"""Liveness off the disk (ADR-0042): beats heard on ``nodus.beat.<node>`` laid over the Nodes' records.

The rules on a view that follows no store (the informer takes what the test applies), then the scheduler
with a node whose record is written once while its beats go on the bus: it stays Ready past the grace,
is marked NotReady when the beats stop, and Ready again (with the beat's time) when they resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_kit.informing import Informer
from nodus_kit.storing import ObjectStore
from nodus_scheduler.beating import GAP_S, Liveness, epoch_of
from nodus_schema.messages import NodeBeat, beat_subject
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_testing.waiting import eventually

from .conftest import OFFERING, REGION

T0 = 1_800_000_000.0


def record(name: str, beat_s: float, revision: int, phase: str = "Ready") -> Node:
    return Node(
        metadata=ObjectMeta(name=name, resource_version=str(revision)),
        spec=NodeSpec(offering=OFFERING, region_class=REGION),
        status=NodeStatus(phase=phase, last_heartbeat_time=format_time(datetime.fromtimestamp(beat_s, UTC))),
    )


def body(time_s: float, phase: str = "Ready") -> bytes:
    return msgspec.json.encode(NodeBeat(time_ms=int(time_s * 1000), phase=phase))


def view(nc: NATS) -> tuple[Liveness, Informer[Node]]:
    liveness = Liveness()
    nodes = Informer(ObjectStore(nc, "nodes", Node), transform=liveness.overlay)
    liveness.attach(nodes)
    return liveness, nodes


def beat_of(nodes: Informer[Node], name: str) -> float:
    node = nodes.get(None, name)
    assert node is not None
    return epoch_of(node.status.last_heartbeat_time)


async def test_a_beat_is_laid_over_the_record_and_a_record_never_takes_it_back(nc: NATS) -> None:
    liveness, nodes = view(nc)
    events: list[str] = []
    nodes.add_handler(lambda e: events.append(e.type))
    nodes.apply(record("n1", T0, 1))
    assert liveness.take("n1", body(T0 + 5), now=T0 + 5)
    assert beat_of(nodes, "n1") == T0 + 5 and events == ["ADDED", "MODIFIED"]
    held = nodes.get(None, "n1")
    assert held is not None and held.metadata.resource_version == "1"  # the record's revision, kept
    # A record written since with an older beat (a drain, a cordon) keeps the newer beat heard.
    nodes.apply(record("n1", T0 + 2, 2, phase="Draining"))
    held = nodes.get(None, "n1")
    assert held is not None and held.status.phase == "Draining" and beat_of(nodes, "n1") == T0 + 5
    # A record refreshed past the beat wins; a late or repeated beat is no news.
    nodes.apply(record("n1", T0 + 30, 3))
    assert beat_of(nodes, "n1") == T0 + 30
    assert not liveness.take("n1", body(T0 + 5), now=T0 + 40)
    # Beats inside one second of the held time change nothing a reader sees (whole seconds).
    before = len(events)
    assert liveness.take("n1", body(T0 + 30.4), now=T0 + 31)
    assert len(events) == before


async def test_what_a_beat_cannot_do(nc: NATS) -> None:
    liveness, nodes = view(nc)
    nodes.apply(record("n1", T0, 1))
    # Not past this clock: a beat stamped an hour ahead keeps the node alive no longer than now.
    assert liveness.take("n1", body(T0 + 3600), now=T0 + 10)
    assert beat_of(nodes, "n1") == T0 + 10
    # No record, a node token with a dot, a body that is not a beat: dropped.
    assert not liveness.take("ghost", body(T0 + 11), now=T0 + 11)
    assert not liveness.take("n1.x", body(T0 + 11), now=T0 + 11)
    assert not liveness.take("n1", b'{"timeMs": "soon"}', now=T0 + 11)
    assert not liveness.take("n1", b"\xff", now=T0 + 11)
    assert liveness.heard == {"n1": T0 + 10}
    # An unknown phase is taken as Ready.
    assert liveness.take("n1", body(T0 + 12, phase="Gone"), now=T0 + 12)
    assert liveness.phases["n1"] == "Ready"
    # A deleted node is forgotten.
    held = nodes.get(None, "n1")
    assert held is not None
    nodes.apply(
        msgspec.structs.replace(held, metadata=msgspec.structs.replace(held.metadata, resource_version="9")),
        deleted=True,
    )
    assert liveness.heard == {} and liveness.phases == {}


async def test_a_silence_begun_before_it_listened_is_judged_only_after_a_grace(nc: NATS) -> None:
    liveness, _ = view(nc)
    await liveness.start(nc)
    try:
        since = liveness.since
        stale = record("stale", since - 40, 1)  # its record 40 s old: its agent may beat on the bus
        fresh = record("fresh", since + 1, 1)  # wrote after this process listened: a silence is real
        assert not liveness.may_judge(stale, since + 1)
        assert liveness.may_judge(fresh, since + 2)
        assert liveness.may_judge(stale, since + GAP_S)
        assert liveness.may_judge(record("stopped", since - 40, 1, phase="NotReady"), since + 1)
        assert liveness.judged_from() == since + GAP_S
        now = datetime.fromtimestamp(since + 1, UTC)
        assert not liveness.lost(stale, now) and not liveness.lost(fresh, now)
        assert liveness.lost(stale, datetime.fromtimestamp(since + GAP_S + 0.01, UTC))
    finally:
        await liveness.stop()


async def test_an_unstarted_view_judges_every_silence(nc: NATS) -> None:
    liveness, _ = view(nc)
    assert liveness.may_judge(record("n", T0, 1), T0)  # rules tested apart, with no bus to hear


@pytest.mark.slow
async def test_a_node_beating_only_on_the_bus_stays_ready_is_marked_not_ready_and_revived(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(nodes=0) as rig:
        name = "bus-only"
        written = time.time()
        await rig.fleet.store.create(
            Node(
                metadata=ObjectMeta(name=name),
                spec=NodeSpec(offering=OFFERING, region_class=REGION),
                status=NodeStatus(phase="Ready", last_heartbeat_time=format_time(datetime.now(UTC))),
            )
        )
        beating = asyncio.Event()
        beating.set()

        async def beats() -> None:
            while True:
                await beating.wait()
                await rig.nc.publish(beat_subject(name), body(time.time()))
                await asyncio.sleep(0.5)  # an agent's heartbeat period (not synchronisation)

        task = asyncio.create_task(beats())
        try:
            service = rig.scheduler
            assert service is not None
            stale = written + 15 + 3  # the record alone would have run out by now

            async def past_the_grace() -> bool:
                return time.time() > stale

            await eventually(past_the_grace, deadline_s=30, message="the clock stopped")
            node = await rig.fleet.store.get(None, name)
            assert node.status.phase == "Ready"  # the beats kept it: the record was written once
            assert node.status.last_heartbeat_time == format_time(datetime.fromtimestamp(int(written), UTC))
            assert service.world.liveness.beats > 10
            view = service.world.node(name)
            assert view is not None and epoch_of(view.status.last_heartbeat_time) > written + 15

            beating.clear()  # the agent goes silent
            stopped = time.time()

            async def not_ready() -> bool:
                return (await rig.fleet.store.get(None, name)).status.phase == "NotReady"

            await eventually(not_ready, deadline_s=30, message="the silent node never became NotReady")
            assert time.time() - stopped >= 13  # a grace after its last beat (whole seconds), not before

            beating.set()  # it comes back: the scheduler writes the beat's phase and time

            async def revived() -> Node | None:
                node = await rig.fleet.store.get(None, name)
                return node if node.status.phase == "Ready" else None

            node = await eventually(revived, deadline_s=10, message="the beating node never came back")
            assert epoch_of(node.status.last_heartbeat_time) >= int(stopped) + 14
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def test_the_gap_is_the_heartbeat_grace() -> None:
    from nodus_scheduler.capacity import HEARTBEAT_GRACE

    assert timedelta(seconds=GAP_S) == HEARTBEAT_GRACE
