"""Watches over an ObjectStore: every change after a resourceVersion, in order, without gaps.

nats-py's ``kv.watch`` cannot resume from a revision, so a watch is an ordered consumer on the bucket's
stream from ``opt_start_seq = rv + 1``. If the consumer is lost (server restart, slow consumer), the
watch re-creates it from the last sequence it delivered, so the caller sees each revision once.
A resourceVersion the store no longer covers raises :class:`~nodus_kit.errors.Expired` (410 Gone).

Delivery (issue #23): the subscription's callback only appends each message to the watch's buffer; the
reader turns them into events, in order, without a wait per message. ``next_msg`` (what the watch used
before) made two tasks, a timer and a uuid per message, five turns of the event loop, and that was most
of a watch's time. A callback subscription acknowledges JetStream's flow control as messages arrive, so
the server no longer waits for the reader: the buffer is bounded instead (:data:`MAX_BUFFERED`,
:data:`MAX_BUFFERED_BYTES`). A reader that falls that far behind drops its consumer, reads what it has,
and re-creates the consumer from the last sequence it delivered, as after a lost one; the rest stays on
the server meanwhile.

The consumer is the watch's own (issue #23, idle), made with JetStream's public API and read by a plain
subscription, not nats-py's ordered consumer, which runs two tasks per watch: one woke four times a
second to answer flow control, whatever the traffic, and one every two heartbeats. The watch does what
they did where it already is: it answers a flow-control request as it buffers it, a consumer sequence
out of order (or a heartbeat that tells of messages it never got) drops the consumer and goes on from
the last delivered sequence, as a reader behind does, and a reader waiting on a silent watch looks for
its consumer once two heartbeats are missed (the heartbeats are what says a consumer lives: the
watch no longer asks for its consumer after 30 s without a change, as it did). It also names its
stream, where nats-py's asked the server which stream holds the subject: one JetStream request fewer
per watch started or resumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final, Generic, Protocol, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, Header, StatusCode

from nodus_kit.keying import META_PREFIX, NODUS_OP, Event, Page, is_marker, key_of

log = logging.getLogger(__name__)
T = TypeVar("T", bound=msgspec.Struct)
HEARTBEAT_S: Final = 5.0
"""The consumer's idle heartbeat, nats.go's default for an ordered consumer. A watch whose consumer sent
nothing, not even a beat, for two of them looks for it and re-creates it when it is gone, from the stream
sequence after the last it delivered: a consumer lost with a server the connection did not lose (another
member of a cluster) is back after 10-13 s. A lost connection says more sooner (:data:`WAKE_S`). Each
beat is a message from the server to every watch, which wakes nats-server's runtime and the watch's
process; an idle ``make up`` stack has about twenty watches. Twenty idle watches cost nats-server 0.17-0.20%
of a core with a 2 s heartbeat, 0.10% with 5 s, 0.03% with 30 s (issue #23, idle; it was 1 s until
2026-12-06, then 2 s)."""
MISSED_BEATS: Final = 2
"""Heartbeats a consumer may miss before its watch looks for it (as nats-py's ordered consumer)."""
WAKE_S: Final = 3.0
"""How often a reader waiting on a silent watch wakes to notice a closed connection (nats-py gives a
callback subscription no close signal), a reconnection since its consumer was made (the consumer, in
the server's memory, may be gone with a restarted server: it is looked for at once), or a consumer that
stopped beating."""
MAX_BUFFERED: Final = 8192
"""Messages a watch holds for its reader at most; past that it drops its consumer until the reader has
read them (memory stays bounded for a slow reader, such as a gateway watch to a slow client)."""
MAX_BUFFERED_BYTES: Final = 32 * 1024 * 1024
"""The same bound in bytes of values: a Sweep's status is ~140 kB, so 8,192 of them would be 1 GB."""
YIELD_EVERY: Final = 64
"""Events a reader gets from the buffer before the watch lets the event loop run other tasks once: a
backlog of thousands is read without a wait each, but not in one turn of the loop."""
_V1_ACK_TOKENS: Final = 9
"""``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>``: the reply
subject of a JetStream message without a domain (ADR-15 of nats-architecture-and-design)."""
_STATUS: Final = Header.STATUS.value
_CONTROL: Final = StatusCode.CONTROL_MESSAGE.value
_DESCRIPTION: Final = Header.DESCRIPTION.value
_LAST_CONSUMER: Final = Header.LAST_CONSUMER.value
_STALLED: Final = Header.CONSUMER_STALLED.value


class Watched(Protocol[T]):
    """What a watch needs of its store (an :class:`~nodus_kit.storing.ObjectStore`). Said as a protocol
    so that this module does not import storing, which imports it to hand out watches."""

    @property
    def nc(self) -> NATS: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def prefix(self) -> str: ...

    @property
    def stream(self) -> str: ...

    async def list(self, namespace: str | None = None) -> Page[T]: ...

    async def check_not_expired(self, resource_version: int) -> None: ...

    def decode(self, data: bytes, revision: int) -> T: ...


class WatchClosed(Exception):
    """The watch was stopped; iteration ends."""


def sequences(msg: Msg) -> tuple[int, int]:
    """The stream and consumer sequences of a JetStream message, read from its reply subject: nats-py's
    ``msg.metadata`` builds a datetime and two dataclasses for them (about 9 µs, the largest single cost
    of a watch event); other forms of the subject (with a domain) are left to it."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == _V1_ACK_TOKENS and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[5]), int(tokens[6])
    sequence = msg.metadata.sequence
    return int(sequence.stream), int(sequence.consumer)


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
        self._prefix_len = len(store.prefix)
        self._sub: Subscription | None = None
        self._consumer: str | None = None
        self._initial: deque[Event[T]] = deque()
        self._buffer: deque[tuple[int, Msg]] = deque()
        self._buffered_bytes = 0
        self._behind = False  # the buffer filled up: the consumer is (to be) dropped until it is read
        self._waiter: asyncio.Future[None] | None = None
        self._unyielded = 0
        self._closed = False
        self._consumers = 0
        self._heard = 0.0
        """Loop time of the consumer's last message or heartbeat (or of its creation)."""
        self._reconnects = 0
        """The connection's reconnections when the consumer was made or last looked for."""

    async def start(self) -> Watch[T]:
        if self.start_rv is None:
            # No resourceVersion: the current state as ADDED events, then every change after it.
            page = await self.store.list(self.namespace)
            self._initial = deque(
                Event("ADDED", o, int(o.metadata.resource_version))  # type: ignore[attr-defined]
                for o in page.items
                if self._name is None or o.metadata.name == self._name  # type: ignore[attr-defined]
            )
            self.last = page.resource_version
        else:
            await self.store.check_not_expired(self.start_rv)
        await self._subscribe()
        return self

    async def _subscribe(self) -> None:
        """A consumer from the last delivered sequence on, into a fresh buffer (what the old one held is
        delivered again by the new consumer, so nothing is lost and nothing comes twice)."""
        await self._unsubscribe()
        self._behind = False
        nc = self.store.nc
        self._reconnects = nc.stats["reconnects"]
        inbox = nc.new_inbox()
        # Interest first: the server pushes as soon as the consumer exists.
        self._sub = await nc.subscribe(inbox, cb=self._receiver())
        try:
            info = await self.store.js.add_consumer(self.store.stream, config=self._config(inbox))
        except BaseException:
            await self._unsubscribe()
            raise
        self._consumer = info.name
        self._consumers += 1

    def _config(self, inbox: str) -> ConsumerConfig:
        """An ordered consumer, as nats-py makes one: ephemeral, in memory, one replica, nothing acked
        (the watch itself checks the order), flow control and idle heartbeats."""
        return ConsumerConfig(
            deliver_subject=inbox,
            filter_subject=self.subject,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.last + 1,
            ack_policy=AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=HEARTBEAT_S,
            mem_storage=True,
            num_replicas=1,
        )

    @property
    def resumes(self) -> int:
        """Consumers made after the first: for lost ones, and for a reader that fell behind."""
        return max(0, self._consumers - 1)

    async def _unsubscribe(self) -> None:
        sub, self._sub, self._consumer = self._sub, None, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def _receiver(self) -> Callable[[Msg], Awaitable[None]]:
        """The callback of one subscription. Its buffer is its own: a message of a consumer already
        replaced (in flight when it was dropped) lands in a buffer nobody reads, never among the new
        consumer's. Once full, or once a consumer sequence is missing, it takes nothing more, so what it
        holds has no gap; the reader reads it and goes on with a new consumer."""
        buffer: deque[tuple[int, Msg]] = deque()
        self._buffer, self._buffered_bytes = buffer, 0
        loop = asyncio.get_running_loop()
        self._heard = loop.time()
        delivered = 0  # the consumer sequence of the last message buffered

        async def receive(msg: Msg) -> None:
            nonlocal delivered
            if buffer is not self._buffer or self._behind:
                return
            self._heard = loop.time()
            if not msg.data and msg.headers is not None and _STATUS in msg.headers:
                if msg.headers[_STATUS] == _CONTROL:
                    await self._controlled(msg, msg.headers, delivered)
                return  # any other status is no change to hand out
            stream_seq, consumer_seq = sequences(msg)
            if consumer_seq != delivered + 1:
                self._fall_behind()  # a message this client dropped (a slow consumer)
                return
            if len(buffer) >= MAX_BUFFERED or self._buffered_bytes >= MAX_BUFFERED_BYTES:
                self._fall_behind()
                return
            delivered = consumer_seq
            buffer.append((stream_seq, msg))
            self._buffered_bytes += len(msg.data)
            self._wake()

        return receive

    async def _controlled(self, msg: Msg, headers: dict[str, str], delivered: int) -> None:
        """A flow-control request is answered at once (the buffer bounds what the watch holds); an idle
        heartbeat answers a stalled consumer and says which consumer sequence it delivered last."""
        if headers.get(_DESCRIPTION, "").startswith("Flow"):
            if msg.reply:
                await self.store.nc.publish(msg.reply)
            return
        stalled = headers.get(_STALLED)
        if stalled:
            await self.store.nc.publish(stalled)
        last = headers.get(_LAST_CONSUMER)
        if last is not None and int(last) != delivered:
            self._fall_behind()  # the server delivered messages this client never got

    def _fall_behind(self) -> None:
        """Take nothing more from this consumer; the reader drops it once it has read what is buffered
        and goes on from the last sequence it delivered."""
        self._behind = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self, timeout: float | None = None) -> Event[T]:
        """The next event; raises :class:`asyncio.TimeoutError` when none comes within ``timeout``."""
        if self._initial:
            return self._initial.popleft()
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while not self._closed:
            if self._behind and self._sub is not None:
                await self._unsubscribe()  # at once: what the server sends meanwhile would be dropped
            buffer = self._buffer
            while buffer:
                seq, msg = buffer.popleft()
                self._buffered_bytes -= len(msg.data)
                event = self._event(seq, msg)
                if event is not None:
                    return await self._handed(event)
            if self._behind:
                await self._subscribe()  # all read: on from the last delivered
                continue
            if self.store.nc.is_closed:
                raise ConnectionClosedError
            wait = WAKE_S
            if end is not None:
                wait = min(wait, max(0.0, end - loop.time()))
            if await self._wait(wait):
                continue
            if end is not None and loop.time() >= end:
                raise TimeoutError
            if self.store.nc.is_closed:
                raise ConnectionClosedError
            now = loop.time()
            if not self._closed and self._may_be_lost(now):
                self._heard = now  # looked for: the next look is two heartbeats on
                await self._resubscribe_if_lost()
        raise WatchClosed(self.subject)

    async def _handed(self, event: Event[T]) -> Event[T]:
        """The event, after a turn of the loop for others every :data:`YIELD_EVERY` events."""
        self._unyielded += 1
        if self._unyielded >= YIELD_EVERY:
            self._unyielded = 0
            await asyncio.sleep(0)
        return event

    async def _wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a message (or the watch's stop); whether one may have come."""
        self._unyielded = 0
        waiter = self._waiter
        if waiter is None or waiter.done():
            waiter = self._waiter = asyncio.get_running_loop().create_future()
        # asyncio.wait leaves the future alone when it times out or its caller is cancelled.
        done, _ = await asyncio.wait((waiter,), timeout=seconds)
        return bool(done)

    def _may_be_lost(self, now: float) -> bool:
        """Whether the consumer missed its heartbeats, or the connection came back since it was made."""
        silent = now - self._heard >= MISSED_BEATS * HEARTBEAT_S
        return silent or self.store.nc.stats["reconnects"] != self._reconnects

    async def _resubscribe_if_lost(self) -> None:
        """A consumer that stopped beating may be gone (its server restarted): re-create it from the last
        delivered, after the check that nothing it could have missed meanwhile was compacted away."""
        self._reconnects = self.store.nc.stats["reconnects"]
        if self._consumer is not None:  # None: its last creation failed
            with contextlib.suppress(Exception):
                await self.store.js.consumer_info(self.store.stream, self._consumer)
                return  # still there
        # Compaction while we were away could have removed a delete marker we never saw: 410.
        await self.store.check_not_expired(self.last)
        log.info("watch consumer lost; resuming", extra={"subject": self.subject, "from": self.last + 1})
        with contextlib.suppress(Exception):
            await self._subscribe()

    def _event(self, seq: int, msg: Msg) -> Event[T] | None:
        if seq <= self.last:
            return None  # a redelivery after a resume: already seen
        self.last = seq
        subject = msg.subject
        if subject.startswith(META_PREFIX, self._prefix_len):
            return None
        headers = msg.headers
        if headers is None:
            kind = "MODIFIED"
        elif is_marker(headers):
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
        self._wake()  # a reader waiting ends now, with WatchClosed
        await self._unsubscribe()

    async def __aenter__(self) -> Watch[T]:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
