"""ObjectStore on a three-server cluster (R3 buckets): what a refused create promises holds there too.

A replicated stream's leader checks a write against the writes it has proposed to its peers, not only
those it has applied, so a create can be refused for another's create that no read shows yet. The store
waits for that write to show before it answers AlreadyExists: after AlreadyExists, a get finds the object
(the scheduler's catalog publisher relies on it; two of them start together).
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import nats
from nats.js.errors import NoStreamResponseError

from nodus_kit import declaring
from nodus_kit.errors import AlreadyExists
from nodus_kit.storing import ObjectStore
from nodus_schema.meta import ObjectMeta
from nodus_schema.offerings import Offering
from nodus_testing.natscluster import NatsCluster
from nodus_testing.waiting import eventually

NAMES = 150


async def _create_then_get(store: ObjectStore[Offering], name: str) -> str:
    try:
        await store.create(Offering(metadata=ObjectMeta(name=name)))
        return "created"
    except AlreadyExists:
        await store.get(None, name)  # NotFound here is the bug this file is about
        return "found"


async def _writable(store: ObjectStore[Offering], name: str) -> bool:
    """Whether a write through this store's server reaches the new stream: just after it is declared, a
    server that has not yet learned the stream's subjects answers no responders (nothing is written)."""
    try:
        await store.create(Offering(metadata=ObjectMeta(name=name)))
    except NoStreamResponseError:
        return False
    except AlreadyExists:
        pass  # an earlier try was stored after all
    return True


async def test_after_already_exists_a_get_finds_the_object_on_an_r3_bucket(tmp_path: Path) -> None:
    with NatsCluster(3, tmp_path / "nats") as cluster:
        # Each writer on its own server, so the two creates of a name race through different routes.
        conns = [await nats.connect(url) for url in cluster.urls[:2]]
        try:
            await declaring.ensure(conns[0].jetstream(), (declaring.bucket("offerings"),), (), replicas=3)
            a, b = (ObjectStore(nc, "offerings", Offering) for nc in conns)
            for store, name in ((a, "ready-a"), (b, "ready-b")):
                ready = functools.partial(_writable, store, name)
                await eventually(ready, deadline_s=30, message="R3 bucket not ready")
            answers: list[str] = []
            for i in range(NAMES):
                name = f"o-{i}"
                answers += await asyncio.gather(_create_then_get(a, name), _create_then_get(b, name))
            assert answers.count("created") == NAMES
            assert answers.count("found") == NAMES
        finally:
            for nc in conns:
                await nc.close()
