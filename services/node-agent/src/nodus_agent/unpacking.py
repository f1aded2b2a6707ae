"""A stream of tar compressed with zstandard unpacked into its targets, all or nothing.

:func:`unpack` feeds a stream of compressed chunks to a worker thread that decompresses and extracts into a
*staging* directory beside each target, checks the sha256 of the compressed bytes at the end, and only
then moves the staged tree into place. A corrupt or hostile archive (a member that climbs out with ``..``,
a link that leads outside its target, a device) leaves every target as it was. :func:`unpack_tree` does
the same for an archive whose members sit at its root (an uploaded blob, ADR-0036), all into one target,
under a cap on what it holds. Separate from packing: everything here is about distrust of the archive read,
which packing never needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import tarfile
from collections import deque
from collections.abc import AsyncIterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import zstandard

from nodus_agent.archiving import (
    COPY_SIZE,
    ArchiveError,
    DigestMismatch,
    StreamStats,
    UnsafeArchive,
    check_disjoint,
    check_name,
    within,
)
from nodus_agent.chunkstreams import END, QUEUE_DEPTH, Closed, End, Pipe
from nodus_agent.tarstreams import Inflated

_RESTORE = ".nodus-restore"  # the staging directory beside a target: .<target>.nodus-restore

Chunk = bytes | list[bytes]
"""Compressed bytes as they come: a chunk, or one in the pieces it arrived in
(:func:`nodus_agent.uploading.download_pieces`), read piece by piece without joining them."""


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
    chunks: AsyncIterable[Chunk],
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
    check_disjoint([r.name for r in routes])
    return await _unpack(chunks, routes, sha256, size, None)


async def unpack_tree(
    chunks: AsyncIterable[Chunk],
    target: Path,
    *,
    sha256: str | None = None,
    size: int | None = None,
    max_bytes: int | None = None,
) -> StreamStats:
    """Extract a tar.zst stream whose members sit at the archive's root (``a.txt``, ``dir/b``, also tar's
    own ``./a.txt``) into ``target``, all or nothing, as :func:`unpack` does; ``target`` exists afterwards
    even for an empty archive. ``max_bytes`` caps the files' total: an archive that holds more (a
    decompression bomb) is refused with :class:`ArchiveError` before the first file past it is written."""
    stats = await _unpack(chunks, [_route("", Path(target))], sha256, size, max_bytes)
    await asyncio.to_thread(Path(target).mkdir, parents=True, exist_ok=True)
    return stats


async def _unpack(
    chunks: AsyncIterable[Chunk],
    routes: list[_Route],
    sha256: str | None,
    size: int | None,
    max_bytes: int | None,
) -> StreamStats:
    pipe: Pipe[Chunk | End] = Pipe(QUEUE_DEPTH)
    stats = StreamStats()
    worker = asyncio.ensure_future(asyncio.to_thread(_extract, pipe, routes, stats, max_bytes))
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


async def _feed(chunks: AsyncIterable[Chunk], pipe: Pipe[Chunk | End], worker: asyncio.Future[None]) -> None:
    """Hand the chunks to the worker; stop early if it failed (its error is the one worth raising)."""
    async for chunk in chunks:
        put = asyncio.ensure_future(pipe.put(chunk))
        await asyncio.wait({put, worker}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            break
    else:
        put_end = asyncio.ensure_future(pipe.put(END))
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


HASH_AHEAD = 4
"""Chunks the hashing thread may lag behind decompression (memory: that many chunks of the stream)."""


class _QueueReader:
    """The compressed stream as a file for zstd (worker thread): hashes and counts every byte read.

    The sha256 runs in a thread of its own, in order, beside decompression and extraction: hashlib and
    zstd both release the GIL on large buffers, so on a node with two cores or more the digest costs no
    wall time (a cold Volume mount went from 52% to 56-59% of a raw download: docs/benchmarks.md, "volume").
    Chunks may come in pieces (:data:`Chunk`): they are read one after another, never joined."""

    def __init__(self, pipe: Pipe[Chunk | End], stats: StreamStats) -> None:
        self.pipe, self.stats = pipe, stats
        self.digest = hashlib.sha256()
        self.pieces: deque[bytes] = deque()
        self.buf = memoryview(b"")
        self.eof = False
        self._hashing = ThreadPoolExecutor(1, thread_name_prefix="nodus-sha256")
        self._hashed: deque[Future[None]] = deque()

    def read(self, n: int = -1) -> memoryview:
        """Up to ``n`` bytes of the current piece, as a view: zstd reads any buffer, so none is copied."""
        while not self.buf and (self.pieces or not self.eof):
            if self.pieces:
                self.buf = memoryview(self.pieces.popleft())
                continue
            item = self.pipe.get_from_thread()
            if isinstance(item, End):
                self.eof = True
            else:
                pieces = [item] if isinstance(item, bytes) else item
                self._hash(pieces)
                self.stats.size += sum(map(len, pieces))
                self.pieces.extend(pieces)
        n = len(self.buf) if n < 0 else n
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _hash(self, pieces: list[bytes]) -> None:
        self._hashed.append(self._hashing.submit(self._update, pieces))
        while len(self._hashed) > HASH_AHEAD:
            self._hashed.popleft().result()

    def _update(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.digest.update(piece)

    def drain(self) -> None:
        while self.read(COPY_SIZE):
            pass
        while self._hashed:
            self._hashed.popleft().result()
        self.stats.sha256 = self.digest.hexdigest()

    def close(self) -> None:
        self._hashing.shutdown(wait=False, cancel_futures=True)


def _extract(
    pipe: Pipe[Chunk | End], routes: list[_Route], stats: StreamStats, max_bytes: int | None
) -> None:
    """The worker thread: decompress, check and stage every member; links last, then check them."""
    for r in routes:
        _clear_stage(r)
        r.root.parent.mkdir(parents=True)
    raw = _QueueReader(pipe, stats)
    extractor = _Extractor(routes, stats, max_bytes)
    try:
        dctx = zstandard.ZstdDecompressor()
        source = cast(IO[bytes], raw)
        with dctx.stream_reader(source, read_size=COPY_SIZE, closefd=False, read_across_frames=True) as z:
            inflated = Inflated(z)
            # Plain "r" mode over a file that only moves forward: tarfile parses the headers, and each
            # member's bytes go from zstd's output straight to its file (tarstreams).
            with tarfile.TarFile(fileobj=cast(IO[bytes], inflated), mode="r") as tar:
                for member in tar:
                    extractor.add(tar, inflated, member)
            inflated.drain()  # the zstd frame's end and its checksum come after the tar's end
        raw.drain()  # anything after the frame still counts towards the digest
    except Closed:
        return
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
        # Not drained to the end for a digest: the rest of a damaged terabyte is not worth downloading.
        raise DigestMismatch(f"the archive is damaged after {stats.size} bytes: {e}") from e
    finally:
        raw.close()
    extractor.finish()


class _Extractor:
    """Writes members into their route's staging directory, refusing anything that could escape it."""

    def __init__(self, routes: list[_Route], stats: StreamStats, max_bytes: int | None = None) -> None:
        self.routes, self.stats, self.max_bytes = routes, stats, max_bytes
        self.links: list[tuple[Path, str, _Route, tarfile.TarInfo]] = []
        self.dirs: list[tuple[Path, tarfile.TarInfo]] = []
        self.chown = hasattr(os, "geteuid") and os.geteuid() == 0

    def add(self, tar: tarfile.TarFile, data: Inflated, m: tarfile.TarInfo) -> None:
        found = self._place(m.name)
        if found is None:
            return  # a path the caller did not ask for
        route, dest = found
        if not route.name and dest == route.root and not m.isdir():
            raise UnsafeArchive(f"member {m.name!r} names the archive's root but is not a directory")
        if m.isdir():
            self._mkdir(dest, route)
            self.dirs.append((dest, m))
        elif m.isreg():
            self._write(tar, data, m, dest, route)
        elif m.issym():
            self.links.append((dest, m.linkname, route, m))
        else:
            raise UnsafeArchive(f"{m.name}: {_kind(m)} members are never restored")

    def _place(self, name: str) -> tuple[_Route, Path] | None:
        tree = len(self.routes) == 1 and not self.routes[0].name
        if tree:  # tar run in the folder (``tar -C dir .``) names the root "./" and its members "./x"
            if name.rstrip("/") in ("", "."):
                return self.routes[0], self.routes[0].root
            name = name.removeprefix("./")
        clean = name.rstrip("/")
        parts = clean.split("/")
        if not clean or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in name:
            raise UnsafeArchive(f"member {name!r} is absolute or climbs with '..': refusing the archive")
        if tree:
            return self.routes[0], self.routes[0].root.joinpath(*parts)
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

    def _write(
        self, tar: tarfile.TarFile, data: Inflated, m: tarfile.TarInfo, dest: Path, route: _Route
    ) -> None:
        if self.max_bytes is not None and self.stats.raw_bytes + m.size > self.max_bytes:
            raise ArchiveError(f"{m.name}: the archive holds more than the cap of {self.max_bytes} bytes")
        self._mkdir(dest.parent, route)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(dest, flags, 0o600)
        except IsADirectoryError:
            raise UnsafeArchive(f"{m.name} is both a directory and a file in the archive") from None
        try:
            if m.sparse is None and data.tell() == m.offset_data:
                data.write_to(fd, m.size)
            else:  # a GNU sparse member (never one of ours): tarfile lays out its holes
                src = tar.extractfile(m)
                assert src is not None
                with os.fdopen(fd, "wb", closefd=False) as out:
                    shutil.copyfileobj(src, out, COPY_SIZE)
        finally:
            os.close(fd)
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
            if not within(os.path.realpath(dest), os.path.realpath(route.root)):
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
