"""The SDK against a real gateway: uvicorn on a free port in the session's loop, over the session's real
nats-server (as tests/cli/conftest.py serves it), with billing's account endpoints and the scheduler's and
billing's estimate endpoints on their real subjects.

The sync client blocks: tests run it with ``asyncio.to_thread`` so the loop keeps serving its requests.
A :class:`Proxy` (a plain TCP relay) stands between a client and the gateway where a test must drop
connections for real.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_gateway import estimating
from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_schema import Sweep
from nodus_sdk import AsyncClient, Client, Config, Retry, load_objects

TOKEN = "sdk-test-token-0123456789"


@pytest_asyncio.fixture(autouse=True)
async def services(nc: NATS) -> AsyncIterator[None]:
    """Billing's account endpoints and the estimate endpoints (the real ones) for every SDK test; per
    test, so that they are gone for the tests of other folders in the same session (the CLI's tests see
    a gateway without them)."""
    from nodus_billing.books import Books
    from nodus_billing.quoting import serve_quotes
    from nodus_billing.serving import serve_accounts
    from nodus_scheduler.answering import serve_estimates
    from nodus_scheduler.cataloging import load_catalog

    subs = [
        *await serve_accounts(nc, Books(nc)),
        await serve_estimates(nc, load_catalog()),
        await serve_quotes(nc),
    ]
    estimating.resume(nc)
    yield
    for sub in subs:
        await sub.unsubscribe()


@pytest_asyncio.fixture(scope="session")
async def gateway_url(nc: NATS) -> AsyncIterator[str]:
    # With principals: the projects (and tokens) endpoints are served too.
    principals = Principals(nc, pepper=b"sdk-test-pepper", cache_ttl_s=0.2)
    app = build_app(stores_for(nc), admin_token=TOKEN, principals=principals)
    server = ApiServer(app, "127.0.0.1", 0)
    await server.start()
    yield server.url
    await server.stop()


def config(url: str, project: str, token: str | None = TOKEN) -> Config:
    return Config(server=url, token=token, project=project)


@pytest.fixture
def client(gateway_url: str, unique: str) -> Iterator[Client]:
    """A sync client of the test gateway whose project is this test's own."""
    with Client(config(gateway_url, unique), timeout=10.0) as c:
        yield c


@pytest_asyncio.fixture
async def aclient(gateway_url: str, unique: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(config(gateway_url, unique), timeout=10.0) as c:
        yield c


class Proxy:
    """A TCP relay to ``upstream``: :meth:`cut` drops every connection open through it, as a network
    failure would (the client sees its stream end without a clean HTTP end)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.accepted = 0
        self.down = False
        """While down, every new connection is dropped at once (the server looks unreachable)."""
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def cut(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.down:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self._writers.update({writer, up_writer})
        pumps = [
            asyncio.create_task(_pump(reader, up_writer)),
            asyncio.create_task(_pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for w in (writer, up_writer):
            w.transport.abort()
            self._writers.discard(w)
        for task in pumps:
            self._tasks.discard(task)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass


@pytest_asyncio.fixture
async def proxy(gateway_url: str) -> AsyncIterator[Proxy]:
    host, port = gateway_url.removeprefix("http://").split(":")
    relay = Proxy(host, int(port))
    await relay.start()
    yield relay
    await relay.stop()


FAST_RETRY = Retry(attempts=50, backoff_s=0.05, max_backoff_s=0.2)
"""Reconnects quickly, for up to about 10 s: long enough for a test to keep a relay down meanwhile."""


@pytest.fixture
def connect(unique: str) -> Iterator[Callable[[str], Client]]:
    """Sync clients of other URLs (a relay) in this test's project, closed after the test."""
    made: list[Client] = []

    def make(url: str) -> Client:
        made.append(Client(config(url, unique), retry=FAST_RETRY, timeout=10.0))
        return made[-1]

    yield make
    for c in made:
        c.close()


SWEEP_YAML = """\
apiVersion: nodus.dev/v1
kind: Sweep
metadata:
  name: {name}
  labels: {{team: vision, size: "{size}"}}
spec:
  maxParallel: 2
  matrix:
    params:
      LR: ["0.1", "0.01"]
  template:
    kind: Job
    spec:
      image: ghcr.io/acme/train:1.0
      command: [python, train.py]
      expectedDuration: 30m
      resources:
        gpu: H100:1
"""


def sweep_of(name: str, size: str = "small") -> Sweep:
    (obj,) = load_objects(SWEEP_YAML.format(name=name, size=size))
    assert isinstance(obj, Sweep)
    return obj


def job_of(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": name, **meta},
        "spec": {
            "image": "ghcr.io/acme/train:1.0",
            "command": ["python", "train.py"],
            "expectedDuration": "10m",
            "resources": {"gpu": "H100:1"},
        },
    }


@pytest.fixture
def sweep() -> Callable[..., Sweep]:
    """A small Sweep (two cells, H100:1), typed, from YAML as a user would write it."""
    return sweep_of


@pytest.fixture
def job() -> Callable[..., dict[str, Any]]:
    """A Job as a plain dict (camelCase, as in a manifest)."""
    return job_of
