"""A real gateway on a free port (uvicorn in the session's loop, on the session's nats-server) for the CLI:
plain HTTP, and HTTPS with a certificate of a local CA as the local stack serves it.

The CLI is synchronous: tests run it with ``asyncio.to_thread`` so the loop keeps serving its requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_testing import certs

TOKEN = "cli-test-token-0123456789"


@pytest_asyncio.fixture(scope="session")
async def gateway_url(nc: NATS) -> AsyncIterator[str]:
    server = ApiServer(build_app(stores_for(nc), admin_token=TOKEN), "127.0.0.1", 0)
    await server.start()
    yield server.url
    await server.stop()


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> certs.Certs:
    """The local stack's CA and gateway certificate, made as ``make up`` makes them."""
    return certs.ensure(tmp_path_factory.mktemp("certs"))


@pytest_asyncio.fixture(scope="session")
async def https_url(nc: NATS, tls: certs.Certs) -> AsyncIterator[str]:
    app = build_app(stores_for(nc), admin_token=TOKEN)
    server = ApiServer(app, "127.0.0.1", 0, ssl_certfile=str(tls.cert), ssl_keyfile=str(tls.key))
    await server.start()
    yield server.url
    await server.stop()
