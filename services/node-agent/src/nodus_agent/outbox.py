"""The agent's outbox: reports survive a bus outage and an agent restart, and leave in the order made.

Every report (AttemptStarted, AttemptProgress, AttemptFinished, checkpoint and throughput reports) is
first appended to a journal on the node's disk with its subject and deterministic ``Nats-Msg-Id``, and
fsynced; only then does the caller go on. One sender task publishes the journal's entries oldest first,
one at a time, and removes an entry only once the stream has acknowledged it. So:

* while NATS is unreachable the running work goes on and reports pile up on disk, not in memory;
* when the bus is back (or the agent restarts and opens the journal again) they go out **in order**;
* a report sent twice (acknowledged, but the agent died before recording the ack) carries the same id:
  the stream drops the copy inside its duplicate window, and readers are idempotent beyond it.

Bounded: an entry may name a coalescing *key* (progress reports use one key per attempt). A new entry
with a key replaces the older pending entries of that key (all but the newest ``keep_per_key``), so a
day-long outage leaves one progress report per attempt, not 86,400. Entries without a key (Started,
Finished) are never dropped. The file itself is compacted (rewritten with only the pending entries)
once acknowledged and replaced entries outnumber the pending ones.

The journal (``<workdir>/_outbox/journal.jsonl``; ``_`` keeps it apart from namespaces, which are DNS
labels) is JSON lines, readable with ``cat``::

    {"op":"put","seq":7,"subject":"nodus.report.n1.team-a.a1","msgId":"team-a/a1:started","data":{...}}
    {"op":"ack","seq":7}

A put is fsynced before :meth:`Outbox.append` returns; an ack is written but not fsynced: a lost ack only
means the entry is sent again after a crash, with the same id. A torn last line (the agent killed
mid-write) is ignored when the journal is opened. A lock on the directory keeps a second agent on the
same work directory from interleaving its writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from nodus_kit import tracing
from nodus_kit.backingoff import Backoff
from nodus_kit.messaging import MSG_ID

log = logging.getLogger(__name__)

OUTBOX_DIR = "_outbox"
JOURNAL = "journal.jsonl"
LOCK = "lock"
PUBLISH_TIMEOUT_S = 2.0
SEND_BACKOFF = Backoff(base=0.1, cap=2.0)  # jittered: agents that lost the bus together spread out
RECONNECT_POLL_S = 0.25  # how often a sender that sees no connection looks again
COMPACT_AFTER = 512  # dead lines (acked or replaced entries) before the journal is rewritten
# Errors no retry can fix: the entry is dropped with an error log, so one bad entry never blocks the rest.
_PERMANENT = (nats.errors.MaxPayloadError, nats.errors.BadSubjectError)


class Put(msgspec.Struct, tag="put", tag_field="op", rename="camel", omit_defaults=True, kw_only=True):
    """One report to send: where, its message id, its JSON body, and its coalescing key if any."""

    seq: int
    subject: str
    msg_id: str
    data: msgspec.Raw
    key: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """Trace context and request id of the code that made the report (the sender task has none)."""


class Ack(msgspec.Struct, tag="ack", tag_field="op"):
    seq: int


_encoder = msgspec.json.Encoder()
_line_decoder: msgspec.json.Decoder[Put | Ack] = msgspec.json.Decoder(Put | Ack)


def outbox_dir(workdir: Path) -> Path:
    """Where an agent with this work directory keeps its outbox."""
    return workdir / OUTBOX_DIR


class OutboxBusy(RuntimeError):
    """Another process holds the outbox of this work directory."""


@dataclass
class _State:
    """What the journal holds, rebuilt from its lines: pending entries by seq, and the dead-line count."""

    pending: dict[int, Put]
    next_seq: int
    dead: int


def replay(lines: Iterable[bytes], keep_per_key: int) -> _State:
    """The pending entries a journal's lines leave (puts less acks, keys coalesced); pure, for tests too."""
    state = _State(pending={}, next_seq=1, dead=0)
    for raw in lines:
        if not raw.endswith(b"\n"):
            state.dead += 1  # torn by a crash mid-write: never acknowledged to its caller
            continue
        try:
            line = _line_decoder.decode(raw)
        except msgspec.DecodeError as e:
            log.error("outbox: skipping an unreadable journal line (%s): %r", e, raw[:200])
            state.dead += 1
            continue
        if isinstance(line, Ack):
            state.dead += 2 if state.pending.pop(line.seq, None) is not None else 1
            continue
        state.next_seq = max(state.next_seq, line.seq + 1)
        state.dead += len(_coalesce(state.pending, line.key, keep_per_key))
        state.pending[line.seq] = line
    return state


def _coalesce(pending: dict[int, Put], key: str | None, keep: int) -> list[Put]:
    """Remove (and return) the oldest pending entries of ``key`` so that ``keep - 1`` remain beside the
    new one. One being published may still reach the stream: it is older, so the order holds."""
    if key is None:
        return []
    same = [e for e in pending.values() if e.key == key]
    dropped = same[: max(0, len(same) - (keep - 1))]
    for e in dropped:
        del pending[e.seq]
    return dropped


class Outbox:
    """The journal and its sender. :meth:`open`, :meth:`start` with a connection, :meth:`close`."""

    def __init__(self, directory: Path, *, keep_per_key: int = 1, compact_after: int = COMPACT_AFTER) -> None:
        """Use :meth:`open`, which reads the journal without blocking the event loop."""
        if keep_per_key < 1:
            raise ValueError(f"keep_per_key={keep_per_key} must be at least 1")
        self.directory = directory
        self.path = directory / JOURNAL
        self.keep_per_key, self.compact_after = keep_per_key, compact_after
        self._pending: dict[int, Put] = {}  # by seq; dicts keep insertion order, which is seq order
        self._by_id: dict[str, int] = {}
        self._next_seq = 1
        self._dead = 0
        self._sent_through = 0
        self._file: IO[bytes] | None = None
        self._lock_file: IO[bytes] | None = None
        self._io = asyncio.Lock()  # one writer of the file at a time, in seq order
        self._changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._nc: NATS | None = None
        self.sent = 0
        """Entries acknowledged by the stream since this outbox was opened (duplicates included)."""

    # -- opening and closing ------------------------------------------------------------------------
    @classmethod
    async def open(
        cls, directory: Path, *, keep_per_key: int = 1, compact_after: int = COMPACT_AFTER
    ) -> Outbox:
        """Open (or create) the outbox in ``directory``: read what an earlier agent left, rewrite the
        journal without its acknowledged or torn lines. Raises :class:`OutboxBusy` if another process
        has it open."""
        box = cls(directory, keep_per_key=keep_per_key, compact_after=compact_after)
        await asyncio.to_thread(box._open_sync)
        if box._pending:
            log.info("outbox: %d reports left by an earlier agent will be sent", len(box._pending))
        return box

    def _open_sync(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        lock = (self.directory / LOCK).open("ab")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise OutboxBusy(
                f"{self.directory} is used by another process: two node agents cannot share a work "
                "directory; give each its own NODUS_AGENT_WORKDIR"
            ) from None
        self._lock_file = lock
        try:
            with self.path.open("rb") as f:
                state = replay(f, self.keep_per_key)
        except FileNotFoundError:
            state = _State(pending={}, next_seq=1, dead=0)
        self._pending, self._next_seq = state.pending, state.next_seq
        self._by_id = {e.msg_id: e.seq for e in self._pending.values()}
        self._rewrite_sync()

    def start(self, nc: NATS) -> Outbox:
        """Start the sender on ``nc`` (a connection that reconnects by itself, as ``connecting.connect``)."""
        if self._sender is not None:
            raise RuntimeError("the outbox sender already runs")
        self._nc = nc
        self._sender = asyncio.create_task(self._send_loop(), name=f"outbox:{self.directory}")
        return self

    async def close(self, drain_s: float = 0.0) -> None:
        """Stop the sender, after up to ``drain_s`` seconds of sending what is pending; what is left
        stays in the journal for the next agent."""
        if drain_s > 0 and self._sender is not None:
            await self.drain(drain_s)
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None
        async with self._io:
            await asyncio.to_thread(self._close_files)

    def _close_files(self) -> None:
        for f in (self._file, self._lock_file):
            if f is not None:
                f.close()  # closing the lock's file releases the flock
        self._file = self._lock_file = None

    # -- appending ----------------------------------------------------------------------------------
    async def append(self, subject: str, message: Any, *, msg_id: str, key: str | None = None) -> int:
        """Add a report; returns once it is on disk (fsynced), with its sequence number for
        :meth:`wait_sent`. A ``msg_id`` already pending is not added twice (its seq is returned)."""
        data = msgspec.Raw(_encoder.encode(message))
        headers = tracing.inject({})
        async with self._io:
            if self._file is None:
                raise RuntimeError("the outbox is closed")
            known = self._by_id.get(msg_id)
            if known is not None:
                return known
            entry = Put(
                seq=self._next_seq, subject=subject, msg_id=msg_id, data=data, key=key, headers=headers
            )
            line = _encoder.encode(entry) + b"\n"
            await asyncio.to_thread(self._write_sync, line, True)
            self._next_seq += 1
            for gone in _coalesce(self._pending, key, self.keep_per_key):
                self._by_id.pop(gone.msg_id, None)
                self._dead += 1
            self._pending[entry.seq] = entry
            self._by_id[msg_id] = entry.seq
            await self._maybe_compact()
        self._wake.set()
        return entry.seq

    async def wait_sent(self, seq: int) -> None:
        """Until the entry ``seq`` (or a newer one that replaced it) was acknowledged by the stream."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._sent_through >= seq)

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every pending entry to be sent; True if none is left."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait_for(lambda: not self._pending)
            except TimeoutError:
                return False
        return True

    @property
    def pending(self) -> list[Put]:
        """The entries not yet acknowledged, oldest first."""
        return list(self._pending.values())

    # -- the file -----------------------------------------------------------------------------------
    def _write_sync(self, line: bytes, durable: bool) -> None:
        assert self._file is not None
        self._file.write(line)
        self._file.flush()
        if durable:
            os.fsync(self._file.fileno())

    async def _maybe_compact(self) -> None:
        """Rewrite the journal once dead lines outnumber the pending entries (called holding ``_io``)."""
        if self._dead >= self.compact_after and self._dead >= len(self._pending):
            await asyncio.to_thread(self._rewrite_sync)

    def _rewrite_sync(self) -> None:
        """Write-then-rename, fsynced: a crash leaves the old journal or the new one, never half of one."""
        tmp = self.path.with_suffix(".jsonl.tmp")
        with tmp.open("wb") as f:
            f.write(b"".join(_encoder.encode(e) + b"\n" for e in self._pending.values()))
            f.flush()
            os.fsync(f.fileno())
        if self._file is not None:
            self._file.close()
        os.replace(tmp, self.path)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a power loss
        finally:
            os.close(dir_fd)
        self._file = self.path.open("ab")
        self._dead = 0

    # -- sending ------------------------------------------------------------------------------------
    async def _send_loop(self) -> None:
        assert self._nc is not None
        js = self._nc.jetstream()
        failures = 0
        while True:
            await self._wait_pending()
            if not self._nc.is_connected:
                # Publishing now would only fill the client's reconnect buffer; the journal is the buffer.
                await asyncio.sleep(RECONNECT_POLL_S)
                continue
            entry = next(iter(self._pending.values()))  # the oldest
            headers = {**entry.headers, MSG_ID: entry.msg_id}
            try:
                ack = await js.publish(
                    entry.subject, bytes(entry.data), timeout=PUBLISH_TIMEOUT_S, headers=headers
                )
            except _PERMANENT as e:
                log.error("outbox: dropping report %s, which no retry can send: %s", entry.msg_id, e)
                await self._acked(entry)
                continue
            except Exception as e:  # unreachable, timed out, no stream yet: the same entry again, later
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning(
                        "outbox: report %s not acknowledged (%s: %s); %d pending, retrying",
                        entry.msg_id,
                        type(e).__name__,
                        e,
                        len(self._pending),
                    )
                await asyncio.sleep(SEND_BACKOFF.delay(failures))
                continue
            if failures:
                log.info("outbox: sending again after %d failed tries", failures)
            failures = 0
            if ack.duplicate:
                log.debug("outbox: %s was already stored (a re-send)", entry.msg_id)
            await self._acked(entry)

    async def _wait_pending(self) -> None:
        while not self._pending:
            self._wake.clear()
            await self._wake.wait()

    async def _acked(self, entry: Put) -> None:
        async with self._io:
            if self._pending.pop(entry.seq, None) is not None:
                self._by_id.pop(entry.msg_id, None)
                self.sent += 1
                if self._file is not None:
                    self._write_sync(_encoder.encode(Ack(entry.seq)) + b"\n", False)
                    self._dead += 2
                    await self._maybe_compact()
        async with self._changed:
            self._sent_through = max(self._sent_through, entry.seq)
            self._changed.notify_all()
