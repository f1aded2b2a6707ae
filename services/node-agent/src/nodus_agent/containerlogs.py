"""A container's output in the attempt's log file: followed while it runs, reconciled once it has exited.

The file has one line per line of output, ``<time> <stdout|stderr> <text>`` (time: RFC 3339, UTC, nine
fraction digits). :func:`follow` copies the engine's followed stream, resuming where the file ends
(:class:`LogCursor`), so an agent that restarts repeats no line; once the container has exited,
:func:`reconcile_log` checks the file against the engine's complete log and repairs it from the first line
where they differ (:class:`LogFile`), because podman's followed stream drops and mangles lines at high
volume (podman issues #21914, #26206) where its plain read does not. Separate from the runtime
(:mod:`nodus_agent.containers`): this is file work against a log, whoever runs the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from nodus_agent.dockerapi import DockerAPI, DockerError, EngineUnavailable, LogLine, NotFound, unix_time

LOG_TAIL_LINES: Final = 20
LOG_DRAIN_S: Final = 2.0  # how long a followed stream may run on after its container exited


# -- following ---------------------------------------------------------------------------------------------
async def follow(api: DockerAPI, cid: str, path: Path, engine_back: Callable[[], Awaitable[bool]]) -> None:
    """Append the container's output to ``path`` until it exits, then reconcile the file with its log.

    Returns when the container has exited (or is gone); raises EngineUnavailable if the engine stays away
    (``engine_back`` says whether it came back in time). One follower per file at a time.
    """
    rounds = 0
    while True:
        if rounds:
            await asyncio.sleep(min(0.1 * rounds, 2.0))  # a stream that ended while the container runs
        rounds += 1
        try:
            info = await api.inspect(cid)
            if not info["State"].get("Running"):
                await _reconcile(api, cid, path)
                return
            await _copy(api, cid, path)
        except NotFound:
            return
        except EngineUnavailable:
            if not await engine_back():
                raise


async def _copy(api: DockerAPI, cid: str, path: Path) -> None:
    """Copy the followed stream until it ends, or until a moment after the container has exited:
    podman sometimes keeps a followed stream open after its container is gone (seen on a re-adopted
    container), and the plain read that follows repairs whatever the cut-off stream missed."""
    copying = asyncio.create_task(_copy_stream(api, cid, path))
    exiting = asyncio.create_task(api.wait(cid))
    try:
        await asyncio.wait({copying, exiting}, return_when=asyncio.FIRST_COMPLETED)
        if not copying.done():
            await asyncio.wait({copying}, timeout=LOG_DRAIN_S)
    finally:
        for task in (copying, exiting):
            task.cancel()
        await asyncio.gather(exiting, return_exceptions=True)
    if not copying.cancelled() and copying.done():
        copying.result()  # the stream's own error (EngineUnavailable, NotFound) goes to the caller
    else:
        await asyncio.gather(copying, return_exceptions=True)


async def _copy_stream(api: DockerAPI, cid: str, path: Path) -> None:
    cursor = await asyncio.to_thread(LogCursor.resume, path)
    since = unix_time(cursor.since) if cursor.since else None
    stream = api.logs(cid, follow=True, timestamps=True, since=since)
    async with contextlib.aclosing(stream):
        async for batch in stream:
            fresh = cursor.admit(batch)
            if fresh:
                await asyncio.to_thread(_append, path, "".join(render(line) for line in fresh))


async def _reconcile(api: DockerAPI, cid: str, path: Path) -> None:
    stream = api.logs(cid, follow=False, timestamps=True)
    async with contextlib.aclosing(stream):
        await reconcile_log(path, stream)


async def tail(api: DockerAPI, cid: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a container's output, for the message of a failure ("" if none)."""
    out: list[str] = []
    try:
        stream = api.logs(cid, timestamps=False, tail=lines)
        async with contextlib.aclosing(stream):
            async for batch in stream:
                out.extend(line.text for line in batch)
    except DockerError:
        return ""
    return "\n".join(out[-lines:])


# -- the log file -----------------------------------------------------------------------------------------
def render(line: LogLine) -> str:
    """One line of the attempt's log file."""
    return f"{line.time} {line.stream} {line.text}\n"


@dataclass
class LogCursor:
    """Where a log file ends, so a new read of the engine's log continues it without repeating lines.

    ``since`` is the time of the file's last line and ``seen`` how many lines at its end carry exactly
    that time (podman's times are whole seconds, so there may be thousands). The engine is asked for
    lines from ``since`` on (its ``since`` includes it); until a later time appears, lines older than
    ``since`` are dropped and the first ``seen`` at ``since`` skipped. After that every line is new.
    """

    since: str | None = None
    seen: int = 0
    _skip: int = 0
    _resuming: bool = True

    @classmethod
    def resume(cls, path: Path, block: int = 65536) -> LogCursor:
        """The cursor of the file at ``path`` (blocking: run it in a thread). A last line torn by a
        kill mid-write is cut off; the engine sends it again."""
        try:
            f = path.open("rb+")
        except FileNotFoundError:
            return cls()
        with f:
            end = _cut_torn_tail(f, block)
            newest: bytes | None = None
            seen, pos, carry = 0, end, b""
            # Backwards, a block at a time, counting the run of lines at the last line's time.
            while pos > 0:
                start = max(0, pos - block)
                f.seek(start)
                lines = (f.read(pos - start) + carry).split(b"\n")
                carry = lines.pop(0) if start > 0 else b""  # may be the tail of an earlier line
                for line in reversed(lines):
                    if not line:
                        continue
                    stamp = line.split(b" ", 1)[0]
                    if newest is not None and stamp != newest:
                        return cls.at(newest.decode("ascii", errors="replace"), seen)
                    newest, seen = stamp, seen + 1
                pos = start
        return cls.at(newest.decode("ascii", errors="replace"), seen) if newest else cls()

    @classmethod
    def at(cls, since: str, seen: int) -> LogCursor:
        return cls(since=since, seen=seen, _skip=seen)

    def admit(self, lines: Sequence[LogLine]) -> list[LogLine]:
        """The lines of a batch that the file does not have yet."""
        fresh = []
        for line in lines:
            if self._resuming and self.since is not None and line.time is not None:
                if line.time < self.since:
                    continue
                if line.time == self.since and self._skip > 0:
                    self._skip -= 1
                    continue
                if line.time > self.since:
                    self._resuming = False
            fresh.append(line)
        return fresh


def _cut_torn_tail(f: BinaryIO, block: int) -> int:
    """Truncate ``f`` after its last newline (a line torn by a kill mid-write); the new size."""
    size = f.seek(0, os.SEEK_END)
    pos = size
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        newline = f.read(pos - start).rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        pos = start
    else:
        keep = 0
    if keep < size:
        f.truncate(keep)
    return keep


class LogFile:
    """The attempt's log file read line by line against the engine's log, and cut where they part.

    Blocking: every method runs in a thread. ``skip_before(t)`` passes the lines older than the engine's
    first line (kept: an engine that rotates its log no longer has them); ``take(n)`` reads the next
    lines; ``cut(k)`` truncates the file before the ``k``-th line of the last take (or after it, for
    ``k`` equal to its length), so appending continues from there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: BinaryIO | None = None
        self._offsets: list[int] = []  # where each line of the last take starts, and where it ended
        self._peeked: tuple[int, bytes] | None = None

    def open(self) -> None:
        self.path.touch()
        self._f = self.path.open("rb+")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def _next(self) -> tuple[int, bytes]:
        assert self._f is not None
        if self._peeked is not None:
            line, self._peeked = self._peeked, None
            return line
        offset = self._f.tell()
        return offset, self._f.readline()

    def skip_before(self, stamp: str) -> None:
        bound = stamp.encode()
        while True:
            offset, line = self._next()
            if not line or line.split(b" ", 1)[0] >= bound:
                self._peeked = (offset, line)
                return

    def take(self, n: int) -> list[bytes]:
        lines: list[bytes] = []
        self._offsets = []
        for _ in range(n):
            offset, line = self._next()
            if not line:
                self._peeked = (offset, line)
                break
            self._offsets.append(offset)
            lines.append(line)
        assert self._f is not None
        self._offsets.append(self._peeked[0] if self._peeked else self._f.tell())
        return lines

    def cut(self, k: int) -> None:
        assert self._f is not None
        self._f.truncate(self._offsets[k])
        self._peeked = (self._offsets[k], b"")  # nothing more to read: the rest is appended

    def cut_rest(self) -> None:
        """After the engine's last line: drop whatever the file still has."""
        assert self._f is not None
        offset, line = self._next()
        if line:
            self._f.truncate(offset)


async def reconcile_log(path: Path, batches: AsyncIterator[list[LogLine]]) -> None:
    """Make ``path`` end exactly as an exited container's complete log (``batches``): compare line by
    line, cut the file where they part (or where it ends) and append the rest. Lines older than the
    log's first (an engine that rotated them away) are kept. Safe to kill at any line: a new run
    compares again."""
    file = LogFile(path)
    await asyncio.to_thread(file.open)
    try:
        first, appending = True, False
        async for batch in batches:
            rendered = [render(line).encode() for line in batch]
            if first and batch and batch[0].time:
                await asyncio.to_thread(file.skip_before, batch[0].time)
            first = False
            if not appending:
                have = await asyncio.to_thread(file.take, len(rendered))
                same = _common_prefix(have, rendered)
                if same == len(rendered):
                    continue
                await asyncio.to_thread(file.cut, same)
                appending, rendered = True, rendered[same:]
            await asyncio.to_thread(_append_bytes, path, b"".join(rendered))
        if not (first or appending):  # a log with no lines at all (rotated away) cuts nothing
            await asyncio.to_thread(file.cut_rest)
    finally:
        await asyncio.to_thread(file.close)


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


def _append_bytes(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def _common_prefix(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
