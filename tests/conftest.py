"""Shared fixtures: a connection to the session's real nats-server with every bucket and stream declared.

The servers themselves come from the ``nodus_testing`` pytest plugin (real nats-server, SeaweedFS,
podman); tests isolate by namespace or name with the ``unique`` fixture.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_kit import declaring
from nodus_kit.connecting import connect


@pytest_asyncio.fixture(scope="session")
async def nc(nats_url: str, nats_seed: Path) -> AsyncIterator[NATS]:
    conn = await connect(nats_url, "tests", nkey_seed=nats_seed)
    await declaring.ensure(conn.jetstream())
    yield conn
    await conn.close()


@pytest_asyncio.fixture(scope="session")
async def node_access(nc: NATS) -> AsyncIterator[None]:
    """The gateway's Node authorizer (nodus_gateway.noding) on the session's bus: node agents ask it for
    their runs' Secrets and Connections and whether a StartAttempt is theirs, so a test that runs an
    agent without the gateway's process needs it (and nodus_testing.binding.bind for each run)."""
    from nodus_gateway.noding import serve_nodes
    from nodus_gateway.resources import stores_for

    subs = await serve_nodes(nc, stores_for(nc))
    yield
    for sub in subs:
        await sub.unsubscribe()
