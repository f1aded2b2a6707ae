"""Bytes carried between the event loop and one worker thread, in bounded chunks.

Archives are CPU work and file I/O (tar, zstd, sha256), done in a worker thread so the event loop stays
free; their bytes cross to the loop (to upload) or from it (downloaded) through a :class:`Pipe` of a few
chunks, so memory stays at a few chunks whatever the archive's size. Separate from packing and unpacking
because both directions share the bridge, and because closing it must unblock the thread at once: a
cancelled transfer never leaves a thread stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

from nodus_agent.archiving import CHUNK_SIZE, StreamStats

QUEUE_DEPTH = 2
"""Chunks that may wait between the worker thread and the event loop: the memory bound of a stream."""


# -- the bridge between the event loop and one worker thread -----------------------------------------------
class Closed(Exception):
    """The other end went away: the worker stops where it is."""


T = TypeVar("T")


class Pipe(Generic[T]):
    """A bounded queue between the event loop and one worker thread. Closing it (from the loop) unblocks
    the thread at once, whichever way it waits, so a cancelled transfer never leaves a thread stuck."""

    def __init__(self, depth: int) -> None:
        self.loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[T] = asyncio.Queue(depth)
        self._closed = asyncio.Event()

    # thread side
    def put_from_thread(self, item: T) -> None:
        if not self._call(self._queue.put(item)):
            raise Closed

    def get_from_thread(self) -> T:
        got: list[T] = []

        async def get() -> None:
            got.append(await self._queue.get())

        if not self._call(get()):
            raise Closed
        return got[0]

    def _call(self, op: Any) -> bool:
        """Run ``op`` on the loop unless the pipe closes first; True if it ran."""
        if self._closed.is_set():
            op.close()
            return False
        try:
            return asyncio.run_coroutine_threadsafe(self._unless_closed(op), self.loop).result()
        except RuntimeError:  # the loop is gone: nobody is listening any more
            op.close()
            return False

    async def _unless_closed(self, op: Any) -> bool:
        task = asyncio.ensure_future(op)
        closed = asyncio.ensure_future(self._closed.wait())
        done, _ = await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            closed.cancel()
            task.result()
            return True
        task.cancel()
        return False

    # loop side
    async def put(self, item: T) -> None:
        await self._queue.put(item)

    async def get(self) -> T:
        return await self._queue.get()

    def close(self) -> None:
        self._closed.set()
        while not self._queue.empty():  # chunks nobody will read: free them now
            self._queue.get_nowait()


class End:
    """The item that ends a stream in a :class:`Pipe` (chunks are bytes, so it cannot be one)."""


@dataclass
class _Failure:
    error: BaseException


END = End()


# -- streams of chunks made in a worker thread -------------------------------------------------------------
class ChunkStream:
    """Bytes produced in a worker thread, read on the event loop as chunks of at least ``chunk_size``
    (the last one shorter). Hashes and counts what passes (in the thread), so :attr:`stats` is final once
    the iteration has ended. Use it as an async context manager: leaving it early stops the thread and
    frees its chunks.
    """

    def __init__(self, produce: Callable[[ChunkStream], None], chunk_size: int = CHUNK_SIZE) -> None:
        self._produce = produce
        self.chunk_size = chunk_size
        self.stats = StreamStats()
        self._digest = hashlib.sha256()
        self._pieces: list[bytes] = []
        self._pending = 0
        self._pipe: Pipe[bytes | End | _Failure] | None = None
        self._thread: asyncio.Future[None] | None = None
        self._done = False

    @property
    def sha256(self) -> str | None:
        """The digest once the stream has ended, else None."""
        return self.stats.sha256 if self._done else None

    # -- the worker thread's side: ``write`` is a file-like sink for tar and zstd --------------------------
    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Take bytes from the producer (worker thread); hands a chunk over once ``chunk_size`` bytes
        have gathered (chunks may run over by up to one write: joining once is the only copy made)."""
        n = len(data)
        if not n:
            return 0
        self._digest.update(data)  # releases the GIL for large buffers
        self.stats.size += n
        self._pieces.append(data if isinstance(data, bytes) else bytes(data))
        self._pending += n
        if self._pending >= self.chunk_size:
            self._hand_over()
        return n

    def _hand_over(self) -> None:
        chunk = self._pieces[0] if len(self._pieces) == 1 else b"".join(self._pieces)
        self._pieces.clear()
        self._pending = 0
        self._emit(chunk)

    def flush(self) -> None:
        """Part of the file protocol zstd's writer expects; chunks leave only when full or at the end."""

    def _emit(self, item: bytes | End | _Failure) -> None:
        assert self._pipe is not None
        self._pipe.put_from_thread(item)

    def _run(self) -> None:
        try:
            self._produce(self)
            if self._pieces:
                self._hand_over()
            self.stats.sha256 = self._digest.hexdigest()
            self._emit(END)
        except Closed:
            pass
        except BaseException as e:  # handed to the reader, who raises it where it awaits
            with contextlib.suppress(Closed):
                self._emit(_Failure(e))

    # -- the event loop's side ----------------------------------------------------------------------------
    def _start(self) -> None:
        if self._pipe is None:
            self._pipe = Pipe(QUEUE_DEPTH)
            self._thread = asyncio.ensure_future(asyncio.to_thread(self._run))

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        self._start()
        assert self._pipe is not None and self._thread is not None
        item = await self._pipe.get()
        if isinstance(item, bytes):
            return item
        await self._thread
        self._done = True
        if isinstance(item, _Failure):
            raise item.error
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop the worker (if it still runs) and wait for it: nothing of this stream outlives the call."""
        if self._pipe is None or self._thread is None:
            return
        self._pipe.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(self._thread)

    async def __aenter__(self) -> ChunkStream:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def collect(stream: AsyncIterator[bytes]) -> bytes:
    """Every chunk of a stream joined (for tests and small objects)."""
    return b"".join([c async for c in stream])
