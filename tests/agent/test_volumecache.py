"""The node's Volume cache on a real file system: hits, one download for concurrent first uses, least
recently used eviction within the budget that never takes an entry in use (in this process or another
cache on the same folder, as a second agent would be), fetches that fail or are cancelled, and what a
killed agent leaves behind."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from nodus_agent.volumecache import BUDGET_SETTING, MountError, VolumeCache
from nodus_testing.waiting import eventually


def digest(tag: str) -> str:
    return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()


class Source:
    """A fetch that writes ``size`` bytes per revision and counts its calls; ``gate`` holds it mid-way."""

    def __init__(self, size: int = 100, gate: asyncio.Event | None = None) -> None:
        self.size, self.gate = size, gate
        self.calls: list[Path] = []

    def fetch(self, tag: str) -> Callable[[Path], Awaitable[None]]:
        async def run(into: Path) -> None:
            self.calls.append(into)
            (into / "sub").mkdir()
            (into / "sub" / "data.bin").write_bytes(tag.encode().ljust(self.size, b"."))
            if self.gate is not None:
                await self.gate.wait()

        return run


def age(cache: VolumeCache, tag: str, seconds_ago: float) -> None:
    """Recency is the entry's modification time: set it, as a use that long ago would have."""
    when = time.time() - seconds_ago
    os.utime(cache.entry(digest(tag)), (when, when))


async def test_a_second_acquire_is_a_hit_and_downloads_nothing(tmp_path: Path) -> None:
    cache, source = VolumeCache(tmp_path / "cache", 10_000), Source()
    first = await cache.acquire(digest("a"), 100, source.fetch("a"))
    first.release()
    second = await cache.acquire(digest("a"), 100, source.fetch("a"))

    assert (first.hit, second.hit) == (False, True)
    assert cache.downloads == 1 and len(source.calls) == 1
    assert second.path == tmp_path / "cache" / "blobs" / digest("a").removeprefix("sha256:")
    assert (second.path / "sub" / "data.bin").read_bytes().startswith(b"a.")
    # Sealed: a program run as the agent's user (the process runtime) cannot change what others read.
    assert (second.path / "sub" / "data.bin").stat().st_mode & 0o222 == 0
    assert (second.path / "sub").stat().st_mode & 0o222 == 0
    second.release()
    second.release()  # idempotent


async def test_concurrent_first_acquires_download_once(tmp_path: Path) -> None:
    gate = asyncio.Event()
    cache, source = VolumeCache(tmp_path / "cache", 10_000), Source(gate=gate)
    tasks = [asyncio.ensure_future(cache.acquire(digest("a"), 100, source.fetch("a"))) for _ in range(5)]
    await eventually(lambda: len(source.calls) == 1, message="the first fetch never started")
    gate.set()
    leases = await asyncio.gather(*tasks)

    assert len(source.calls) == 1 and cache.downloads == 1
    assert [lease.hit for lease in leases].count(False) == 1
    assert len({lease.path for lease in leases}) == 1
    for lease in leases:
        lease.release()


async def test_least_recently_used_is_evicted_first_and_an_entry_in_use_never(tmp_path: Path) -> None:
    cache, source = VolumeCache(tmp_path / "cache", 300), Source(size=100)
    held = await cache.acquire(digest("held"), 100, source.fetch("held"))
    for tag in ("old", "new"):
        (await cache.acquire(digest(tag), 100, source.fetch(tag))).release()
    age(cache, "held", 3600)  # the oldest of all, but in use
    age(cache, "old", 600)
    age(cache, "new", 60)

    (await cache.acquire(digest("next"), 100, source.fetch("next"))).release()

    assert held.path.is_dir() and cache.entry(digest("new")).is_dir()
    assert not cache.entry(digest("old")).exists()
    assert cache.usage() == 300
    assert list((tmp_path / "cache" / "trash").iterdir()) == []
    held.release()


async def test_a_cache_full_of_entries_in_use_refuses_for_now(tmp_path: Path) -> None:
    cache, source = VolumeCache(tmp_path / "cache", 200), Source(size=100)
    leases = [await cache.acquire(digest(t), 100, source.fetch(t)) for t in ("a", "b")]

    with pytest.raises(MountError, match="held by revisions in use") as e:
        await cache.acquire(digest("c"), 100, source.fetch("c"))
    assert e.value.retryable and BUDGET_SETTING in str(e.value)
    assert not cache.entry(digest("c")).exists() and cache.usage() == 200

    leases[0].release()
    (await cache.acquire(digest("c"), 100, source.fetch("c"))).release()
    assert not cache.entry(digest("a")).exists() and leases[1].path.is_dir()
    leases[1].release()


async def test_another_agent_on_the_same_folder_never_evicts_what_this_one_uses(tmp_path: Path) -> None:
    ours, theirs = VolumeCache(tmp_path / "cache", 200), VolumeCache(tmp_path / "cache", 200)
    source = Source(size=100)
    held = await ours.acquire(digest("a"), 100, source.fetch("a"))
    (await ours.acquire(digest("b"), 100, source.fetch("b"))).release()
    age(ours, "a", 3600)

    hit = await theirs.acquire(digest("b"), 100, source.fetch("b"))
    assert hit.hit and len(source.calls) == 2  # their hit on our entry: no download
    hit.release()
    (await theirs.acquire(digest("c"), 100, source.fetch("c"))).release()

    assert held.path.is_dir() and not ours.entry(digest("b")).exists()
    held.release()


async def test_a_revision_larger_than_the_budget_is_refused_naming_the_setting(tmp_path: Path) -> None:
    cache, source = VolumeCache(tmp_path / "cache", 1000), Source(size=2000)
    with pytest.raises(MountError, match=BUDGET_SETTING) as e:
        await cache.acquire(digest("a"), 5000, source.fetch("a"))
    assert not e.value.retryable and source.calls == []
    # Announced small, extracted large: refused after the fetch, and nothing is kept.
    with pytest.raises(MountError, match="extracted") as e:
        await cache.acquire(digest("a"), 10, source.fetch("a"))
    assert not e.value.retryable and not cache.entry(digest("a")).exists() and cache.usage() == 0


async def test_a_failed_or_cancelled_fetch_leaves_no_entry(tmp_path: Path) -> None:
    cache = VolumeCache(tmp_path / "cache", 10_000)

    async def broken(into: Path) -> None:
        (into / "half.bin").write_bytes(b"x" * 50)
        raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset"):
        await cache.acquire(digest("a"), 100, broken)
    gate = asyncio.Event()
    source = Source(gate=gate)
    task = asyncio.ensure_future(cache.acquire(digest("a"), 100, source.fetch("a")))
    await eventually(lambda: len(source.calls) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert not cache.entry(digest("a")).exists() and cache.usage() == 0
    assert list((tmp_path / "cache" / "staging").iterdir()) == []
    gate.set()
    lease = await cache.acquire(digest("a"), 100, source.fetch("a"))
    assert not lease.hit and (lease.path / "sub" / "data.bin").is_file()
    lease.release()


async def test_a_killed_agent_leaves_no_half_entry_and_the_index_survives_a_restart(tmp_path: Path) -> None:
    cache, source = VolumeCache(tmp_path / "cache", 10_000), Source()
    (await cache.acquire(digest("a"), 100, source.fetch("a"))).release()
    # What a kill mid-fetch leaves: a staging folder (and nothing under blobs/), and an unsaved trash.
    hexdigest = digest("b").removeprefix("sha256:")
    (tmp_path / "cache" / "staging" / hexdigest / "tree").mkdir(parents=True)
    (tmp_path / "cache" / "staging" / hexdigest / "tree" / "half.bin").write_bytes(b"x")
    (tmp_path / "cache" / "trash" / "gone").mkdir()

    again = VolumeCache(tmp_path / "cache", 10_000)
    lease = await again.acquire(digest("a"), 100, source.fetch("a"))

    assert lease.hit and again.downloads == 0 and again.usage() == 100
    assert list((tmp_path / "cache" / "staging").iterdir()) == []
    assert list((tmp_path / "cache" / "trash").iterdir()) == []
    assert not again.entry(digest("b")).exists()
    lease.release()
    # A lost index is rebuilt from the folders on disk.
    (tmp_path / "cache" / "index.json").unlink()
    assert VolumeCache(tmp_path / "cache", 10_000).usage() == 100


async def test_a_bad_digest_is_refused(tmp_path: Path) -> None:
    cache = VolumeCache(tmp_path / "cache", 10_000)
    with pytest.raises(MountError, match="not a blob digest"):
        await cache.acquire("sha256:../../etc", 1, Source().fetch("x"))
