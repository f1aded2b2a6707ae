"""The bus of the credential tests: a real nats-server with the generated accounts of two node agents
(n1, n2) and every service, its streams declared by the admin credential as deployments do. One per test
module (a module may restart or fill it as it likes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import pytest_asyncio

from nodus_kit import permitting
from nodus_kit.permitting import Generated
from nodus_testing.natsserver import NatsServer

NODES = ("n1", "n2")


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    return permitting.generate(tmp_path_factory.mktemp("creds"), NODES)


@pytest.fixture(scope="module")
def server(creds: Generated) -> Iterator[NatsServer]:
    with NatsServer(tie_to_parent=True, extra_config=creds.accounts.read_text()) as s:
        yield s


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def declared(server: NatsServer, creds: Generated) -> str:
    """Every stream and bucket, declared by the admin credential (the bootstrap); the server's URL."""
    await permitting.declare(server.url, creds.seed("admin"))
    return server.url
