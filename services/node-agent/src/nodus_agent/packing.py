"""Trees of files packed into a stream of tar compressed with zstandard, without the whole archive ever in
memory or on disk (the layout is :mod:`nodus_agent.archiving`'s).

:func:`pack` walks the sources in a worker thread (tar + zstd + sha256 are CPU work and file reads), and
hands the compressed bytes to the event loop in chunks (a :class:`~nodus_agent.chunkstreams.ChunkStream`),
so memory stays at a few chunks whatever the tree's size. :func:`file_stream` does the same for one file
sent as is; :func:`measure` sizes the sources first, as a cap is checked before anything is uploaded.
:func:`pack_tree` packs one directory with its members at the archive's root: the layout of an uploaded
blob (a Volume revision, ADR-0036), which :func:`nodus_agent.unpacking.unpack_tree` reads.

Files of 1 MiB or more whose samples do not compress (random, already compressed) skip zstd's work: their
bytes go into zstd frames of raw blocks between the compressed frames. The stream is then a sequence of
zstd frames, which zstd itself, GNU ``tar --zstd`` and :func:`nodus_agent.unpacking.unpack` all read as
one. Separate from unpacking: the two share only the format, and each is a worker thread's whole job.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import zstandard

from nodus_agent.archiving import (
    CHUNK_SIZE,
    COPY_SIZE,
    LEVEL,
    THREADS,
    ArchiveError,
    MiB,
    StreamStats,
    check_disjoint,
    check_name,
    within,
)
from nodus_agent.chunkstreams import ChunkStream


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
    check_disjoint(list(names))
    return _pack(names, exclude, level, threads, chunk_size)


def pack_tree(
    root: Path,
    *,
    exclude: Collection[Path] = (),
    level: int = LEVEL,
    threads: int = THREADS,
    chunk_size: int = CHUNK_SIZE,
) -> ChunkStream:
    """A tar.zst of the directory ``root`` whose members are paths relative to it (``a.txt``, ``d/b``;
    ``root`` itself is no member), streamed in chunks as :func:`pack` does."""
    return _pack({"": Path(root)}, exclude, level, threads, chunk_size)


def _pack(
    names: Mapping[str, Path], exclude: Collection[Path], level: int, threads: int, chunk_size: int
) -> ChunkStream:
    skip = {os.path.abspath(p) for p in exclude}

    def produce(out: ChunkStream) -> None:
        cctx = zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=True)
        with cctx.stream_writer(cast(IO[bytes], out), write_size=chunk_size, closefd=False) as z:
            # tarfile's own stream mode ("w|") re-copies its buffer on every 16 KiB write (a third of the
            # CPU of a checkpoint, measured); plain "w" mode over a writer that never seeks does no such
            # thing and writes each file in 1 MiB blocks straight into zstd.
            sink = cast(IO[bytes], _Forward(z))
            with tarfile.TarFile(
                fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, copybufsize=COPY_SIZE
            ) as tar:
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
                if not name and rel == ".":
                    continue  # a tree's root is where it is unpacked, not a member
                posix = Path(rel).as_posix()
                member = name if rel == "." else f"{name}/{posix}" if name else posix
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
        if os.path.isabs(target) or not within(os.path.realpath(path), real_root):
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
        while block := reader.read(COPY_SIZE):
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
