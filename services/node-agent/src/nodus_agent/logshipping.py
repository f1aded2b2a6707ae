"""Log shipping: an attempt's ``log.txt`` to ``nodus.logs.<node>.<namespace>.<job>.<attempt>`` (NODUS_LOGS).

A :class:`LogShipper` tails the file every ``interval_s`` and publishes what was appended as
:class:`LogLines` batches (at most ``max_lines`` lines or about ``max_bytes`` of JSON each, and at most
``bytes_per_s`` of the file per second: a program that logs faster falls behind, never floods the bus).

Lines come in two shapes. The container runtime writes ``<RFC 3339 time> <stdout|stderr> <text>``; the
process runtime writes the program's bytes as they are (stdout and stderr merged), and such a line gets
the time it was read. A line longer than ``max_line`` bytes is cut into pieces (never inside a UTF-8
character or a secret value). A last line without its newline waits for it, until :meth:`close`.

**Secrets.** The runner passes the values of the Job's secrets; every occurrence in a line becomes
``***`` before the line leaves the node (each line of a multi-line value is masked too, as GitHub
Actions masks them). A value split across a forced cut is kept whole by moving the cut. Values a
program transforms (base64, JSON escapes) are not recognised.

**Resumable, exactly once inside the duplicate window.** A cursor file beside the log
(``log.cursor``: ``{"offset": N}``) says how far the log was shipped. Before a batch is published the
cursor records its end as ``pending``; after the stream acknowledged it, ``offset`` moves to that end.
A shipper started after a crash first sends the pending range again, byte for byte the same batch under
the same id (``<ns>/<attempt>:log:<start>-<end>``), which the stream drops if it already has it. Only a
cursor lost altogether (a power loss before the page cache was written) can ship lines twice; none is
ever skipped, except past the drain deadline of :meth:`close`, and then a line in the log says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from nodus_kit import tracing
from nodus_kit.backingoff import Backoff
from nodus_kit.messaging import MSG_ID
from nodus_schema.messages import AttemptMessage, LogLine, LogLines

log = logging.getLogger(__name__)

STREAM = "NODUS_LOGS"
SUBJECT_PREFIX = "nodus.logs"
CURSOR = "log.cursor"
MASK = "***"
PUBLISH_TIMEOUT_S = 5.0
# Jittered, so that the agents that lost the bus together do not all come back in the same instant.
SHIP_BACKOFF = Backoff(base=0.25, cap=5.0)
DRAIN_BACKOFF = Backoff(base=0.1, cap=2.0)  # shorter: a drain has a deadline

# <time> <stream> <text>: the container runtime's format (the time is RFC 3339, with or without a fraction).
_RUNTIME_LINE = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr)(?: (.*))?", re.DOTALL
)


# The wire types (LogLine, LogLines) are nodus_schema.messages'.


def log_subject(node: str, namespace: str, job: str, attempt: str) -> str:
    """``nodus.logs.<node>.<ns>.<job>.<attempt>``: the node first, as on reports, so the bus lets an
    agent ship only its own node's lines and the gateway can tell a line from another node (ADR-0026)."""
    return f"{SUBJECT_PREFIX}.{node}.{namespace}.{job}.{attempt}"


def subject_of(source: AttemptMessage) -> str:
    """The subject of a run's log batches (``source``: its StartAttempt, or one of the batches)."""
    return log_subject(source.node, source.namespace, source.job, source.attempt)


@dataclass(frozen=True, slots=True)
class Limits:
    max_lines: int = 1000
    max_bytes: int = 64 * 1024
    """Of one batch's encoded lines; a single line may pass it (up to max_line, escaped)."""
    interval_s: float = 0.5
    bytes_per_s: int = 1024 * 1024
    """Of the log file shipped per second and attempt."""
    max_line: int = 16 * 1024
    """Longer lines are cut into pieces of at most this many bytes."""

    @property
    def budget(self) -> int:
        """Bytes of the file one tick may ship (at least one whole line's worth)."""
        return max(int(self.bytes_per_s * self.interval_s), self.max_line)


# -- redaction ----------------------------------------------------------------------------------------------
class Redactor:
    """Masks secret values in text, longest value first, in one pass."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values: set[str] = set()
        for s in secrets:
            if not s:
                continue
            values.add(s)
            if "\n" in s:  # a multi-line value (a key, a certificate) reaches the log one line at a time
                values.update(part.rstrip("\r") for part in s.split("\n") if part.strip())
        self.values = sorted(values, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in self.values)) if self.values else None
        self._raw = [v.encode() for v in self.values]
        self.longest = max((len(v) for v in self._raw), default=0)

    def __call__(self, text: str) -> str:
        return self._pattern.sub(MASK, text) if self._pattern is not None else text

    def safe_cut(self, data: bytes, p: int, lo: int = 0, hi: int | None = None) -> int:
        """A cut at or before ``p`` (and after ``lo``) that splits neither a UTF-8 character nor a secret
        value found in ``data[lo:hi]`` (one line: what a re-read of the same line sees too)."""
        hi = len(data) if hi is None else hi
        moved = True
        while moved and p > lo:
            moved = False
            for v in self._raw:
                start = data.find(v, max(lo, p - len(v) + 1), min(hi, p + len(v) - 1))
                if 0 <= start < p < start + len(v):
                    p, moved = start, True
            while lo < p < hi and data[p] & 0xC0 == 0x80:  # a UTF-8 continuation byte
                p -= 1
        return p


# -- cutting and parsing (pure) -----------------------------------------------------------------------------
def cut_lines(data: bytes, *, final: bool, max_line: int, redactor: Redactor) -> list[tuple[int, bytes]]:
    """Complete lines of ``data`` as ``(end offset in data, bytes without the newline)``.

    A line with no newline yet is left for later unless ``final``, or unless it is already too long, in
    which case pieces of it are cut off. Deterministic in the bytes it is given, so reading the same range
    again yields the same lines (what makes a re-sent batch identical).
    """
    out: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        stop = nl if nl >= 0 else len(data)
        # Cut pieces off while the rest is too long, and while the cut can be judged (the bytes after it).
        while stop - pos > max_line and (nl >= 0 or final or len(data) - pos >= max_line + redactor.longest):
            cut = redactor.safe_cut(data, pos + max_line, pos, stop)
            if cut <= pos:  # a secret longer than a line: cut just after it rather than inside it
                cut = min(stop, pos + max(max_line, redactor.longest))
            out.append((cut, data[pos:cut]))
            pos = cut
        if nl >= 0:
            out.append((nl + 1, data[pos:nl]))
            pos = nl + 1
        elif final and pos < len(data):
            out.append((len(data), data[pos:]))
            pos = len(data)
        else:
            break
    return out


def parse_line(raw: bytes, read_time: str, redactor: Redactor) -> LogLine:
    """One line as it goes on the bus: the runtime's time and stream if it wrote them, secrets masked."""
    text = raw.decode("utf-8", errors="replace")
    if text.endswith("\r"):
        text = text[:-1]
    m = _RUNTIME_LINE.fullmatch(text)
    if m:
        return LogLine(time=m[1], stream=m[2], text=redactor(m[3] or ""))
    return LogLine(time=read_time, text=redactor(text))


def now_rfc3339() -> str:
    """The current UTC time with microseconds (``2025-01-02T03:04:05.123456Z``)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


_encoder = msgspec.json.Encoder()


@dataclass(slots=True)
class Batch:
    start: int
    end: int
    lines: list[LogLine] = field(default_factory=list)


def batches(
    lines: list[tuple[int, bytes]], base: int, limits: Limits, redactor: Redactor, read_time: str
) -> list[Batch]:
    """Group lines (ends relative to ``base``) into batches within the limits, in order."""
    out: list[Batch] = []
    current: Batch | None = None
    size = 0
    start = base
    for end, raw in lines:
        line = parse_line(raw, read_time, redactor)
        cost = len(_encoder.encode(line)) + 1
        if current is None or len(current.lines) >= limits.max_lines or size + cost > limits.max_bytes:
            current, size = Batch(start, start), 0
            out.append(current)
        current.lines.append(line)
        current.end = base + end
        size += cost
        start = base + end
    return out


# -- the cursor ---------------------------------------------------------------------------------------------
class Cursor(msgspec.Struct, omit_defaults=True):
    offset: int = 0
    """Bytes of the log shipped and acknowledged."""
    pending: int | None = None
    """The end of the batch being published (from ``offset``): re-sent as it is after a crash."""


_cursor_decoder = msgspec.json.Decoder(Cursor)


def load_cursor(path: Path) -> Cursor:
    try:
        return _cursor_decoder.decode(path.read_bytes())
    except FileNotFoundError:
        return Cursor()
    except msgspec.DecodeError as e:
        # Torn by a power loss: shipping again from the start duplicates lines, skipping would lose them.
        log.warning("unreadable log cursor %s (%s): shipping the log from its start", path, e)
        return Cursor()


def save_cursor(path: Path, cursor: Cursor) -> None:
    """Write-then-rename (not fsynced: a stale cursor after a power loss only re-ships lines)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(_encoder.encode(cursor))
    os.replace(tmp, path)


def _read(path: Path, offset: int, size: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(size)
    except FileNotFoundError:
        return b""


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# -- the shipper --------------------------------------------------------------------------------------------
class LogShipper:
    """Ships one attempt's log: :meth:`start` when the program starts, :meth:`close` when it has ended."""

    def __init__(
        self,
        nc: NATS,
        source: AttemptMessage,
        log_path: Path,
        *,
        cursor_path: Path | None = None,
        secrets: Iterable[str] = (),
        limits: Limits | None = None,
    ) -> None:
        """``nc``: the agent's connection (it reconnects by itself); while it is down nothing is published
        (the client's reconnect buffer would only fill with copies of one batch). ``source``: whose log it
        is (the run's StartAttempt): what every batch says about its attempt."""
        self.nc, self.js, self.source, self.log_path = nc, nc.jetstream(), source, log_path
        self.cursor_path = cursor_path or log_path.with_name(CURSOR)
        self.redactor = Redactor(secrets)
        self.limits = limits or Limits()
        self.cursor: Cursor | None = None
        self.published = 0
        """Batches acknowledged by the stream (duplicates of a re-send included)."""
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one shipping pass at a time (the loop's, or close's)

    async def start(self) -> LogShipper:
        """Ship in the background every ``interval_s`` until :meth:`close`."""
        self._task = asyncio.create_task(
            self._loop(), name=f"logs:{self.source.namespace}/{self.source.attempt}"
        )
        return self

    async def close(self, *, final: bool = True, drain_s: float = 10.0) -> bool:
        """Stop the loop; with ``final`` (the program has ended) ship the rest, its last line without a
        newline included, for at most ``drain_s``. True if everything was shipped. What the deadline (or a
        bus outage) left is said in the log by a last line when ``final``, and kept by the cursor
        otherwise (a later shipper resumes there)."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if not final:
            return self.cursor is not None and await self._caught_up()
        loop = asyncio.get_running_loop()
        end = loop.time() + drain_s
        failures = 0
        while True:
            try:
                await self.ship_once(final=True)
                failures = 0
                if await self._caught_up():
                    return True
            except Exception as e:
                failures += 1
                log.warning("log batch not shipped (%s); retrying until the drain deadline", e)
            wait = self.limits.interval_s if not failures else DRAIN_BACKOFF.delay(failures)
            if loop.time() + wait >= end:
                break
            await asyncio.sleep(wait)
        with contextlib.suppress(Exception):
            await self._skip_rest()
        return False

    async def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                await self.ship_once()
                failures = 0
            except Exception as e:  # the bus is away: the cursor keeps the place, the file keeps the lines
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning(
                        "log batch not shipped (%s: %s); will retry",
                        type(e).__name__,
                        e,
                        extra={"attempt": self.source.attempt},
                    )
            wait = self.limits.interval_s if not failures else SHIP_BACKOFF.delay(failures)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait)

    async def ship_once(self, *, final: bool = False) -> int:
        """One tick: publish what was appended, within one tick's byte budget; the bytes shipped.

        Raises what publishing raised (the cursor then still says where to resume)."""
        async with self._lock:
            if self.cursor is None:
                self.cursor = await asyncio.to_thread(load_cursor, self.cursor_path)
            shipped = 0
            if self.cursor.pending is not None:  # a batch a crash (or an outage) left unacknowledged
                again = await asyncio.to_thread(self._prepare, self.cursor.offset, self.cursor.pending, True)
                if not again:  # the log lost those bytes (deleted, truncated): nothing to send again
                    self.cursor = Cursor(offset=self.cursor.offset)
                for batch in again:  # one batch, rebuilt from the same bytes
                    shipped += await self._publish(batch)
            prepared = await asyncio.to_thread(self._prepare, self.cursor.offset, None, final)
            budget = self.limits.budget
            for batch in prepared:
                if shipped >= budget:
                    break
                shipped += await self._publish(batch)
            return shipped

    def _prepare(self, offset: int, until: int | None, final: bool) -> list[Batch]:
        """Read from ``offset`` (up to ``until``, else a tick's budget) and cut it into batches."""
        if until is not None:
            data, final = _read(self.log_path, offset, until - offset), True
        else:
            size = self.limits.budget + self.limits.max_line + self.redactor.longest
            data = _read(self.log_path, offset, size)
            # The end of what was read is the end of a line only at the end of the file.
            final = final and len(data) < size
        lines = cut_lines(data, final=final, max_line=self.limits.max_line, redactor=self.redactor)
        found = batches(lines, offset, self.limits, self.redactor, now_rfc3339())
        if until is not None and len(found) > 1:  # a pending range is one batch, whatever the limits say
            merged = Batch(found[0].start, found[-1].end, [line for b in found for line in b.lines])
            return [merged]
        return found

    async def _publish(self, batch: Batch) -> int:
        assert self.cursor is not None
        s = self.source
        msg = LogLines(
            namespace=s.namespace,
            job=s.job,
            attempt=s.attempt,
            index=s.index,
            attempt_no=s.attempt_no,
            node=s.node,
            offset=batch.start,
            end=batch.end,
            lines=batch.lines,
        )
        msg_id = f"{s.namespace}/{s.attempt}:log:{batch.start}-{batch.end}"
        if self.cursor.pending != batch.end:
            self.cursor = Cursor(offset=batch.start, pending=batch.end)
            await asyncio.to_thread(save_cursor, self.cursor_path, self.cursor)
        if not self.nc.is_connected:
            raise (
                nats.errors.ConnectionReconnectingError()
                if self.nc.is_reconnecting
                else nats.errors.ConnectionClosedError()
            )
        headers = tracing.inject({MSG_ID: msg_id})
        await self.js.publish(subject_of(s), _encoder.encode(msg), timeout=PUBLISH_TIMEOUT_S, headers=headers)
        self.published += 1
        self.cursor = Cursor(offset=batch.end)
        await asyncio.to_thread(save_cursor, self.cursor_path, self.cursor)
        return batch.end - batch.start

    async def _caught_up(self) -> bool:
        assert self.cursor is not None
        return self.cursor.pending is None and self.cursor.offset >= await asyncio.to_thread(
            _file_size, self.log_path
        )

    async def _skip_rest(self) -> None:
        """Past the drain deadline: say in the log what was not shipped, and move the cursor past it."""
        async with self._lock:
            assert self.cursor is not None
            size = await asyncio.to_thread(_file_size, self.log_path)
            if self.cursor.pending is not None or size <= self.cursor.offset:
                return  # the bus is away (a pending batch waits): a later shipper resumes from the cursor
            s = self.source
            text = (
                f"[nodus] {size - self.cursor.offset} bytes of this log were not shipped (the agent ships at "
                f"most {self.limits.bytes_per_s} bytes/s); the whole log is {self.log_path} on node {s.node}"
            )
            await self._publish(Batch(self.cursor.offset, size, [LogLine(time=now_rfc3339(), text=text)]))


async def ship_remaining(
    nc: NATS,
    source: AttemptMessage,
    log_path: Path,
    *,
    secrets: Iterable[str] = (),
    drain_s: float = 10.0,
) -> bool:
    """Ship what an attempt's log still holds past its cursor (an agent restart finds a finished attempt
    whose log was not all shipped); True if everything was."""
    return await LogShipper(nc, source, log_path, secrets=secrets).close(final=True, drain_s=drain_s)
