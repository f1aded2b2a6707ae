"""A Nodus service in the test's own process and event loop, on the test's connection (the scheduler's,
billing's and the sweep controller's rigs: tests/sweeps/test_crashing.py, test_warm_capacity.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TypeVar

from nats.aio.client import Client as NATS

from nodus_kit.controlling import Controller
from nodus_kit.servicing import Service, Settings
from nodus_testing.waiting import eventually

S = TypeVar("S", bound=Service)


@contextlib.asynccontextmanager
async def in_process(service: type[S], nc: NATS, env: Mapping[str, str]) -> AsyncIterator[S]:
    """Start ``service`` with ``env`` (``NODUS_REPLICA`` defaults to ``test``) on ``nc``; stop it on exit and
    wait until its controllers' queues are idle while the connection is still open (``stop()`` can return
    while a controller's workers still drain its queue)."""
    svc = service(Settings.from_env(service.name, {"NODUS_REPLICA": "test", **env}))
    svc.nc = nc
    await svc.start()
    try:
        yield svc
    finally:
        svc.stopping.set()
        await svc.stop()
        controllers = [c for c in vars(svc).values() if isinstance(c, Controller)]
        await eventually(
            lambda: all(c.queue.idle() for c in controllers),
            deadline_s=30,
            message=f"{service.name}'s controllers still working after stop",
        )
