"""What the agent's archives are: their layout, names, settings, errors and the stats of a stream.

Checkpoints and outputs travel as tar compressed with zstandard, streamed without the whole archive ever in
memory or on disk: :mod:`nodus_agent.packing` makes them, :mod:`nodus_agent.unpacking` restores them, and
:mod:`nodus_agent.chunkstreams` carries their bytes between a worker thread and the event loop. This module
holds what those three (and the callers that name archives and catch their errors) share.

Archive layout: every member is ``<name>/<path inside the source>`` where ``name`` is the source's
archive name (a relative POSIX path, e.g. ``nodus/state``); a source that is a file is the member
``<name>`` itself. Regular files, directories and symbolic links are stored; a symbolic link is stored as
a link, never followed, and only when it resolves inside its own source (one that escapes is left out and
named in :attr:`StreamStats.skipped`, because unpacking refuses such links). Sockets, FIFOs and
devices are left out the same way. Owners are kept as numbers (restored when the agent runs as root, so a
container's non-root user can still write its state); modification times are kept to the second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

MiB = 1 << 20
CHUNK_SIZE = 8 * MiB
"""Bytes per chunk handed to the event loop (and so at least one S3 part's worth with 5 MiB parts)."""
LEVEL = 1
"""zstd level 1: measured here 280 MiB/s of text and 670 MiB/s of random bytes per core, against 190 and
610 at zstd's default 3, for a smaller result on our text (0.106 vs 0.140). A checkpoint is mostly
weights and optimizer state that hardly compress, and its time is lost training: speed first (ADR-0019)."""
THREADS = min(4, (os.cpu_count() or 1) // 8)
"""zstd worker threads beside the packing thread: none on small machines (the upload and the program need
the cores), up to 4 on a GPU host with 32 cores or more, where one core would cap a checkpoint at
about 600 MB/s."""
COPY_SIZE = 1 * MiB
"""Read size for file contents and tar's own buffer, packing and unpacking."""
ARCHIVE_SUFFIX = "tar.zst"
"""The file name suffix of an archive made by :func:`nodus_agent.packing.pack`."""


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


def check_name(name: str) -> str:
    """An archive name: a relative POSIX path without ``.`` or ``..`` parts; returned as given."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in name:
        raise ValueError(f"archive name {name!r} must be a relative path such as 'nodus/state'")
    return name


def check_disjoint(names: list[str]) -> None:
    """No archive name may lie inside another: their members would collide."""
    for a in names:
        for b in names:
            if a != b and b.startswith(a + "/"):
                raise ValueError(f"{b!r} lies inside {a!r}: archive the outer path only")


def within(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies under it (both absolute, links already resolved)."""
    return path == root or path.startswith(root.rstrip("/") + "/")
