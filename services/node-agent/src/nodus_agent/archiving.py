"""Trees of files as a stream of tar compressed with zstandard, and back, without the whole archive ever in
memory or on disk.

Packing: :func:`pack` walks the sources in a worker thread (tar + zstd + sha256 are CPU work and file
reads), and hands the compressed bytes to the event loop in chunks through a bounded queue, so memory stays
at a few chunks whatever the tree's size. :func:`file_stream` does the same for one file sent as is.

Unpacking: :func:`unpack` feeds a stream of compressed chunks to a worker thread that decompresses and
extracts into a *staging* directory beside each target, checks the sha256 of the compressed bytes at the
end, and only then moves the staged tree into place. A corrupt or hostile archive leaves the target as it
was.

Archive layout: every member is ``<name>/<path inside the source>`` where ``name`` is the source's
archive name (a relative POSIX path, e.g. ``nodus/state``); a source that is a file is the member
``<name>`` itself. Regular files, directories and symbolic links are stored; a symbolic link is stored as
a link, never followed, and only when it resolves inside its own source (one that escapes is left out and
named in :attr:`StreamStats.skipped`, because :func:`unpack` refuses such links). Sockets, FIFOs and
devices are left out the same way. Owners are kept as numbers (restored when the agent runs as root, so a
container's non-root user can still write its state); modification times are kept to the second.

Files of 1 MiB or more whose samples do not compress (random, already compressed) skip zstd's work: their
bytes go into zstd frames of raw blocks between the compressed frames. The stream is then a sequence of
zstd frames, which zstd itself, GNU ``tar --zstd`` and :func:`unpack` all read as one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import stat
import tarfile
from collections.abc import AsyncIterable, AsyncIterator, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, BinaryIO, Generic, TypeVar, cast

import zstandard

log = logging.getLogger(__name__)

MiB = 1 << 20
CHUNK_SIZE = 8 * MiB
"""Bytes per chunk handed to the event loop (and so at least one S3 part's worth with 5 MiB parts)."""
QUEUE_DEPTH = 2
"""Chunks that may wait between the worker thread and the event loop: the memory bound of a stream."""
LEVEL = 1
"""zstd level 1: measured here 280 MiB/s of text and 670 MiB/s of random bytes per core, against 190 and
610 at zstd's default 3, for a smaller result on our text (0.106 vs 0.140). A checkpoint is mostly
weights and optimizer state that hardly compress, and its time is lost training: speed first (ADR-0019)."""
THREADS = min(4, (os.cpu_count() or 1) // 8)
"""zstd worker threads beside the packing thread: none on small machines (the upload and the program need
the cores), up to 4 on a GPU host with 32 cores or more, where one core would cap a checkpoint at
about 600 MB/s."""
_COPY = 1 * MiB  # read size for file contents and tar's own buffer
_RESTORE = ".nodus-restore"
ARCHIVE_SUFFIX = "tar.zst"
"""The file name suffix of an archive made by :func:`pack`."""


class ArchiveError(Exception):
    """An archive could not be made or restored; the message says which member and why."""


class UnsafeArchive(ArchiveError):
    """A member would land outside its target (absolute or ``..`` name, escaping link, special file)."""


class DigestMismatch(ArchiveError):
    """The bytes read are not the bytes that were archived (their sha256 or size differs)."""


@dataclass
class StreamStats:
    """What a stream carried: filled in by the worker thread, final once the stream has ended."""

    size: int = 0
    """Compressed bytes (what is uploaded or downloaded)."""
    sha256: str = ""
    """Hex sha256 of those compressed bytes."""
    files: int = 0
    """Regular files in the archive."""
    raw_bytes: int = 0
    """Their contents, uncompressed."""
    skipped: list[str] = field(default_factory=list)
    """Members left out, each with the reason (escaping links, special files, files that vanished)."""
    changed: list[str] = field(default_factory=list)
    """Files whose size changed while they were read (the program was still writing: not consistent)."""


# -- the bridge between the event loop and one worker thread -----------------------------------------------
class _Closed(Exception):
    """The other end went away: the worker stops where it is."""


T = TypeVar("T")


class _Pipe(Generic[T]):
    """A bounded queue between the event loop and one worker thread. Closing it (from the loop) unblocks
    the thread at once, whichever way it waits, so a cancelled transfer never leaves a thread stuck."""

    def __init__(self, depth: int) -> None:
        self.loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[T] = asyncio.Queue(depth)
        self._closed = asyncio.Event()

    # thread side
    def put_from_thread(self, item: T) -> None:
        if not self._call(self._queue.put(item)):
            raise _Closed

    def get_from_thread(self) -> T:
        got: list[T] = []

        async def get() -> None:
            got.append(await self._queue.get())

        if not self._call(get()):
            raise _Closed
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


class _End:
    pass


@dataclass
class _Failure:
    error: BaseException


_END = _End()


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
        self._pipe: _Pipe[bytes | _End | _Failure] | None = None
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

    def _emit(self, item: bytes | _End | _Failure) -> None:
        assert self._pipe is not None
        self._pipe.put_from_thread(item)

    def _run(self) -> None:
        try:
            self._produce(self)
            if self._pieces:
                self._hand_over()
            self.stats.sha256 = self._digest.hexdigest()
            self._emit(_END)
        except _Closed:
            pass
        except BaseException as e:  # handed to the reader, who raises it where it awaits
            with contextlib.suppress(_Closed):
                self._emit(_Failure(e))

    # -- the event loop's side ----------------------------------------------------------------------------
    def _start(self) -> None:
        if self._pipe is None:
            self._pipe = _Pipe(QUEUE_DEPTH)
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


def pack(
    sources: Mapping[str, Path],
    *,
    exclude: Collection[Path] = (),
    level: int = LEVEL,
    threads: int = THREADS,
    chunk_size: int = CHUNK_SIZE,
) -> ChunkStream:
    """A tar.zst of ``sources`` (archive name -> file or directory on this host), streamed in chunks.

    ``exclude``: absolute paths left out (with everything under them), e.g. the agent's own control files.
    Raises :class:`ArchiveError` (when iterated) for a source that does not exist or cannot be read.
    """
    names = {check_name(name): Path(path) for name, path in sources.items()}
    _check_disjoint(list(names))
    skip = {os.path.abspath(p) for p in exclude}

    def produce(out: ChunkStream) -> None:
        cctx = zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=True)
        with cctx.stream_writer(cast(IO[bytes], out), write_size=chunk_size, closefd=False) as z:
            # tarfile's own stream mode ("w|") re-copies its buffer on every 16 KiB write (a third of the
            # CPU of a checkpoint, measured); plain "w" mode over a writer that never seeks does no such
            # thing and writes each file in 1 MiB blocks straight into zstd.
            sink = cast(IO[bytes], _Forward(z))
            with tarfile.TarFile(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, copybufsize=_COPY) as tar:
                packer = _Packer(tar, out.stats, skip, _Stored(z, out))
                for name, path in sorted(names.items()):
                    packer.add_source(name, path)

    return ChunkStream(produce, chunk_size)


def file_stream(path: Path, chunk_size: int = CHUNK_SIZE) -> ChunkStream:
    """One file's bytes as they are (no archive), streamed in chunks with their sha256 and size."""

    def produce(out: ChunkStream) -> None:
        with open(path, "rb") as f:
            out.stats.files = 1
            while block := f.read(chunk_size):
                out.stats.raw_bytes += len(block)
                out.write(block)

    return ChunkStream(produce, chunk_size)


def measure(sources: Mapping[str, Path], exclude: Collection[Path] = ()) -> int:
    """Bytes of regular files under ``sources`` (blocking: run it in a thread). What a size cap is
    checked against before anything is uploaded; links are not followed, as in :func:`pack`."""
    skip = {os.path.abspath(p) for p in exclude}
    total = 0
    for path in sources.values():
        for _, st in _walk(Path(path), skip):
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _walk(root: Path, skip: set[str]) -> Iterator[tuple[str, os.stat_result]]:
    """(path, lstat) of ``root`` and everything under it, a directory before its contents, names in
    sorted order (so the same tree makes the same archive), links not followed, ``skip`` left out."""
    stack = [os.path.abspath(root)]
    while stack:
        path = stack.pop()
        if path in skip:
            continue
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # removed while we walked: the program is still writing
            continue
        yield path, st
        if stat.S_ISDIR(st.st_mode):
            with os.scandir(path) as it:
                stack.extend(sorted((e.path for e in it), reverse=True))


class _Packer:
    """Adds one source to a tar stream (runs in the worker thread)."""

    def __init__(self, tar: tarfile.TarFile, stats: StreamStats, skip: set[str], stored: _Stored) -> None:
        self.tar, self.stats, self.skip, self.stored = tar, stats, skip, stored

    def add_source(self, name: str, path: Path) -> None:
        root = os.path.abspath(path)
        if not os.path.lexists(root):
            raise ArchiveError(f"{path} does not exist: nothing to archive as {name!r}")
        if os.path.islink(root):
            raise ArchiveError(f"{path} is a symbolic link: name the directory or file it points to")
        real_root = os.path.realpath(root)
        try:
            for entry, st in _walk(Path(root), self.skip):
                rel = os.path.relpath(entry, root)
                member = name if rel == "." else f"{name}/{Path(rel).as_posix()}"
                self._add(member, entry, st, real_root)
        except PermissionError as e:
            raise ArchiveError(
                f"cannot read {e.filename}: {e.strerror}; make it readable by the agent"
            ) from e

    def _add(self, member: str, path: str, st: os.stat_result, real_root: str) -> None:
        info = tarfile.TarInfo(member)
        info.mode = stat.S_IMODE(st.st_mode)
        info.mtime = int(st.st_mtime)  # whole seconds: a float costs a pax header per member
        info.uid, info.gid = st.st_uid, st.st_gid
        info.uname = info.gname = ""  # numbers only: no user database lookups, no names that mislead
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            self.tar.addfile(info)
        elif stat.S_ISREG(st.st_mode):
            self._add_file(info, path, st.st_size)
        elif stat.S_ISLNK(st.st_mode):
            self._add_link(info, path, real_root)
        else:
            self.stats.skipped.append(f"{member}: not a regular file, directory or link")

    def _add_file(self, info: tarfile.TarInfo, path: str, size: int) -> None:
        try:
            f = open(path, "rb")  # noqa: SIM115 -- closed below; the size must be read before addfile
        except FileNotFoundError:
            self.stats.skipped.append(f"{info.name}: removed while the archive was made")
            return
        with f:
            info.size = size
            reader = _Exact(f, size)
            if size >= STORE_MIN and not _compressible(f, size):
                self._add_stored(info, reader)
            else:
                self.tar.addfile(info, cast(IO[bytes], reader))
        if reader.changed:
            self.stats.changed.append(info.name)
        self.stats.files += 1
        self.stats.raw_bytes += size

    def _add_stored(self, info: tarfile.TarInfo, reader: _Exact) -> None:
        """A file that does not compress: its tar header through zstd as usual, its bytes in a zstd frame
        of raw blocks (no compression work at all), then the tar padding through zstd again."""
        self.tar.addfile(info)  # the header only
        self.stored.write(reader)
        blocks, remainder = divmod(info.size, tarfile.BLOCKSIZE)
        if remainder:
            cast(IO[bytes], self.tar.fileobj).write(tarfile.NUL * (tarfile.BLOCKSIZE - remainder))
            blocks += 1
        self.tar.offset += blocks * tarfile.BLOCKSIZE  # what addfile would have counted

    def _add_link(self, info: tarfile.TarInfo, path: str, real_root: str) -> None:
        target = os.readlink(path)
        # The link's real destination, through any chain of links on disk, must be inside its source:
        # unpack refuses anything else, and a checkpoint that cannot be restored is worse than one link less.
        if os.path.isabs(target) or not _within(os.path.realpath(path), real_root):
            self.stats.skipped.append(f"{info.name}: link to {target!r} leaves {real_root}")
            return
        info.type = tarfile.SYMTYPE
        info.linkname = target
        self.tar.addfile(info)


STORE_MIN = 1 * MiB
"""Files from this size are sampled, and stored without compression when the samples do not compress."""
_SAMPLE = 128 * 1024
_STORE_RATIO = 0.97  # zstd must save 3% of a sample for the file to be compressed
_RAW_BLOCK = 128 * 1024  # zstd's largest block
# A zstd frame header: magic, a descriptor with no content size, checksum or dictionary, and a window of
# 2^17 bytes (exponent 7), the least that holds a 128 KiB block. RFC 8878, section 3.1.1.
_RAW_FRAME = b"\x28\xb5\x2f\xfd\x00\x38"
_LAST_EMPTY_BLOCK = b"\x01\x00\x00"  # a raw block of 0 bytes that ends the frame (zstd ends frames so too)


def _compressible(f: BinaryIO, size: int) -> bool:
    """Whether samples of the file (its start and its middle) compress by 3% at level 1; leaves the file
    at its start. Weights in float formats usually do (their exponents), random or already compressed
    bytes do not, and zstd spends as much time failing on those as succeeding on text."""
    cctx = zstandard.ZstdCompressor(level=1)
    for offset in sorted({0, max(0, size // 2 - _SAMPLE // 2)}):
        f.seek(offset)
        sample = f.read(_SAMPLE)
        if sample and len(cctx.compress(sample)) < _STORE_RATIO * len(sample):
            f.seek(0)
            return True
    f.seek(0)
    return False


class _Stored:
    """Writes bytes into the archive as a zstd frame of raw blocks: the compressed frame before it is
    ended first, so the stream is a valid sequence of frames that zstd (the tool too) reads as one."""

    def __init__(self, z: Any, out: ChunkStream) -> None:
        self.z, self.out = z, out

    def write(self, reader: _Exact) -> None:
        self.z.flush(zstandard.FLUSH_FRAME)
        self.out.write(_RAW_FRAME)
        while block := reader.read(_COPY):
            for i in range(0, len(block), _RAW_BLOCK):
                piece = block[i : i + _RAW_BLOCK]
                self.out.write((len(piece) << 3).to_bytes(3, "little"))  # last=0, type=raw, size
                self.out.write(piece)
        self.out.write(_LAST_EMPTY_BLOCK)


class _Forward:
    """A write-only, never-seeking file over zstd's writer, as tarfile's plain "w" mode wants one: it asks
    ``tell()`` once, for where the archive starts."""

    def __init__(self, z: Any) -> None:
        self.z, self.written = z, 0

    def write(self, data: bytes) -> int:
        self.z.write(data)
        self.written += len(data)
        return len(data)

    def tell(self) -> int:
        return self.written


class _Exact:
    """A file read as exactly ``size`` bytes: a file that shrank while being read is padded with zeros and
    one that grew is cut, so the tar stream stays well-formed; either way it is marked ``changed``."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.left, self.changed = f, size, False

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        if len(data) < n:
            self.changed = True
            data += bytes(n - len(data))
        self.left -= n
        if self.left == 0 and self.f.read(1):
            self.changed = True
        return data

    def readinto(self, b: bytearray | memoryview) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def check_name(name: str) -> str:
    """An archive name: a relative POSIX path without ``.`` or ``..`` parts; returned as given."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in name:
        raise ValueError(f"archive name {name!r} must be a relative path such as 'nodus/state'")
    return name


def _check_disjoint(names: list[str]) -> None:
    for a in names:
        for b in names:
            if a != b and b.startswith(a + "/"):
                raise ValueError(f"{b!r} lies inside {a!r}: archive the outer path only")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


# -- unpacking ---------------------------------------------------------------------------------------------
@dataclass
class _Route:
    """Where the members of one archive name go: staged under ``stage``, then moved to ``target``."""

    name: str
    target: Path
    stage: Path

    @property
    def root(self) -> Path:
        return self.stage / "root"


async def unpack(
    chunks: AsyncIterable[bytes],
    targets: Mapping[str, Path],
    *,
    sha256: str | None = None,
    size: int | None = None,
) -> StreamStats:
    """Extract a tar.zst stream: members named ``<name>`` or ``<name>/...`` go to ``targets[name]``.

    Everything is first extracted into ``.<target>.nodus-restore`` beside each target; once the stream
    has ended and its sha256 (and size) match, the staged entries replace those of the same name in the
    target, which is created if missing. Members of names not in ``targets`` are read and dropped.
    Raises :class:`DigestMismatch` or :class:`UnsafeArchive` (or :class:`ArchiveError`) and then leaves
    every target untouched. Safe to repeat after a kill: stale staging directories are cleared first.
    """
    routes = [_route(check_name(n), Path(t)) for n, t in targets.items()]
    _check_disjoint([r.name for r in routes])
    pipe: _Pipe[bytes | _End] = _Pipe(QUEUE_DEPTH)
    stats = StreamStats()
    worker = asyncio.ensure_future(asyncio.to_thread(_extract, pipe, routes, stats))
    try:
        await _feed(chunks, pipe, worker)
        await worker
        _check_digest(stats, sha256, size)
        await asyncio.to_thread(_move_into_place, routes)
    finally:
        pipe.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(worker)
        await asyncio.to_thread(_clear_stages, routes)
    return stats


async def _feed(
    chunks: AsyncIterable[bytes], pipe: _Pipe[bytes | _End], worker: asyncio.Future[None]
) -> None:
    """Hand the chunks to the worker; stop early if it failed (its error is the one worth raising)."""
    async for chunk in chunks:
        put = asyncio.ensure_future(pipe.put(chunk))
        await asyncio.wait({put, worker}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            break
    else:
        put_end = asyncio.ensure_future(pipe.put(_END))
        await asyncio.wait({put_end, worker}, return_when=asyncio.FIRST_COMPLETED)
        if not put_end.done():
            put_end.cancel()


def _check_digest(stats: StreamStats, sha256: str | None, size: int | None) -> None:
    if size is not None and stats.size != size:
        raise DigestMismatch(
            f"read {stats.size} bytes where {size} were archived: the object was replaced or cut"
        )
    if sha256 is not None and stats.sha256 != sha256:
        raise DigestMismatch(
            f"sha256 of the archive is {stats.sha256}, not the recorded {sha256}: "
            "the object was changed or corrupted after it was written"
        )


def _route(name: str, target: Path) -> _Route:
    target = Path(os.path.abspath(target))
    return _Route(name, target, target.parent / f".{target.name}{_RESTORE}")


class _QueueReader:
    """The compressed stream as a file for zstd (worker thread): hashes and counts every byte read."""

    def __init__(self, pipe: _Pipe[bytes | _End], stats: StreamStats) -> None:
        self.pipe, self.stats = pipe, stats
        self.digest = hashlib.sha256()
        self.buf = memoryview(b"")
        self.eof = False

    def read(self, n: int = -1) -> bytes:
        while not self.buf and not self.eof:
            item = self.pipe.get_from_thread()
            if isinstance(item, _End):
                self.eof = True
            else:
                self.digest.update(item)
                self.stats.size += len(item)
                self.buf = memoryview(item)
        n = len(self.buf) if n < 0 else n
        out, self.buf = self.buf[:n], self.buf[n:]
        return bytes(out)

    def drain(self) -> None:
        while self.read(_COPY):
            pass
        self.stats.sha256 = self.digest.hexdigest()


def _extract(pipe: _Pipe[bytes | _End], routes: list[_Route], stats: StreamStats) -> None:
    """The worker thread: decompress, check and stage every member; links last, then check them."""
    for r in routes:
        _clear_stage(r)
        r.root.parent.mkdir(parents=True)
    raw = _QueueReader(pipe, stats)
    extractor = _Extractor(routes, stats)
    try:
        dctx = zstandard.ZstdDecompressor()
        source = cast(IO[bytes], raw)
        with dctx.stream_reader(source, read_size=_COPY, closefd=False, read_across_frames=True) as z:
            with tarfile.open(fileobj=cast(IO[bytes], z), mode="r|", bufsize=_COPY) as tar:
                for member in tar:
                    extractor.add(tar, member)
            while z.read(_COPY):  # the zstd frame's end and its checksum come after the tar's end
                pass
        raw.drain()  # anything after the frame still counts towards the digest
    except _Closed:
        return
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
        # Not drained to the end for a digest: the rest of a damaged terabyte is not worth downloading.
        raise DigestMismatch(f"the archive is damaged after {stats.size} bytes: {e}") from e
    extractor.finish()


class _Extractor:
    """Writes members into their route's staging directory, refusing anything that could escape it."""

    def __init__(self, routes: list[_Route], stats: StreamStats) -> None:
        self.routes, self.stats = routes, stats
        self.links: list[tuple[Path, str, _Route, tarfile.TarInfo]] = []
        self.dirs: list[tuple[Path, tarfile.TarInfo]] = []
        self.chown = hasattr(os, "geteuid") and os.geteuid() == 0

    def add(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        found = self._place(m.name)
        if found is None:
            return  # a path the caller did not ask for
        route, dest = found
        if m.isdir():
            self._mkdir(dest, route)
            self.dirs.append((dest, m))
        elif m.isreg():
            self._write(tar, m, dest, route)
        elif m.issym():
            self.links.append((dest, m.linkname, route, m))
        else:
            raise UnsafeArchive(f"{m.name}: {_kind(m)} members are never restored")

    def _place(self, name: str) -> tuple[_Route, Path] | None:
        clean = name.rstrip("/")
        parts = clean.split("/")
        if not clean or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in name:
            raise UnsafeArchive(f"member {name!r} is absolute or climbs with '..': refusing the archive")
        for r in self.routes:
            if clean == r.name:
                return r, r.root
            if clean.startswith(r.name + "/"):
                return r, r.root.joinpath(*clean[len(r.name) + 1 :].split("/"))
        return None

    def _mkdir(self, path: Path, route: _Route) -> None:
        # Every directory on the way must be a real one inside the stage: links are only made at the end,
        # so a directory found to be a link means the archive tried to write through one.
        for p in [path, *path.parents]:
            if p == route.stage:
                break
            if p.is_symlink():
                raise UnsafeArchive(f"{path} would be written through the link {p}")
        path.mkdir(parents=True, exist_ok=True)

    def _write(self, tar: tarfile.TarFile, m: tarfile.TarInfo, dest: Path, route: _Route) -> None:
        self._mkdir(dest.parent, route)
        src = tar.extractfile(m)
        assert src is not None
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(dest, flags, 0o600)
        except IsADirectoryError:
            raise UnsafeArchive(f"{m.name} is both a directory and a file in the archive") from None
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(src, out, _COPY)
        self._attrs(dest, m)
        self.stats.files += 1
        self.stats.raw_bytes += m.size

    def _attrs(self, path: Path, m: tarfile.TarInfo) -> None:
        if self.chown:
            with contextlib.suppress(OSError):
                os.chown(path, m.uid, m.gid, follow_symlinks=False)
        os.chmod(path, m.mode & 0o777)  # never setuid/setgid/sticky from an archive
        os.utime(path, (m.mtime, m.mtime))

    def finish(self) -> None:
        """Make the links (after every file, so nothing was written through one), check where each
        resolves, then set directory modes (last: a read-only directory would have refused its files)."""
        for dest, target, route, m in self.links:
            if os.path.isabs(target):
                raise UnsafeArchive(f"{m.name}: link to the absolute path {target!r} is refused")
            if os.path.lexists(dest):
                raise UnsafeArchive(f"{m.name}: a link over an existing member (members under a link?)")
            self._mkdir(dest.parent, route)
            os.symlink(target, dest)
            if self.chown:
                with contextlib.suppress(OSError):
                    os.chown(dest, m.uid, m.gid, follow_symlinks=False)
        for dest, target, route, m in self.links:
            # Checked once every link exists: a chain (a -> b/.., b -> ..) can only be judged as a whole.
            if not _within(os.path.realpath(dest), os.path.realpath(route.root)):
                raise UnsafeArchive(f"{m.name}: link to {target!r} leads outside {route.target}")
        for dest, m in reversed(self.dirs):
            self._attrs(dest, m)


def _kind(m: tarfile.TarInfo) -> str:
    if m.islnk():
        return "hard link"
    if m.ischr() or m.isblk():
        return "device"
    if m.isfifo():
        return "FIFO"
    return f"type {m.type!r}"


def _move_into_place(routes: list[_Route]) -> None:
    """Replace the target's entries by the staged ones (blocking). Each step is a rename, so a kill
    leaves every entry old or new; running the restore again finishes the job."""
    for r in routes:
        if not os.path.lexists(r.root):
            continue  # the archive held nothing of this name
        if r.root.is_dir() and not r.root.is_symlink():
            if r.target.is_symlink() or (r.target.exists() and not r.target.is_dir()):
                r.target.unlink()
            r.target.mkdir(parents=True, exist_ok=True)
            for entry in sorted(os.listdir(r.root)):
                _replace(r.root / entry, r.target / entry)
        else:
            _replace(r.root, r.target)


def _replace(src: Path, dest: Path) -> None:
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    os.replace(src, dest)


def _clear_stage(r: _Route) -> None:
    if os.path.lexists(r.stage):
        _make_writable(r.stage)
        shutil.rmtree(r.stage)


def _clear_stages(routes: list[_Route]) -> None:
    for r in routes:
        _clear_stage(r)


def _make_writable(root: Path) -> None:
    """Read-only directories (restored from an archive) would stop rmtree; open them up first."""
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                with contextlib.suppress(OSError):
                    os.chmod(p, 0o700)


async def collect(stream: AsyncIterator[bytes]) -> bytes:
    """Every chunk of a stream joined (for tests and small objects)."""
    return b"".join([c async for c in stream])
