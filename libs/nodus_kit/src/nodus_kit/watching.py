"""Watches over an ObjectStore: every change after a resourceVersion, in order, without gaps.

nats-py's ``kv.watch`` cannot resume from a revision, so a watch is an ordered consumer on the bucket's
stream from ``opt_start_seq = rv + 1``. If the consumer is lost (server restart, slow consumer), the
watch re-creates it from the last sequence it delivered, so the caller sees each revision once.
A resourceVersion the store no longer covers raises :class:`~nodus_kit.errors.Expired` (410 Gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Generic, Protocol, TypeVar

import msgspec
from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from nodus_kit.keying import META_PREFIX, NODUS_OP, Event, Page, is_marker, key_of

log = logging.getLogger(__name__)
T = TypeVar("T", bound=msgspec.Struct)
# How long a consumer may be silent (no message, no heartbeat) before the watch re-creates it.
HEARTBEAT_S = 1.0


class Watched(Protocol[T]):
    """What a watch needs of its store (an :class:`~nodus_kit.storing.ObjectStore`). Said as a protocol
    so that this module does not import storing, which imports it to hand out watches."""

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def prefix(self) -> str: ...

    async def list(self, namespace: str | None = None) -> Page[T]: ...

    async def check_not_expired(self, resource_version: int) -> None: ...

    def decode(self, data: bytes, revision: int) -> T: ...


class WatchClosed(Exception):
    """The watch was stopped; iteration ends."""


class Watch(Generic[T]):
    def __init__(
        self,
        store: Watched[T],
        *,
        namespace: str | None,
        resource_version: int | None,
        name: str | None,
    ) -> None:
        self.store = store
        self.namespace = namespace
        # resourceVersion 0 means "any" in Kubernetes: start from the current state, as with none.
        self.start_rv = resource_version or None
        self.last = resource_version or 0
        if name:
            self.subject = store.prefix + key_of(namespace, name)
        else:
            self.subject = store.prefix + (f"{namespace}.>" if namespace else ">")
        self._name = name
        self._sub: Any = None
        self._initial: list[Event[T]] = []
        self._closed = False

    async def start(self) -> Watch[T]:
        if self.start_rv is None:
            # No resourceVersion: the current state as ADDED events, then every change after it.
            page = await self.store.list(self.namespace)
            self._initial = [
                Event("ADDED", o, int(o.metadata.resource_version))  # type: ignore[attr-defined]
                for o in page.items
                if self._name is None or o.metadata.name == self._name  # type: ignore[attr-defined]
            ]
            self.last = page.resource_version
        else:
            await self.store.check_not_expired(self.start_rv)
        await self._subscribe()
        return self

    async def _subscribe(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        self._sub = await self.store.js.subscribe(
            self.subject,
            ordered_consumer=True,
            idle_heartbeat=HEARTBEAT_S,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.last + 1
            ),
        )

    async def next(self, timeout: float | None = None) -> Event[T]:
        """The next event; raises :class:`asyncio.TimeoutError` when none comes within ``timeout``."""
        if self._initial:
            return self._initial.pop(0)
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while not self._closed:
            wait = 3 * HEARTBEAT_S
            if end is not None:
                wait = min(wait, max(0.0, end - loop.time()))
            try:
                msg = await self._sub.next_msg(timeout=wait)
            except (TimeoutError, NatsTimeout):
                if end is not None and loop.time() >= end:
                    raise TimeoutError from None
                await self._resubscribe_if_lost()
                continue
            except ConnectionClosedError:
                raise
            event = self._event(msg)
            if event is not None:
                return event
        raise WatchClosed(self.subject)

    async def _resubscribe_if_lost(self) -> None:
        """A silent consumer may be gone (server restarted): re-create it from the last delivered."""
        try:
            await self._sub.consumer_info()
        except Exception:
            # Compaction while we were away could have removed a delete marker we never saw: 410.
            await self.store.check_not_expired(self.last)
            log.info("watch consumer lost; resuming", extra={"subject": self.subject, "from": self.last + 1})
            with contextlib.suppress(Exception):
                await self._subscribe()

    def _event(self, msg: Any) -> Event[T] | None:
        seq = int(msg.metadata.sequence.stream)
        if seq <= self.last:
            return None  # a redelivery after a resume: already seen
        self.last = seq
        key = msg.subject[len(self.store.prefix) :]
        if key.startswith(META_PREFIX):
            return None
        headers = msg.headers or {}
        if is_marker(headers):
            if not msg.data:
                return None  # a bare marker (purge, TTL expiry): nothing to tell about
            kind = "DELETED"
        else:
            kind = "ADDED" if headers.get(NODUS_OP) == "create" else "MODIFIED"
        return Event(kind, self.store.decode(msg.data, seq), seq)

    def __aiter__(self) -> Watch[T]:
        return self

    async def __anext__(self) -> Event[T]:
        try:
            return await self.next()
        except WatchClosed:
            raise StopAsyncIteration from None

    async def stop(self) -> None:
        self._closed = True
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def __aenter__(self) -> Watch[T]:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
