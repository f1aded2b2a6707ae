"""No ghosts (issue #19): a run deleted while the scheduler's watch was down, its delete marker then
compacted away, must not keep its node busy for ever. The informer's relist replaces its view and tells
the lifecycle, which frees the node."""

from __future__ import annotations

from nats.aio.client import Client as NATS

from nodus_kit.storing import ObjectStore
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.lifecycle import Lifecycle
from nodus_scheduler.viewing import World
from nodus_schema.attempts import JOB_LABEL, Attempt, AttemptSpec, AttemptStatus
from nodus_schema.meta import ObjectMeta, now_rfc3339
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_testing.waiting import eventually

from .conftest import OFFERING, REGION


async def test_a_run_deleted_while_the_watch_was_down_frees_its_node(nc: NATS, unique: str) -> None:
    nodes, attempts = ObjectStore(nc, "nodes", Node), ObjectStore(nc, "attempts", Attempt)
    name = f"ghost-{unique}"
    await nodes.create(
        Node(
            metadata=ObjectMeta(name=name),
            spec=NodeSpec(offering=OFFERING, region_class=REGION),
            status=NodeStatus(phase="Ready", last_heartbeat_time=now_rfc3339()),
        )
    )
    run = Attempt(
        metadata=ObjectMeta(name="j-0-a1", namespace=unique, labels={JOB_LABEL: "j"}),
        spec=AttemptSpec(
            job="j",
            index=0,
            attempt=1,
            node=name,
            offering=OFFERING,
            region_class=REGION,
            rate_micros_per_hour=1_000_000,
            pricebook_version="test",
        ),
        status=AttemptStatus(phase="Running"),
    )
    await attempts.create(run)
    world = World(nc, funding=False)
    life = Lifecycle(nc, load_catalog(), world)
    await world.start()
    try:
        assert await world.wait_synced(10)
        await eventually(lambda: life.capacity.is_busy(name), message="the run's node is not busy")
        await world.stop()  # the watch is down
        await attempts.delete(unique, "j-0-a1")
        await attempts.compact(older_than_s=0)  # and the delete marker is gone from history
        await world.start()  # lists again
        await eventually(lambda: not life.capacity.is_busy(name), message="the ghost run keeps its node")
        assert world.attempt(unique, "j-0-a1") is None and name not in world.busy()
    finally:
        await world.stop()
        await nodes.delete(None, name)
