"""The node's cache of Volume revisions (ADR-0036): each revision extracted once per node, then mounted
read-only by every run that reads it, within a disk budget.

A revision is a blob named by its sha256, so an entry never changes once made and needs no invalidation:
only room. Under ``root`` (``<agent workdir>/cache``)::

    blobs/<hex>/            one extracted revision: what runs mount (its files and folders made read-only)
    staging/<hex>/tree/     a revision being fetched; renamed to blobs/<hex> only once complete and verified
    trash/                  evicted entries on their way out (renamed there first: an eviction is atomic)
    locks/<hex>.fetch       held exclusively while a revision is looked up, fetched or evicted
    locks/<hex>.use         held shared by every lease of the revision; an evictor needs it exclusively
    locks/index             held while the index is read and written
    index.json              each entry's size, and the reservations of fetches in flight

Why file locks (``flock``) and not only asyncio locks: two agents on one node (a restart overlapping its
predecessor, simulated fleets) share the folder, and a lock dies with its process, so a killed agent
holds nothing. Within one process an asyncio lock per revision comes first, so concurrent first uses
wait on each other without a thread each. Recency (for least recently used eviction) is each entry
folder's modification time, set on every acquire and release: it survives restarts without a write to
the index per use. The index only keeps sizes (measuring a large tree again costs a walk) and survives
being lost: the folders on disk are the truth, and it is rebuilt from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from nodus_agent.inputstaging import offload
from nodus_agent.keyedlocks import KeyedLocks
from nodus_schema.volumes import BLOB_PATTERN

__all__ = ["BUDGET_SETTING", "CacheLease", "MountError", "VolumeCache"]

log = logging.getLogger(__name__)

BUDGET_SETTING: Final = "NODUS_AGENT_CACHE_BYTES"
CACHE_DIR: Final = "_cache"
"""The cache's folder in the agent's work directory: beside the ``<namespace>/`` folders of attempts, and,
like ``_outbox``, a name no project can have."""
"""The agent's setting of the cache's budget: what an error tells the operator to raise."""
_HEX_LEN: Final = 64

Fetch = Callable[[Path], Awaitable[None]]
"""Fills the (empty, existing) folder it is given with a revision's files; raises if it cannot."""


class MountError(Exception):
    """A Volume or Workspace could not be mounted (or a writable mount committed); the message says what
    to change. ``retryable``: True when a second try may work (the store away, the cache full of entries
    in use), False when only a change to the Job, the Volume or the node's settings can help."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass
class CacheLease:
    """One use of a cached revision: the entry is not evicted until :meth:`release` (idempotent)."""

    path: Path
    """The extracted revision (read-only)."""
    hit: bool
    """True when the entry was there already and nothing was downloaded."""
    millis: int
    """How long :meth:`VolumeCache.acquire` took (download and extraction included)."""
    digest: str = ""
    _use_fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._use_fd is None:
            return
        fd, self._use_fd = self._use_fd, None
        with contextlib.suppress(OSError):
            os.utime(self.path)  # recency: an entry used for a week was used recently
        os.close(fd)  # drops the shared lock: an evictor may take the entry now

    @property
    def released(self) -> bool:
        return self._use_fd is None


class _Entry(msgspec.Struct):
    size: int
    ready: bool = True
    """False for a reservation: a fetch in flight that counts against the budget already."""


class _Index(msgspec.Struct):
    entries: dict[str, _Entry] = msgspec.field(default_factory=dict)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Index)
_Change = Callable[[_Index, str, int, list[Path]], None]
"""A change of the index under its lock: (index, revision, size, trash to empty afterwards)."""


class VolumeCache:
    """Extracted revisions under ``root``, least recently used evicted first to stay within
    ``budget_bytes`` (the extracted size), never an entry in use."""

    def __init__(self, root: Path, budget_bytes: int) -> None:
        self.root, self.budget_bytes = Path(root), budget_bytes
        self.downloads = 0
        """Fetches this process started (a test's proof that a hit downloaded nothing)."""
        self._locks: KeyedLocks[str] = KeyedLocks()
        for sub in ("blobs", "staging", "trash", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._clear_leftovers()

    def entry(self, digest: str) -> Path:
        """Where the revision ``digest`` is (or would be) extracted."""
        return self.root / "blobs" / _hex(digest)

    async def acquire(self, digest: str, size_bytes: int, fetch: Fetch) -> CacheLease:
        """A lease on the extracted revision ``digest`` (``sha256:<hex>``), fetched with ``fetch`` unless
        cached. ``size_bytes``: what it is expected to take (its archive's size), reserved before the fetch.

        Concurrent acquires of one revision fetch it once. Raises :class:`MountError`: not retryable for
        a revision larger than the whole budget, retryable when the entries in use leave no room; whatever
        ``fetch`` raises passes through, and leaves no entry behind."""
        began = time.monotonic()
        hexdigest = _hex(digest)
        async with self._locks.hold(hexdigest):
            fetch_fd = await _lock(self._lock_path(hexdigest, "fetch"), fcntl.LOCK_EX)
            try:
                use_fd = await _lock(self._lock_path(hexdigest, "use"), fcntl.LOCK_SH)
                try:
                    hit = await asyncio.to_thread(self._ready, hexdigest)
                    if not hit:
                        self._check_budget(digest, size_bytes)
                        await self._fill(hexdigest, size_bytes, fetch)
                except BaseException:
                    os.close(use_fd)
                    raise
            finally:
                os.close(fetch_fd)
        path = self.root / "blobs" / hexdigest
        with contextlib.suppress(OSError):
            os.utime(path)
        millis = int((time.monotonic() - began) * 1000)
        return CacheLease(path=path, hit=hit, millis=millis, digest=digest, _use_fd=use_fd)

    def usage(self) -> int:
        """Bytes the index counts (entries and reservations)."""
        return sum(e.size for e in self._load().entries.values())

    # -- making an entry ---------------------------------------------------------------------------------
    def _check_budget(self, digest: str, size_bytes: int) -> None:
        if size_bytes > self.budget_bytes:
            raise MountError(
                f"revision {digest} is {size_bytes} bytes, more than this node's whole Volume cache "
                f"({self.budget_bytes} bytes); raise {BUDGET_SETTING} on the node, or mount a smaller "
                "revision",
                retryable=False,
            )

    async def _fill(self, hexdigest: str, size_bytes: int, fetch: Fetch) -> None:
        """Fetch into staging and rename into place (the caller holds the revision's fetch lock)."""
        stage = self.root / "staging" / hexdigest
        tree = stage / "tree"
        await offload(_remove, stage)  # a killed fetch's leftovers: ours, since we hold the lock
        await offload(self._with_index, self._reserve, hexdigest, size_bytes)
        try:
            await offload(tree.mkdir, 0o755, True)
            self.downloads += 1
            await fetch(tree)
            actual = await offload(_tree_size, tree)
            if actual > self.budget_bytes:
                raise MountError(
                    f"revision sha256:{hexdigest} holds {actual} bytes extracted, more than this node's "
                    f"whole Volume cache ({self.budget_bytes} bytes); raise {BUDGET_SETTING} on the node",
                    retryable=False,
                )
            await offload(_seal, tree)
            await offload(_rename_into_place, tree, self.root / "blobs" / hexdigest)
            await offload(os.chmod, self.root / "blobs" / hexdigest, 0o555)
            await offload(self._with_index, self._settle, hexdigest, actual)
        except BaseException:
            await asyncio.shield(offload(_remove, stage))
            await asyncio.shield(offload(self._with_index, self._unreserve, hexdigest, 0))
            raise
        await offload(_remove, stage)

    # -- the index (every method below runs in a worker thread) ----------------------------------------------
    def _with_index(self, change: _Change, hexdigest: str, size: int) -> None:
        """Run ``change`` on the index under its lock and save it (also when ``change`` raises: what it
        evicted on the way is gone either way); then empty the trash it made, outside the lock, as
        removing a large tree takes a while."""
        trash: list[Path] = []
        fd = os.open(self.root / "locks" / "index", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            index = self._load()
            try:
                change(index, hexdigest, size, trash)
            finally:
                self._save(index)
        finally:
            os.close(fd)
            for path in trash:
                _remove(path)

    def _reserve(self, index: _Index, hexdigest: str, size: int, trash: list[Path]) -> None:
        self._evict(index, size, hexdigest, trash)
        used = sum(e.size for h, e in index.entries.items() if h != hexdigest)
        if used + size > self.budget_bytes:
            raise MountError(
                f"this node's Volume cache ({self.budget_bytes} bytes) is held by revisions in use "
                f"({used} bytes) and cannot take sha256:{hexdigest} ({size} bytes) now; the run is tried "
                f"again, and {BUDGET_SETTING} on the node may be raised",
                retryable=True,
            )
        index.entries[hexdigest] = _Entry(size=size, ready=False)

    def _settle(self, index: _Index, hexdigest: str, size: int, trash: list[Path]) -> None:
        index.entries[hexdigest] = _Entry(size=size)
        self._evict(index, 0, hexdigest, trash)  # extracted may be more than the archive reserved
        over = sum(e.size for e in index.entries.values()) - self.budget_bytes
        if over > 0:
            log.warning("the Volume cache is %d bytes over its budget: every other entry is in use", over)

    def _unreserve(self, index: _Index, hexdigest: str, size: int, trash: list[Path]) -> None:
        entry = index.entries.get(hexdigest)
        if entry is not None and not entry.ready:
            del index.entries[hexdigest]

    def _evict(self, index: _Index, room: int, keep: str, trash: list[Path]) -> None:
        """Evict ready entries, least recently used first, until ``room`` more bytes fit; skip ``keep``
        and every entry in use or being fetched. What goes is added to ``trash``."""
        used = sum(e.size for h, e in index.entries.items() if h != keep)
        for hexdigest in self._by_recency(index, keep):
            if used + room <= self.budget_bytes:
                break
            gone = self._take_out(hexdigest)
            if gone is not None:
                trash.append(gone)
                used -= index.entries.pop(hexdigest).size

    def _by_recency(self, index: _Index, keep: str) -> list[str]:
        found: list[tuple[int, str]] = []
        for hexdigest, entry in index.entries.items():
            if hexdigest == keep or not entry.ready:
                continue
            with contextlib.suppress(FileNotFoundError):
                found.append((os.lstat(self.root / "blobs" / hexdigest).st_mtime_ns, hexdigest))
        return [h for _, h in sorted(found)]

    def _take_out(self, hexdigest: str) -> Path | None:
        """Move an entry nobody uses or fetches into the trash; None when it is busy."""
        fetch_fd = _try_lock(self._lock_path(hexdigest, "fetch"))
        if fetch_fd is None:
            return None
        try:
            use_fd = _try_lock(self._lock_path(hexdigest, "use"))
            if use_fd is None:
                return None
            try:
                gone = self.root / "trash" / f"{hexdigest}-{secrets.token_hex(4)}"
                entry = self.root / "blobs" / hexdigest
                os.chmod(entry, 0o755)  # a sealed folder cannot move to another parent (its ".." changes)
                os.replace(entry, gone)
            finally:
                os.close(use_fd)
        finally:
            os.close(fetch_fd)
        log.info("evicted Volume revision sha256:%s from the node's cache", hexdigest)
        return gone

    def _load(self) -> _Index:
        """The index reconciled with the disk: folders are entries (sizes measured when unknown), entries
        without a folder are dropped, and reservations nobody fetches any more (their fetcher died) too."""
        try:
            index = _decoder.decode((self.root / "index.json").read_bytes())
        except (FileNotFoundError, msgspec.DecodeError):
            index = _Index()
        on_disk = {p.name for p in (self.root / "blobs").iterdir() if _is_hex(p.name)}
        for hexdigest in on_disk:
            known = index.entries.get(hexdigest)
            if known is None or not known.ready:
                index.entries[hexdigest] = _Entry(size=_tree_size(self.root / "blobs" / hexdigest))
        for hexdigest, entry in list(index.entries.items()):
            gone = hexdigest not in on_disk if entry.ready else self._unclaimed(hexdigest)
            if gone:
                del index.entries[hexdigest]
        return index

    def _save(self, index: _Index) -> None:
        tmp = self.root / "index.json.tmp"
        tmp.write_bytes(_encoder.encode(index))
        os.replace(tmp, self.root / "index.json")

    def _unclaimed(self, hexdigest: str) -> bool:
        fd = _try_lock(self._lock_path(hexdigest, "fetch"))
        if fd is None:
            return False
        os.close(fd)
        return True

    def _ready(self, hexdigest: str) -> bool:
        return (self.root / "blobs" / hexdigest).is_dir()

    def _lock_path(self, hexdigest: str, what: str) -> Path:
        return self.root / "locks" / f"{hexdigest}.{what}"

    def _clear_leftovers(self) -> None:
        """What a killed agent left: half-fetched revisions (unless another agent is fetching them now)
        and trash not yet emptied."""
        for stage in (self.root / "staging").iterdir():
            if _is_hex(stage.name) and self._unclaimed(stage.name):
                _remove(stage)
        for gone in (self.root / "trash").iterdir():
            _remove(gone)


# -- helpers -------------------------------------------------------------------------------------------------
def _hex(digest: str) -> str:
    if BLOB_PATTERN.fullmatch(digest):
        return digest.removeprefix("sha256:")
    if _is_hex(digest):
        return digest
    raise MountError(f"{digest!r} is not a blob digest (sha256:<64 lower case hex digits>)", retryable=False)


def _is_hex(name: str) -> bool:
    return len(name) == _HEX_LEN and all(c in "0123456789abcdef" for c in name)


async def _lock(path: Path, mode: int) -> int:
    """An open descriptor of ``path`` holding an ``flock`` of ``mode``; closing it releases the lock. Waits
    in a thread; if cancelled meanwhile, the lock is released as soon as the thread gets it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    task = asyncio.ensure_future(asyncio.to_thread(fcntl.flock, fd, mode))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda _: os.close(fd))
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd


def _try_lock(path: Path) -> int | None:
    """An exclusive ``flock`` of ``path`` if nobody holds one (any process, this one too), else None."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _tree_size(root: Path) -> int:
    """Bytes of the regular files under ``root`` (links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def _seal(root: Path) -> None:
    """Take every write bit off an entry's files and folders: under the process runtime a program runs as
    the agent's user, and must not change a revision other runs read (a container mounts it read-only)."""
    for dirpath, dirs, files in os.walk(root, topdown=False):
        for name in [*files, *dirs]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o222)
    # The root is sealed once renamed into place: moving a folder to another parent needs its write bit.


def _rename_into_place(tree: Path, entry: Path) -> None:
    os.replace(tree, entry)
    fd = os.open(entry.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename is durable before anyone is told the entry exists
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    """Remove a file or tree, read-only folders (sealed entries) included; nothing there is no error."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        os.chmod(path, 0o700)
        for dirpath, dirs, _ in os.walk(path):
            for name in dirs:
                sub = os.path.join(dirpath, name)
                if not os.path.islink(sub):
                    with contextlib.suppress(OSError):
                        os.chmod(sub, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
