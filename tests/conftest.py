"""Shared fixtures: a connection to the session's real nats-server with every bucket and stream declared.

The servers themselves come from the ``nodus_testing`` pytest plugin (real nats-server, SeaweedFS,
podman); tests isolate by namespace or name with the ``unique`` fixture.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_kit import declaring
from nodus_kit.connecting import connect


@pytest_asyncio.fixture(scope="session")
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await connect(nats_url, "tests")
    await declaring.ensure(conn.jetstream())
    yield conn
    await conn.close()
