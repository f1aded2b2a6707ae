"""Watches and waits of the sync client against the real gateway: events, resume after a dropped
connection (a real TCP relay cut in the middle), relist after 410, the timeout, and wait_for."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_gateway.resources import stores_for
from nodus_schema import Sweep
from nodus_sdk import Client, Event, NotFound, WaitTimeout, finished
from nodus_sdk.syncclient import Watch
from nodus_testing.waiting import eventually

run = asyncio.to_thread
DEADLINE_S = 10.0


class Collector:
    """Iterates a sync watch in a thread and keeps its events, for the loop to look at."""

    def __init__(self, watch: Watch[Sweep]) -> None:
        self.watch = watch
        self.events: list[Event[Sweep]] = []
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self.watch:
                self.events.append(event)
        except BaseException as e:
            self.error = e
        finally:
            self._done.set()

    def seen(self) -> list[tuple[str, str | None, bool]]:
        return [(e.type, e.object.metadata.name, e.relisted) for e in self.events]

    async def until(self, *wanted: tuple[str, str | None, bool]) -> None:
        def has() -> bool:
            assert self.error is None, self.error
            return all(w in self.seen() for w in wanted)

        await eventually(has, DEADLINE_S, message=f"events {wanted} (seen {self.seen()})")

    async def finished(self) -> None:
        await eventually(self._done.is_set, DEADLINE_S, message="the watch ends")


async def test_watch_sees_the_current_objects_then_every_change(
    client: Client, sweep: Callable[..., Sweep]
) -> None:
    await run(client.sweeps.create, sweep("before"))
    events = Collector(client.sweeps.watch(timeout=DEADLINE_S))
    try:
        await events.until(("ADDED", "before", False))
        await run(client.sweeps.create, sweep("after"))
        await run(lambda: client.sweeps.patch("after", {"spec": {"maxParallel": 3}}))
        await run(client.sweeps.delete, "before")
        await events.until(
            ("ADDED", "after", False), ("MODIFIED", "after", False), ("DELETED", "before", False)
        )
        modified = next(e.object for e in events.events if e.type == "MODIFIED")
        assert isinstance(modified, Sweep) and modified.spec.max_parallel == 3
    finally:
        events.watch.close()


async def test_a_dropped_connection_resumes_from_the_last_resource_version(
    proxy: Any, connect: Callable[[str], Client], gateway_url: str, sweep: Callable[..., Sweep]
) -> None:
    via_proxy, direct = connect(proxy.url), connect(gateway_url)
    await run(via_proxy.sweeps.create, sweep("lr"))
    events = Collector(via_proxy.sweeps.watch(timeout=DEADLINE_S))
    try:
        await events.until(("ADDED", "lr", False))
        connections = events.watch.state.connections
        proxy.down = True  # the change happens while the client cannot reach the gateway
        proxy.cut()
        await run(lambda: direct.sweeps.patch("lr", {"spec": {"maxParallel": 3}}))
        proxy.down = False
        await events.until(("MODIFIED", "lr", False))
        assert events.watch.state.connections > connections  # it really opened a new connection
        assert [t for t, _, _ in events.seen()] == ["ADDED", "MODIFIED"]  # nothing twice, nothing lost
    finally:
        events.watch.close()


async def test_a_410_relists_and_yields_the_difference(
    proxy: Any, nc: NATS, connect: Callable[[str], Client], gateway_url: str, sweep: Callable[..., Sweep]
) -> None:
    via_proxy, direct = connect(proxy.url), connect(gateway_url)
    await run(direct.sweeps.create, sweep("gone"))
    await run(direct.sweeps.create, sweep("kept"))
    events = Collector(via_proxy.sweeps.watch(timeout=DEADLINE_S))
    try:
        await events.until(("ADDED", "gone", False), ("ADDED", "kept", False))
        proxy.down = True
        proxy.cut()
        # While the client is away: a delete whose marker compaction removes (so a watch from the
        # client's resourceVersion could miss it: 410), a change, and a new object.
        await run(direct.sweeps.delete, "gone")
        await run(lambda: direct.sweeps.patch("kept", {"spec": {"maxParallel": 3}}))
        await run(direct.sweeps.create, sweep("new"))
        assert await stores_for(nc)["sweeps"].compact(older_than_s=0) >= 1
        proxy.down = False
        await events.until(("DELETED", "gone", True), ("MODIFIED", "kept", True), ("ADDED", "new", True))
        assert events.watch.state.relists == 1
        deleted = next(e.object for e in events.events if e.type == "DELETED")
        assert deleted.metadata.name == "gone"  # the last state the watch saw
        # And it watches on from the list's resourceVersion.
        await run(direct.sweeps.create, sweep("later"))
        await events.until(("ADDED", "later", False))
    finally:
        events.watch.close()


async def test_a_watch_from_an_expired_resource_version_relists_at_once(
    client: Client, nc: NATS, sweep: Callable[..., Sweep]
) -> None:
    before = (await run(client.sweeps.list_page)).resource_version
    await run(client.sweeps.create, sweep("gone"))
    await run(client.sweeps.delete, "gone")
    await run(client.sweeps.create, sweep("kept"))
    assert await stores_for(nc)["sweeps"].compact(older_than_s=0) >= 1
    events = Collector(client.sweeps.watch(resource_version=before, timeout=DEADLINE_S))
    try:
        await events.until(("ADDED", "kept", True))
        assert events.watch.state.relists == 1 and ("DELETED", "gone", True) not in events.seen()
    finally:
        events.watch.close()


async def test_the_timeout_ends_the_iteration(client: Client, sweep: Callable[..., Sweep]) -> None:
    await run(client.sweeps.create, sweep("lr"))
    loop = asyncio.get_running_loop()
    began = loop.time()
    events = Collector(client.sweeps.watch(timeout=1.0))
    await events.finished()
    assert events.error is None and events.seen() == [("ADDED", "lr", False)]
    assert 1.0 <= loop.time() - began < DEADLINE_S


async def _set_phase(nc: NATS, namespace: str, name: str, phase: str) -> None:
    def with_phase(obj: Any) -> Any:
        return msgspec.structs.replace(obj, status=msgspec.structs.replace(obj.status, phase=phase))

    await stores_for(nc)["sweeps"].mutate(namespace, name, with_phase)


async def test_wait_for_returns_once_the_condition_holds(
    client: Client, nc: NATS, unique: str, sweep: Callable[..., Sweep]
) -> None:
    created = await run(client.sweeps.create, sweep("lr"))
    waiting = asyncio.ensure_future(run(lambda: client.wait_for(created, finished, timeout=DEADLINE_S)))
    await _set_phase(nc, unique, "lr", "Running")
    await _set_phase(nc, unique, "lr", "Succeeded")
    done = await asyncio.wait_for(waiting, DEADLINE_S)
    assert isinstance(done, Sweep) and done.status.phase == "Succeeded"
    # Already true: it returns at once.
    assert (await run(lambda: client.sweeps.wait_for("lr", finished))).status.phase == "Succeeded"


async def test_wait_for_times_out_or_sees_the_object_go(
    client: Client, connect: Callable[[str], Client], sweep: Callable[..., Sweep]
) -> None:
    await run(client.sweeps.create, sweep("lr"))
    with pytest.raises(WaitTimeout) as err:
        await run(lambda: client.sweeps.wait_for("lr", finished, timeout=0.5))
    assert isinstance(err.value.last, Sweep)
    with pytest.raises(NotFound):
        await run(lambda: client.sweeps.wait_for("missing", finished, timeout=DEADLINE_S))
    waiting = asyncio.ensure_future(run(lambda: client.sweeps.wait_for("lr", finished, timeout=DEADLINE_S)))
    # Deleted before, between or after the wait's get and watch: the wait says it is gone, each way.
    await run(connect(client.server).sweeps.delete, "lr")
    with pytest.raises(NotFound) as gone:
        await asyncio.wait_for(waiting, DEADLINE_S)
    assert "was deleted" in gone.value.message
