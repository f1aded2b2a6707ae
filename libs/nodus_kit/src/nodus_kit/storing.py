"""ObjectStore: Kubernetes-style objects in a JetStream KeyValue bucket, as etcd holds them for Kubernetes.

* key ``<namespace>.<name>`` (``_`` for cluster-scoped objects); value the object's JSON;
* ``metadata.resourceVersion`` is the KV revision, i.e. the bucket stream's sequence: monotonic per
  resource, stamped on read and never stored inside the value (it is not known before the write);
* every write is compare-and-set on the subject's last sequence: a lost race raises :class:`Conflict`;
* a create carries ``Nodus-Op: create`` and a delete is a KV delete marker that still carries the
  object's last state, so a watch tells ADDED, MODIFIED and DELETED apart and a DELETED event has the
  object, as Kubernetes' does;
* a list returns the stream's last sequence as its resourceVersion; watching from there misses nothing.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import MaxPayloadError, NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from nodus_kit import listing, measuring, replying
from nodus_kit.backingoff import Backoff
from nodus_kit.errors import AlreadyExists, Conflict, Expired, Invalid, NotFound
from nodus_kit.keying import COMPACTED_KEY, KV_OP, META_PREFIX, NODUS_OP, Page, is_marker, key_of
from nodus_kit.listing import Rows
from nodus_kit.selecting import Selector
from nodus_kit.watching import Watch
from nodus_schema.meta import now_rfc3339

EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = (10071, 10164)
ATOMIC_PUBLISH_DISABLED = 10174  # a stream without allow_atomic (declared before ADR-0034)
CREATE_SETTLE_S = 5.0
"""How long a create refused for a write no read shows yet waits for it to show (see ObjectStore.create)."""
SETTLE_BACKOFF = Backoff(base=0.005, cap=0.1)
"""The pauses between the reads of such a create: short, as the write is proposed and shows in ms."""
PUBLISH_TIMEOUT_S = 5.0  # as nats-py's JetStreamContext: a write the stream does not ack by then failed
HEADER_ROOM = 512
"""The most a write's headers take (compare-and-set, op, a batch's id and sequence: under 200 bytes), with
room to spare. nats-server bounds a message's headers and payload together by ``max_payload``; nats-py
checks the payload alone, and a message over the bound with its headers makes the server close the
connection, failing every request in flight on it. A value that leaves less room is refused before it
is sent (:func:`_fits`)."""
MAX_CREATE_BATCH = 128
"""Creates committed together at most (nats-server takes up to 1,000 messages in an atomic batch)."""
BATCHES_IN_FLIGHT = 2
"""Batches being written at once: the next one is sent while the last one syncs, so the stream is not idle
between a batch's ack and the next batch (measured on the gateway bench: 1, 2 and 4; 2 did best)."""
BATCH_ID, BATCH_SEQUENCE, BATCH_COMMIT = "Nats-Batch-Id", "Nats-Batch-Sequence", "Nats-Batch-Commit"


class Meta(Protocol):
    name: str | None
    namespace: str | None
    uid: str | None
    resource_version: str | None
    creation_timestamp: str | None
    labels: dict[str, str]


class HasMeta(Protocol):
    @property
    def metadata(self) -> Any: ...


T = TypeVar("T", bound=msgspec.Struct)


class _PubAck(msgspec.Struct):
    """JetStream's answer to a publish: the sequence the stream stored it at, or an API error."""

    seq: int = 0
    error: dict[str, Any] | None = None


_pub_ack = msgspec.json.Decoder(_PubAck)


def _fits(nc: NATS, data: bytes) -> None:
    """Raise nats-py's MaxPayloadError for a value that, with its write's headers, the server would refuse
    by closing the connection (see :data:`HEADER_ROOM`)."""
    if len(data) + HEADER_ROOM > nc.max_payload:
        raise MaxPayloadError


async def _js_publish(nc: NATS, subject: str, data: bytes, headers: dict[str, str], timeout: float) -> int:
    """``JetStreamContext.publish``, less what every write of the store paid for and never used: its
    answer read with the standard json module into a dict and then into a dataclass of eight fields
    (with this, ObjectStore.create went from ~67% to ~90% of a raw ``kv.put`` in bench/store_bench.py).
    Errors are nats-py's own."""
    try:
        msg = await replying.request(nc, subject, data, timeout=timeout, headers=headers)
    except NoRespondersError:
        raise NoStreamResponseError from None
    ack = _pub_ack.decode(msg.data)
    if ack.error is not None:
        APIError.from_error(ack.error)  # raises the error class for its code
    return ack.seq


_Create = tuple[str, bytes, "asyncio.Future[int]"]
"""A queued create: its key, its encoded object, and the future its caller awaits (the revision)."""


def _write_headers(last: int, op: str) -> dict[str, str]:
    """The headers of an ObjectStore write: compare-and-set on the key's last sequence, and the op."""
    headers = {EXPECTED_LAST_SUBJECT_SEQ: str(last), NODUS_OP: op}
    if op == "delete":
        headers[KV_OP] = "DEL"
    return headers


_CREATE_HEADERS: dict[str, str] = _write_headers(0, "create")
"""A batched create's write headers, made once: a batch member's are these plus the batch's own."""


class _BatchRefused(Exception):
    """The batch a create was in was refused as a whole (a name in it is taken, or the stream takes no
    atomic batches): nothing of it was stored, so the create is made again on its own."""


class _Creates:
    """Group commit of creates (ADR-0034): the creates that arrive while batches are being written go to
    the stream together, as ONE atomic batch (nats-server 2.12), which it stores with one disk sync instead
    of one per create. With the stack's per-write fsync (``sync_interval: always``) the sync is most of a
    write's time, so concurrent creates (the gateway under load, the binder's Attempts) are stored several
    times faster. Up to :data:`BATCHES_IN_FLIGHT` batches are written at once; a create that finds fewer
    in flight is sent at the next turn of the event loop, with whatever arrived in the same turn: nothing
    waits for company.

    A batch is all or nothing. If it is refused (a name in it is taken: JetStream's wrong-last-sequence
    check, which does not say which), each of its creates is made again on its own, so each gets its own
    answer: created, or AlreadyExists. The members' revisions are the batch's consecutive sequences."""

    def __init__(self, store: ObjectStore[Any]) -> None:
        self.store = store
        self.queue: list[_Create] = []
        self.flushers: set[asyncio.Task[None]] = set()
        self.atomic = True  # False once the stream said it takes no atomic batches
        self.batch_prefix = uuid.uuid4().hex[:16]
        self.batches = itertools.count(1)

    async def create(self, key: str, data: bytes) -> int:
        _fits(self.store.nc, data)  # one too large must not fail the batch it would be in
        if not self.atomic:
            return await self.store._publish(key, data, last=0, op="create")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.queue.append((key, data, future))
        if len(self.flushers) < BATCHES_IN_FLIGHT:
            flusher = asyncio.create_task(self._flush())
            self.flushers.add(flusher)
            flusher.add_done_callback(self.flushers.discard)
        try:
            return await future
        except _BatchRefused:
            return await self.store._publish(key, data, last=0, op="create")

    async def _flush(self) -> None:
        while self.queue:
            batch, self.queue = _unique_keys(self.queue, MAX_CREATE_BATCH)
            try:
                first = await self._commit(batch)
            except Exception as e:  # the batch's outcome is each of its creates' outcome
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            except BaseException:  # cancelled (the loop is closing): so are the creates waiting
                for _, _, future in (*batch, *self.queue):
                    future.cancel()
                raise
            for i, (_, _, future) in enumerate(batch):
                if not future.done():
                    future.set_result(first + i)

    async def _commit(self, batch: list[_Create]) -> int:
        """Write the batch; the sequence of its first create."""
        store = self.store
        if len(batch) == 1:
            key, data, _ = batch[0]
            return await store._publish(key, data, last=0, op="create")
        batch_id = f"{self.batch_prefix}-{next(self.batches)}"
        last = len(batch) - 1
        for i, (key, data, _) in enumerate(batch[:last]):
            headers = {BATCH_ID: batch_id, BATCH_SEQUENCE: str(i + 1), **_CREATE_HEADERS}
            await store.nc.publish(store.prefix + key, data, headers=headers)
        key, data, _ = batch[last]
        headers = {
            BATCH_ID: batch_id,
            BATCH_SEQUENCE: str(last + 1),
            BATCH_COMMIT: "1",
            **_CREATE_HEADERS,
        }
        try:
            seq = await _js_publish(store.nc, store.prefix + key, data, headers, PUBLISH_TIMEOUT_S)
        except APIError as e:
            if e.err_code == ATOMIC_PUBLISH_DISABLED:
                self.atomic = False
                raise _BatchRefused from e
            if e.err_code in WRONG_LAST_SEQUENCE:
                raise _BatchRefused from e
            raise
        store._writes["create"].inc(len(batch))
        return seq - last


def _unique_keys(queue: list[_Create], most: int) -> tuple[list[_Create], list[_Create]]:
    """The next batch (at most ``most`` creates, no key twice: JetStream refuses a batch that writes one
    subject twice) and what stays queued, in arrival order. Creates whose caller is gone are dropped."""
    batch: list[_Create] = []
    rest: list[_Create] = []
    keys: set[str] = set()
    for item in queue:
        key, _, future = item
        if future.done():
            continue
        if len(batch) < most and key not in keys:
            keys.add(key)
            batch.append(item)
        else:
            rest.append(item)
    return batch, rest


class ObjectStore(Generic[T]):
    """Typed CRUD + list + watch over one bucket. Safe to share between tasks."""

    def __init__(self, nc: NATS, bucket: str, typ: type[T], *, direct_reads: bool | None = None) -> None:
        """``direct_reads``: None reads a replicated bucket through its stream leader (see
        :meth:`_get_last`); True always reads with a key-scoped direct get, for a credential allowed only
        the keys it names (a node agent's, ADR-0026), accepting that a follower may answer a little late."""
        self.nc = nc
        self.direct_reads = direct_reads
        self.js: JetStreamContext = nc.jetstream()
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self.prefix = f"$KV.{bucket}."
        self.typ = typ
        self._decoder = msgspec.json.Decoder(typ)
        self._encoder = msgspec.json.Encoder()
        self._writes, self._conflicts = measuring.store_meters(bucket)
        self._creates = _Creates(self)
        self._held = listing.Held()

    # -- encoding -----------------------------------------------------------------------------------
    def _encode(self, obj: T) -> bytes:
        # resourceVersion is the revision of the write itself, so it never goes into the stored value.
        meta = msgspec.structs.replace(_meta(obj), resource_version=None)
        return self._encoder.encode(msgspec.structs.replace(obj, metadata=meta))

    def decode(self, data: bytes, revision: int) -> T:
        """An object as stored, with its revision as resourceVersion."""
        obj = self._decoder.decode(data)
        # Just decoded, so ours alone: stamped in place, not copied twice (every watch event, list item
        # and get comes through here).
        _meta(obj).resource_version = str(revision)
        return obj

    # -- reads --------------------------------------------------------------------------------------
    async def get(self, namespace: str | None, name: str) -> T:
        msg = await self._last(key_of(namespace, name))
        if msg is None:
            raise NotFound(f"{self.bucket} {namespace}/{name} not found")
        return self.decode(msg.data, msg.seq)

    async def _last(self, key: str) -> Any:
        try:
            msg = await self._get_last(self.prefix + key)
        except NotFoundError:
            return None
        if is_marker(msg.headers):
            return None
        return msg

    async def _get_last(self, subject: str) -> Any:
        """The last message on ``subject``, read so that a write acknowledged before is always seen.

        A direct get is the cheap read (no JSON envelope, no base64), but on a replicated stream any
        replica answers it, and a follower that has not applied the latest write yet answers with the
        old value, or NotFound for an object just created (seen in tests/cluster: a create refused as
        AlreadyExists, then a get of it NotFound). So a stream with more than one replica is read through
        its leader (``$JS.API.STREAM.MSG.GET``), one with one replica directly."""
        direct = self.direct_reads or await _direct_reads_are_current(self.nc, self.js, self.stream)
        return await self.js.get_msg(self.stream, subject=subject, direct=direct)

    # -- writes -------------------------------------------------------------------------------------
    async def create(self, obj: T) -> T:
        """Store a new object; :class:`AlreadyExists` if the name is taken."""
        meta = _meta(obj)
        if not meta.name:
            raise ValueError("metadata.name is required to store an object")
        # One replace does both the stamping and what _encode would (no resourceVersion in the value);
        # the returned object gets its resourceVersion from the write below.
        stamped = msgspec.structs.replace(
            meta,
            uid=meta.uid or str(uuid.uuid4()),
            creation_timestamp=meta.creation_timestamp or now_rfc3339(),
            resource_version=None,
        )
        obj = msgspec.structs.replace(obj, metadata=stamped)
        key = key_of(meta.namespace, meta.name)
        data = self._encoder.encode(obj)
        try:
            seq = await self._creates.create(key, data)
        except Conflict:
            seq = await self._create_over_history(key, data, meta)
        return self._with_rv(obj, seq)

    async def _create_over_history(self, key: str, data: bytes, meta: Any) -> int:
        """A create refused because the subject has history: either a live object (AlreadyExists) or a
        delete marker, which a create may replace (compare-and-set on the marker's revision, as nats-py's
        kv.create does).

        A replicated stream's leader checks a write against the writes it has proposed, not only those
        applied, so a create can be refused for another's create that no read shows yet (seen in
        tests/cluster: AlreadyExists, then NotFound from a get). The reads are repeated until they show
        the object, for up to :data:`CREATE_SETTLE_S`, so that after AlreadyExists a get finds it."""
        taken = AlreadyExists(f"{self.bucket} {meta.namespace}/{meta.name} already exists")
        end = time.monotonic() + CREATE_SETTLE_S
        pauses = SETTLE_BACKOFF.pauses()
        while True:
            marker = await self._marker_revision(key)
            if marker is None:
                raise taken from None  # not "during handling of" the Conflict that brought us here
            try:
                return await self._publish(key, data, last=marker, op="create")
            except Conflict:
                if time.monotonic() >= end:
                    raise taken from None
            # Someone's write is proposed but not yet readable: read again shortly.
            await asyncio.sleep(next(pauses))

    async def _marker_revision(self, key: str) -> int | None:
        try:
            msg = await self._get_last(self.prefix + key)
        except NotFoundError:
            return 0
        if is_marker(msg.headers):
            return int(msg.seq or 0)
        return None

    async def update(self, obj: T) -> T:
        """Compare-and-set on ``metadata.resourceVersion``; :class:`Conflict` if someone wrote first."""
        meta = _meta(obj)
        if not meta.resource_version:
            raise ValueError("update needs metadata.resourceVersion (read the object first)")
        key = key_of(meta.namespace, meta.name)
        try:
            seq = await self._publish(key, self._encode(obj), last=int(meta.resource_version), op="update")
        except Conflict:
            if await self._last(key) is None:
                raise NotFound(f"{self.bucket} {meta.namespace}/{meta.name} not found") from None
            raise
        return self._with_rv(obj, seq)

    async def mutate(
        self, namespace: str | None, name: str, change: Callable[[T], T | None], *, seen: T | None = None
    ) -> T:
        """Read-modify-write with retries on conflict; ``change`` returning None means no write.

        ``seen``: a copy already held (an informer's) to try first, by compare-and-set on its revision: an
        object nobody wrote since costs one write and no read, and a conflict reads it fresh as before. A
        change that ``seen`` makes a no-op is not checked against the store."""
        current = seen if seen is not None and _meta(seen).resource_version else None
        while True:
            if current is None:
                current = await self.get(namespace, name)
            wanted = change(current)
            if wanted is None or wanted == current:
                return current
            try:
                return await self.update(wanted)
            except Conflict:
                current = None

    async def delete(self, namespace: str | None, name: str, *, resource_version: str | None = None) -> T:
        """Delete, leaving a marker that carries the last state (for DELETED watch events)."""
        while True:
            current = await self.get(namespace, name)
            if resource_version and current_rv(current) != resource_version:
                raise Conflict(
                    f"{self.bucket} {namespace}/{name} is at resourceVersion {current_rv(current)}, "
                    f"not {resource_version}"
                )
            meta = _meta(current)
            final = msgspec.structs.replace(
                current,
                metadata=msgspec.structs.replace(
                    meta, deletion_timestamp=meta.deletion_timestamp or now_rfc3339()
                ),
            )
            try:
                seq = await self._publish(
                    key_of(namespace, name), self._encode(final), last=int(current_rv(current)), op="delete"
                )
            except Conflict:
                if resource_version:
                    raise
                continue
            return self._with_rv(final, seq)

    async def _publish(self, key: str, data: bytes, *, last: int, op: str) -> int:
        _fits(self.nc, data)
        headers = _write_headers(last, op)
        try:
            seq = await _js_publish(self.nc, self.prefix + key, data, headers, PUBLISH_TIMEOUT_S)
        except APIError as e:
            if e.err_code in WRONG_LAST_SEQUENCE:
                self._conflicts.inc()
                raise Conflict(f"{self.bucket} {key} changed since revision {last}") from e
            raise
        self._writes[op].inc()
        return seq

    def _with_rv(self, obj: T, seq: int) -> T:
        meta = msgspec.structs.replace(_meta(obj), resource_version=str(seq))
        return msgspec.structs.replace(obj, metadata=meta)

    # -- list ---------------------------------------------------------------------------------------
    async def last_revision(self) -> int:
        info = await self.js.stream_info(self.stream)
        return int(info.state.last_seq)

    async def list(
        self,
        namespace: str | None = None,
        *,
        selector: Selector | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> Page[T]:
        """Objects sorted by key; ``limit`` + ``continue`` page through them, as Kubernetes does. The rows
        after a page are kept for its token (:mod:`nodus_kit.listing`): the walk reads the store once."""
        after = _decode_continue(continue_token) if continue_token else None
        scope = (namespace, selector)
        held = self._held.get(scope, continue_token) if continue_token else None
        if held is not None:
            rows, start, rv = held.rows, held.start, held.revision
        else:
            rv = await self.last_revision()
            if after is not None and after[1] < rv:
                rv = after[1]  # later pages report the first page's revision, as a consistent list would
            rows, start = await self._rows(namespace, selector, after[0] if after else None), 0
        end = len(rows) if limit is None else min(len(rows), start + limit)
        page = [self.decode(data, seq) for _, data, seq in rows[start:end]]
        if end == len(rows):
            if limit is not None:
                self._held.release(rows)  # the walk is over
            return Page(page, rv, None, None)
        token = _encode_continue(rows[end - 1][0], rv)
        self._held.put(scope, token, rows, end, rv)
        return Page(page, rv, token, len(rows) - end)

    async def _rows(self, namespace: str | None, selector: Selector | None, after: str | None) -> Rows:
        """The live objects after key ``after`` that the selector matches, sorted by key, undecoded."""
        rows: Rows = []
        async for key, msg in self._latest(namespace):
            if (after is None or key > after) and listing.selected(msg.data, selector):
                rows.append((key, msg.data, msg.metadata.sequence.stream))
        rows.sort(key=lambda row: row[0])
        return rows

    async def _latest(self, namespace: str | None) -> AsyncIterator[tuple[str, Any]]:
        """The latest live message of every key (an ordered consumer, last-per-subject)."""
        subject = self.prefix + (f"{namespace}.>" if namespace else ">")
        sub = await self.js.subscribe(
            subject,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, headers_only=False),
        )
        try:
            async for msg in _until_caught_up(sub):
                key = msg.subject[len(self.prefix) :]
                if key.startswith(META_PREFIX) or is_marker(msg.headers):
                    continue
                yield key, msg
        finally:
            await sub.unsubscribe()

    # -- watch --------------------------------------------------------------------------------------
    def watch(
        self,
        namespace: str | None = None,
        *,
        resource_version: int | None = None,
        name: str | None = None,
    ) -> Watch[T]:
        """Events after ``resource_version``; with None, first the current objects as ADDED (as kubectl
        expects from a watch without a resourceVersion). See :mod:`nodus_kit.watching`."""
        return Watch(self, namespace=namespace, resource_version=resource_version, name=name)

    async def compacted_revision(self) -> int:
        try:
            msg = await self._get_last(self.prefix + COMPACTED_KEY)
        except NotFoundError:
            return 0
        return int(msg.data or b"0")

    async def check_not_expired(self, resource_version: int) -> None:
        """410 Gone when a watch from ``resource_version`` could miss a change.

        Revisions superseded by a later write of the same key are dropped at once (history 1, like an
        etcd compaction that keeps the latest revision of every key): a watch still delivers the latest
        state of every object changed after ``resource_version``, which is all a level-triggered reader
        needs. What a watcher could really miss is a delete marker removed by :meth:`compact`, so the
        compacted revision is the horizon: older resourceVersions get 410.
        """
        compacted = await self.compacted_revision()
        if resource_version < compacted:
            raise Expired(
                f"resourceVersion {resource_version} is older than the compacted revision {compacted}: "
                "list again and watch from the list's resourceVersion"
            )

    async def compact(self, older_than_s: float = 3600.0) -> int:
        """Remove delete markers older than ``older_than_s`` and record the compacted revision, so a
        watcher that could have missed one of them gets 410 instead of silently losing a DELETED."""
        cutoff = time.time() - older_than_s
        subject = self.prefix + ">"
        sub = await self.js.subscribe(
            subject,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT),
        )
        purge: list[tuple[str, int]] = []
        try:
            async for msg in _until_caught_up(sub):
                if is_marker(msg.headers) and msg.metadata.timestamp.timestamp() <= cutoff:
                    purge.append((msg.subject, int(msg.metadata.sequence.stream)))
        finally:
            await sub.unsubscribe()
        if not purge:
            return 0
        horizon = max(seq for _, seq in purge)
        await self.js.publish(
            self.prefix + COMPACTED_KEY, str(max(horizon, await self.compacted_revision())).encode()
        )
        for subj, _ in purge:
            await self.js.purge_stream(self.stream, subject=subj)
        return len(purge)


async def _until_caught_up(sub: Any) -> AsyncIterator[Any]:
    """Messages of a fresh ordered consumer until the one that says nothing more is pending.

    The consumer's info alone cannot tell when to stop: by the time it answers, the server may have
    pushed messages already, which ``num_pending`` no longer counts. Delivered + pending says whether
    there is anything at all; each message's own ``num_pending`` says when it was the last.
    """
    info = await sub.consumer_info()
    if int(info.num_pending) + int(info.delivered.consumer_seq) == 0:
        return
    while True:
        msg = await sub.next_msg(timeout=10)
        yield msg
        if int(msg.metadata.num_pending) == 0:
            return


_REPLICATED: weakref.WeakKeyDictionary[NATS, dict[str, bool]] = weakref.WeakKeyDictionary()


async def _direct_reads_are_current(nc: NATS, js: JetStreamContext, stream: str) -> bool:
    """Whether ``stream`` has one replica (its direct gets come from the leader alone), asked once per
    connection and stream: replicas are set when the stream is declared and do not change under a
    running process (a restart asks again)."""
    known = _REPLICATED.setdefault(nc, {})
    if stream not in known:
        info = await js.stream_info(stream)
        known[stream] = (info.config.num_replicas or 1) <= 1
    return known[stream]


def _meta(obj: Any) -> Any:
    return obj.metadata


def current_rv(obj: Any) -> str:
    return str(obj.metadata.resource_version)


def _encode_continue(key: str, rv: int) -> str:
    raw = msgspec.json.encode({"k": key, "rv": rv})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[str, int]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data: Mapping[str, Any] = msgspec.json.decode(raw)
        return str(data["k"]), int(data["rv"])
    except Exception as e:
        raise Invalid(f"continue token {token!r} is not one this server issued: list again without it") from e
