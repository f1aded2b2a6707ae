"""Where an input's bytes go and how they get there (:mod:`nodus_agent.inputs`): a staging directory beside
``inputs/``, final names inside it, idempotency markers beside both; files written, hashed and capped in a
worker thread a megabyte at a time; and the S3 clients one materialisation shares."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import shutil
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from nodus_agent import s3
from nodus_agent.inputcontext import InputError, InputRecord
from nodus_agent.s3 import S3Settings

__all__ = [
    "CHUNK",
    "Budget",
    "Clients",
    "Interrupted",
    "Layout",
    "Materialisation",
    "offload",
    "stream_to",
]

CHUNK: Final = 1 << 20
"""Bytes handed to a worker thread at a time: large enough that the thread hop costs nothing."""

T = TypeVar("T")


class _Marker(msgspec.Struct, kw_only=True, rename="camel"):
    fingerprint: str
    mtime_ns: int
    record: InputRecord


_marker_encoder = msgspec.json.Encoder()
_marker_decoder = msgspec.json.Decoder(_Marker)


@dataclass(frozen=True)
class Layout:
    """Where files go: staging beside ``inputs/``, final names inside it, markers beside both."""

    final: Path
    """``inputs/``: what the program sees."""
    staging: Path
    """``.inputs.nodus/tmp``: on the same file system, so a rename into ``inputs/`` is atomic."""
    marks: Path

    @classmethod
    def prepare(cls, final: Path) -> Layout:
        work = final.parent / f".{final.name}.nodus"
        layout = cls(final, work / "tmp", work / "marks")
        # Whatever an earlier, killed materialisation left half-done is of no use: start clean.
        shutil.rmtree(layout.staging, ignore_errors=True)
        for d in (final, layout.staging, layout.marks):
            d.mkdir(parents=True, exist_ok=True)
        return layout

    def temp(self, suffix: str = "") -> Path:
        return self.staging / f"{secrets.token_hex(8)}{suffix}"

    def kept(self, name: str, fingerprint: str) -> InputRecord | None:
        """The record of an input already in place from the same spec, unchanged since; else None."""
        try:
            marker = _marker_decoder.decode((self.marks / f"{name}.json").read_bytes())
            st = (self.final / name).stat()
        except (OSError, msgspec.DecodeError):
            return None
        if marker.fingerprint != fingerprint or st.st_mtime_ns != marker.mtime_ns:
            return None
        if marker.record.directory != (self.final / name).is_dir():
            return None
        if not marker.record.directory and st.st_size != marker.record.bytes:
            return None
        return marker.record

    def place(self, name: str, staged: Path) -> None:
        """Move a complete, verified file or directory to its final name (replacing what was there)."""
        target = self.final / name
        with contextlib.suppress(FileNotFoundError):
            (self.marks / f"{name}.json").unlink()
        if target.is_dir() and not target.is_symlink():
            trash = self.temp(".old")
            os.replace(target, trash)
            shutil.rmtree(trash, ignore_errors=True)
        elif staged.is_dir():
            target.unlink(missing_ok=True)  # a directory cannot replace a file in one rename
        os.replace(staged, target)  # a file replaces a file atomically; a directory lands on a free name
        _fsync_dir(self.final)

    def mark(self, name: str, fingerprint: str, record: InputRecord) -> None:
        """Written after :meth:`place`: a crash in between costs a second fetch, never a wrong file."""
        mtime = (self.final / name).stat().st_mtime_ns
        marker = _Marker(fingerprint=fingerprint, mtime_ns=mtime, record=record)
        tmp = self.marks / f".{name}.json.tmp"
        tmp.write_bytes(_marker_encoder.encode(marker))
        os.replace(tmp, self.marks / f"{name}.json")


class Clients:
    """One S3 client per store for a whole materialisation: making one costs a third of a second of CPU
    (botocore loads its service model), so inputs from the same store share it."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._made: dict[S3Settings, Any] = {}
        self._lock = asyncio.Lock()

    async def get(self, settings: S3Settings) -> Any:
        async with self._lock:
            if settings not in self._made:
                self._made[settings] = await self._stack.enter_async_context(s3.client(settings))
            return self._made[settings]

    async def aclose(self) -> None:
        await self._stack.aclose()


@dataclass(frozen=True)
class Materialisation:
    """One :func:`materialise` call: where files go, and the S3 clients it has opened."""

    layout: Layout
    clients: Clients


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Interrupted(Exception):
    """A worker thread saw its stop flag: the coroutine that started it was cancelled."""


async def offload(fn: Callable[..., T], *args: Any, stop: threading.Event | None = None) -> T:
    """Run blocking file work in a thread and, if cancelled, still wait for the thread to end (after
    raising ``stop``, which long work checks), so the caller's cleanup never races a write in flight."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if stop is not None:
            stop.set()
        await asyncio.wait([task])
        raise


class _Writer:
    """A staged file being written: sha256 and size as the bytes pass, the cap checked before each write.

    Writes and hashing run in a worker thread a megabyte at a time: hashing 50 GiB in the event loop would
    stall heartbeats for a minute."""

    def __init__(self, path: Path, name: str, budget: Budget) -> None:
        self.path, self.name, self.budget = path, name, budget
        self.size = 0
        self._hash = hashlib.sha256()
        self._buffer = bytearray()
        self._file = path.open("wb")

    async def write(self, chunk: bytes) -> None:
        self.budget.take(len(chunk))
        self._buffer += chunk
        if len(self._buffer) >= CHUNK:
            await self._drain()

    async def finish(self) -> str:
        """Flush, fsync and close; the hex sha256 of everything written."""
        await self._drain()
        await offload(self._close, True)
        return self._hash.hexdigest()

    async def abort(self) -> None:
        await offload(self._close, False)
        await asyncio.to_thread(self.path.unlink, True)

    async def _drain(self) -> None:
        data, self._buffer = bytes(self._buffer), bytearray()
        if data:
            await offload(self._write, data)

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._hash.update(data)
        self.size += len(data)

    def _close(self, sync: bool) -> None:
        if self._file.closed:
            return
        if sync:
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()


class Budget:
    """The size cap of one input, shared by every file it writes."""

    def __init__(self, name: str, limit: int) -> None:
        self.name, self.limit, self.used = name, limit, 0

    def take(self, n: int) -> None:
        self.used += n
        if self.used > self.limit:
            raise InputError(
                self.name,
                f"larger than the agent's input size cap of {self.limit} bytes; "
                "use a smaller input, or raise NODUS_AGENT_INPUT_MAX_BYTES on the node",
            )


async def stream_to(
    staged: Path, name: str, budget: Budget, chunks: AsyncIterator[bytes], expect: str | None
) -> tuple[int, str]:
    """Write an async iterator of chunks to ``staged``; (size, sha256), the digest checked when expected."""
    writer = _Writer(staged, name, budget)
    try:
        async for chunk in chunks:
            await writer.write(chunk)
        digest = await writer.finish()
    except BaseException:
        await writer.abort()
        raise
    if expect is not None and digest != expect:
        await asyncio.to_thread(staged.unlink, True)
        raise InputError(
            name,
            f"sha256 mismatch: expected {expect}, got {digest}; the content changed at its source, "
            "or the Job's sha256 is wrong",
        )
    return writer.size, digest
