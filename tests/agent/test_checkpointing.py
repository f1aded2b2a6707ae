"""Checkpoints streamed to S3 and restored, against the session's real SeaweedFS.

Each test has its own bucket (``unique``). Kills and cancellations are placed deterministically through
the upload's per-part hook (``on_part``): a cancel, or a SIGKILL of a child process, right after the first
part is stored, so an upload is always caught half-way without any timing guess.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import signal
import stat
import sys
import tarfile
import textwrap
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import zstandard

from nodus_agent import archiving, chunkstreams, packing, unpacking, uploading
from nodus_agent.checkpointing import (
    DONE_FILE,
    READY_FILE,
    REQUEST_FILE,
    CheckpointCorrupt,
    Checkpointer,
    CheckpointInfo,
    CheckpointTooLarge,
    archive_name,
    checkpoint_interval,
    checkpoint_prefix,
    next_due,
)
from nodus_testing.seaweed import SeaweedS3
from nodus_testing.waiting import eventually

if TYPE_CHECKING:  # the fixtures' type; the fixtures themselves are tests/agent/conftest.py's
    from tests.agent.conftest import Store

MiB = 1 << 20
STATE = "/nodus/state"


# -- helpers ----------------------------------------------------------------------------------------------
def make_state(root: Path, random_mib: int = 1, text_mib: int = 1) -> None:
    """A program's state: incompressible shards, compressible logs, a subdirectory, a link, an empty file
    and directory, and the agent's control directory (never archived)."""
    (root / "weights").mkdir(parents=True)
    shards = 3
    for i in range(shards):
        (root / "weights" / f"shard-{i}.bin").write_bytes(os.urandom(random_mib * MiB // shards))
    block = b"".join(
        b"step %06d loss %.6f lr %.3e\n" % (i, 1 / (i + 1), 3e-4 * 0.999**i) for i in range(60_000)
    )
    with open(root / "train.log", "wb") as f:
        written = 0
        while written < text_mib * MiB:
            piece = block[: text_mib * MiB - written]
            f.write(piece)
            written += len(piece)
    (root / "optim").mkdir()
    (root / "optim" / "state.json").write_text(json.dumps({"step": 1234, "lr": "3e-4"}))
    (root / "optim" / "empty").write_bytes(b"")
    (root / "optim" / "nothing-yet").mkdir()
    os.chmod(root / "optim" / "state.json", 0o640)
    os.symlink("weights/shard-0.bin", root / "latest-shard")
    (root / ".nodus").mkdir()
    (root / ".nodus" / "scratch").write_text("agent control files")


def tree(root: Path, skip: tuple[str, ...] = (".nodus",)) -> dict[str, tuple[str, str]]:
    """Everything under root as {relative path: (kind, sha256 or link target)} with permission bits."""
    found: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip or Path(dirpath) != root]
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            mode = oct(stat.S_IMODE(st.st_mode))
            if p.is_symlink():
                found[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                found[rel] = ("dir", mode)
            else:
                found[rel] = (f"file {mode}", hashlib.sha256(p.read_bytes()).hexdigest())
    return found


def checkpointer(store: Store, attempt: str = "job-a-0-a1", index: int = 0, **kw: Any) -> Checkpointer:
    kw.setdefault("part_size", 5 * MiB)
    return Checkpointer(
        store.client,
        store.bucket,
        namespace="team-a",
        job="train",
        index=index,
        attempt=attempt,
        root=store.root,
        **kw,
    )


async def keys(store: Store) -> list[str]:
    """This test's keys, without its prefix."""
    objects = await uploading.list_objects(store.client, store.bucket, store.root)
    return [o["Key"][len(store.root) :] for o in objects]


# -- the schedule and names (pure) ------------------------------------------------------------------------
def test_auto_interval_is_30m_until_measured_then_youngs_rule() -> None:
    assert checkpoint_interval(None) == timedelta(minutes=30)
    assert checkpoint_interval("auto") == timedelta(minutes=30)
    on_demand = checkpoint_interval("auto", last_cost=timedelta(seconds=30))
    reclaimable = checkpoint_interval("auto", last_cost=timedelta(seconds=30), interruptible=True)
    assert timedelta(minutes=37) < on_demand < timedelta(minutes=38)  # sqrt(2 x 30 s x 24 h)
    assert timedelta(minutes=15) < reclaimable < timedelta(minutes=16)  # sqrt(2 x 30 s x 4 h)
    assert checkpoint_interval("auto", last_cost=timedelta(seconds=1)) == timedelta(minutes=10)
    assert checkpoint_interval("auto", last_cost=timedelta(hours=1)) == timedelta(hours=2)
    assert checkpoint_interval("15m") == timedelta(minutes=15)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert next_due(start, "1h30m") == start + timedelta(minutes=90)


@pytest.mark.parametrize("bad", ["30s", "7h", "soon"])
def test_interval_outside_1m_to_6h_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"interval|duration"):
        checkpoint_interval(bad)


def test_program_paths_become_archive_names() -> None:
    assert archive_name("/nodus/state") == "nodus/state"
    for bad in ("nodus/state", "/nodus/../etc", "/", "/a//b"):
        with pytest.raises(ValueError, match="absolute, normalised"):
            archive_name(bad)
    assert checkpoint_prefix("team-a", "train", 3, rank=1) == "team-a/train/3/checkpoints/rank-1/"
    with pytest.raises(ValueError, match="not a valid object name"):
        checkpoint_prefix("team-a", "../x", 0)


# -- extraction refuses what could escape its target ----------------------------------------------------
def hostile(members: list[tuple[str, str, str]]) -> bytes:
    """A tar.zst of (name, kind, data-or-link-target) members, as an attacker would write it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data.encode()))
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.type = {"link": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
                info.linkname = data
                tar.addfile(info)
    return zstandard.ZstdCompressor().compress(raw.getvalue())


async def chunks_of(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


HOSTILE = {
    "parent": [("nodus/state/../../evil", "file", "x")],
    "absolute": [("/tmp/evil", "file", "x")],
    "absolute link": [("nodus/state/l", "link", "/etc")],
    "escaping link": [("nodus/state/l", "link", "../../outside")],
    "link chain": [
        ("nodus/state/sub", "dir", ""),
        ("nodus/state/m", "link", "sub/up/.."),
        ("nodus/state/sub/up", "link", ".."),
    ],
    "write through a link": [("nodus/state/a", "link", "sub"), ("nodus/state/a/f", "file", "x")],
    "hard link": [("nodus/state/h", "hard", "/etc/passwd")],
    "fifo": [("nodus/state/p", "fifo", "")],
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_extract_refuses_members_that_escape(tmp_path: Path, case: str) -> None:
    target = tmp_path / "attempt" / "state"
    target.mkdir(parents=True)
    (target / "keep").write_text("was here")
    data = hostile([("nodus/state/ok", "file", "fine"), *HOSTILE[case]])
    with pytest.raises(archiving.UnsafeArchive):
        await unpacking.unpack(chunks_of(data), {"nodus/state": target})
    assert sorted(os.listdir(target)) == ["keep"], "a refused archive must leave the target untouched"
    assert sorted(os.listdir(tmp_path / "attempt")) == ["state"], "the staging directory is removed"
    assert not (tmp_path / "evil").exists() and not (tmp_path / "outside").exists()


async def test_pack_stores_links_inside_and_skips_those_that_escape(tmp_path: Path) -> None:
    src = tmp_path / "state"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f").write_text("data")
    os.symlink("sub/f", src / "inside")
    os.symlink("../../etc/passwd", src / "climbs")
    os.symlink("/etc/passwd", src / "absolute")
    os.mkfifo(src / "pipe")
    async with packing.pack({"nodus/state": src}) as stream:
        data = await chunkstreams.collect(stream)
    assert sorted(s.split(":")[0] for s in stream.stats.skipped) == [
        "nodus/state/absolute",
        "nodus/state/climbs",
        "nodus/state/pipe",
    ]
    out = tmp_path / "restored"
    await unpacking.unpack(chunks_of(data), {"nodus/state": out}, sha256=stream.stats.sha256, size=len(data))
    assert os.readlink(out / "inside") == "sub/f"
    assert (out / "inside").read_text() == "data"
    assert sorted(os.listdir(out)) == ["inside", "sub"]


async def test_incompressible_files_are_stored_in_raw_frames_any_zstd_reads(tmp_path: Path) -> None:
    src = tmp_path / "state"
    src.mkdir()
    noise = os.urandom(3 * MiB)
    (src / "noise.bin").write_bytes(noise)
    (src / "log.txt").write_bytes(b"loss 0.5\n" * 300_000)
    async with packing.pack({"nodus/state": src}) as stream:
        data = await chunkstreams.collect(stream)
    assert data.count(b"\x28\xb5\x2f\xfd\x00\x38") == 1, "one stored frame: the random file's"
    assert len(noise) < len(data) < len(noise) + 64 * 1024, "random bytes pass as they are, text shrinks"
    plain = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        member = tar.extractfile("nodus/state/noise.bin")
        assert member is not None and member.read() == noise


# -- S3: a 200 MB state, byte for byte --------------------------------------------------------------------
@pytest.mark.s3
@pytest.mark.slow
async def test_200mb_state_restores_byte_identical_in_a_new_attempt(store: Store, tmp_path: Path) -> None:
    state = tmp_path / "a1" / "state"
    make_state(state, random_mib=120, text_mib=80)
    first = checkpointer(store, part_size=16 * MiB, control_dir=state / ".nodus")
    info = await first.take({STATE: state}, "Interval")

    raw = sum(p.stat().st_size for p in state.rglob("*") if p.is_file() and not p.is_symlink())
    raw -= (state / ".nodus" / "scratch").stat().st_size
    assert (info.sequence, info.reason, info.paths, info.raw_bytes) == (1, "Interval", [STATE], raw)
    assert 120 * MiB < info.size_bytes < 160 * MiB, "the random shards do not compress, the log does"
    assert info.key == f"{store.root}team-a/train/0/checkpoints/ckpt-00000001.tar.zst"
    assert info == await first.latest()
    assert info.consistent is False, "the program did not opt in to the contract"

    # A replacement Attempt (another name, a fresh directory) restores the index's latest checkpoint.
    fresh = tmp_path / "a2" / "state"
    second = checkpointer(store, attempt="job-a-0-a2")
    restored = await second.restore({STATE: fresh})
    assert restored == info
    assert tree(fresh) == tree(state)
    assert not (fresh / ".nodus").exists(), "the control directory is never archived"
    assert sorted(os.listdir(fresh.parent)) == ["state"], "no staging directory left behind"


# -- S3: kills and cancellations half-way -----------------------------------------------------------------
@pytest.mark.s3
async def test_upload_cancelled_half_way_leaves_latest_and_no_open_upload(
    store: Store, tmp_path: Path
) -> None:
    client, bucket = store.client, store.bucket
    state = tmp_path / "state"
    make_state(state, random_mib=1, text_mib=1)
    before = await checkpointer(store).take({STATE: state}, "Interval")
    (state / "weights" / "big.bin").write_bytes(os.urandom(12 * MiB))

    parts: list[int] = []
    task: asyncio.Task[CheckpointInfo] | None = None

    def cancel_after_first_part(number: int, size: int) -> None:
        parts.append(number)
        assert task is not None
        task.cancel()

    ck = checkpointer(store, on_part=cancel_after_first_part)
    task = asyncio.ensure_future(ck.take({STATE: state}, "Suspend"))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert parts, "the upload was under way when it was cancelled"
    assert await ck.latest() == before
    assert await uploading.open_uploads(client, bucket, ck.prefix) == []
    assert await uploading.get_bytes(client, bucket, ck.archive_key(2)) is None

    again = await checkpointer(store).take({STATE: state}, "Suspend")
    assert again.sequence == 2, "the number of the aborted checkpoint is used again"


CRASHING_CHILD = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from pathlib import Path
    from nodus_agent import s3
    from nodus_agent.checkpointing import Checkpointer

    endpoint, key, secret, bucket, root, state = sys.argv[1:]

    def die(number, size):
        os.kill(os.getpid(), signal.SIGKILL)  # the agent's host dies right after a part is stored

    async def main():
        settings = s3.S3Settings(bucket=bucket, endpoint=endpoint, access_key=key, secret_key=secret)
        async with s3.client(settings) as client:
            ck = Checkpointer(client, bucket, namespace="team-a", job="train", index=0,
                              attempt="job-a-0-a1", root=root, part_size=5 << 20, on_part=die)
            await ck.take({"/nodus/state": Path(state)}, "Preemption")

    asyncio.run(main())
    """
)


@pytest.mark.s3
async def test_agent_killed_mid_upload_then_replacement_restores_previous_and_sweeps(
    store: Store, tmp_path: Path, seaweed: SeaweedS3
) -> None:
    client, bucket = store.client, store.bucket
    state = tmp_path / "a1" / "state"
    make_state(state, random_mib=1, text_mib=1)
    before = await checkpointer(store).take({STATE: state}, "Interval")
    expected = tree(state)
    (state / "weights" / "big.bin").write_bytes(os.urandom(11 * MiB))

    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CRASHING_CHILD,
        seaweed.endpoint_url,
        seaweed.access_key,
        seaweed.secret_key,
        bucket,
        store.root,
        str(state),
    )
    assert await asyncio.wait_for(child.wait(), 60) == -signal.SIGKILL
    prefix = checkpoint_prefix("team-a", "train", 0, root=store.root)
    orphans = await uploading.open_uploads(client, bucket, prefix)
    assert [u["Key"] for u in orphans] == [f"{prefix}ckpt-00000002.tar.zst"], "the kill left one open"

    replacement = checkpointer(store, attempt="job-a-0-a2")
    fresh = tmp_path / "a2" / "state"
    assert await replacement.restore({STATE: fresh}) == before
    assert tree(fresh) == expected
    assert await uploading.open_uploads(client, bucket, prefix) == [], "the replacement swept the orphan"


# -- S3: size caps ------------------------------------------------------------------------------------------
@pytest.mark.s3
async def test_over_max_size_is_refused_and_latest_stays(store: Store, tmp_path: Path) -> None:
    client, bucket = store.client, store.bucket
    state = tmp_path / "state"
    make_state(state, random_mib=1, text_mib=1)
    before = await checkpointer(store).take({STATE: state}, "Interval")
    (state / "weights" / "big.bin").write_bytes(os.urandom(3 * MiB))

    small = checkpointer(store, max_size=4 * MiB)
    with pytest.raises(CheckpointTooLarge, match=r"over recovery.checkpoint.maxSize 4Mi: raise maxSize"):
        await small.take({STATE: state}, "Interval")
    assert await small.latest() == before
    assert await uploading.open_uploads(client, bucket, small.prefix) == []
    assert await uploading.get_bytes(client, bucket, small.archive_key(2)) is None

    tiny = checkpointer(store, max_size=before.size_bytes - 1)
    with pytest.raises(CheckpointTooLarge, match="raise maxSize to restore it"):
        await tiny.restore({STATE: tmp_path / "fresh"})
    assert not (tmp_path / "fresh").exists()


@pytest.mark.s3
async def test_stream_growing_past_the_cap_aborts_the_upload(store: Store) -> None:
    client, bucket = store.client, store.bucket

    async def twelve_mib() -> AsyncIterator[bytes]:
        for _ in range(12):
            yield os.urandom(MiB)

    with pytest.raises(uploading.SizeLimitExceeded):
        await uploading.upload(
            client, bucket, f"{store.root}capped", twelve_mib(), max_size=8 * MiB, part_size=5 * MiB
        )
    assert await uploading.open_uploads(client, bucket, store.root) == []
    assert await keys(store) == []


# -- S3: restore verifies every byte -----------------------------------------------------------------------
@pytest.mark.s3
@pytest.mark.parametrize("damage", ["another valid archive", "one byte flipped", "archive deleted"])
async def test_restore_refuses_a_damaged_checkpoint(store: Store, tmp_path: Path, damage: str) -> None:
    client, bucket = store.client, store.bucket
    state = tmp_path / "state"
    make_state(state, random_mib=1, text_mib=1)
    info = await checkpointer(store).take({STATE: state}, "Interval")
    body = await uploading.get_bytes(client, bucket, info.key)
    assert body is not None
    if damage == "one byte flipped":
        bad = bytearray(body)
        bad[len(bad) // 2] ^= 0x01
        await client.put_object(Bucket=bucket, Key=info.key, Body=bytes(bad))
    elif damage == "another valid archive":
        (state / "optim" / "state.json").write_text(json.dumps({"step": 9999}))
        async with packing.pack({"nodus/state": state}) as stream:
            await client.put_object(Bucket=bucket, Key=info.key, Body=await chunkstreams.collect(stream))
    else:
        await client.delete_object(Bucket=bucket, Key=info.key)

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "untouched").write_text("still here")
    with pytest.raises(CheckpointCorrupt, match=r"damaged|gone: delete"):
        await checkpointer(store, attempt="job-a-0-a2").restore({STATE: fresh})
    assert os.listdir(fresh) == ["untouched"]
    assert sorted(os.listdir(tmp_path)) == ["fresh", "state"]


# -- S3: the program contract -------------------------------------------------------------------------------
PROGRAM = textwrap.dedent(
    """
    import json, os, signal, sys, time
    ctl = os.path.join(sys.argv[1], ".nodus")
    os.makedirs(ctl, exist_ok=True)

    def checkpoint(signum, frame):
        with open(os.path.join(ctl, "checkpoint-request")) as f:
            request = json.load(f)
        with open(os.path.join(sys.argv[1], "model.txt"), "w") as f:
            f.write(f"saved for {request['sequence']} ({request['reason']})")
        with open(os.path.join(ctl, "checkpoint-ready.tmp"), "w") as f:
            f.write(str(request["sequence"]))
        os.replace(os.path.join(ctl, "checkpoint-ready.tmp"), os.path.join(ctl, "checkpoint-ready"))

    signal.signal(signal.SIGUSR1, checkpoint)
    with open(os.path.join(ctl, "checkpoint-ready"), "w") as f:
        f.write("0")  # opting in: "I handle SIGUSR1"
    while True:
        signal.pause()
    """
)


@pytest.mark.s3
async def test_program_that_opted_in_is_signalled_and_its_answer_awaited(
    store: Store, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", PROGRAM, str(state))
    try:
        await eventually(lambda: (state / ".nodus" / READY_FILE).exists(), message="program opted in")

        async def notify() -> None:
            proc.send_signal(signal.SIGUSR1)  # the process runtime's notify: the main process only

        ck = checkpointer(store, control_dir=state / ".nodus", notify=notify)
        info = await ck.take({STATE: state}, "Preemption")
        assert info.consistent is True
        assert (state / "model.txt").read_text() == "saved for 1 (Preemption)"
        request = json.loads((state / ".nodus" / REQUEST_FILE).read_text())
        assert request == {"sequence": 1, "reason": "Preemption", "timeoutSeconds": 60.0}
        done = json.loads((state / ".nodus" / DONE_FILE).read_text())
        assert done == {"sequence": 1, "stored": True, "uri": info.uri}
        fresh = tmp_path / "fresh"
        await checkpointer(store, attempt="job-a-0-a2").restore({STATE: fresh})
        assert (fresh / "model.txt").read_text() == "saved for 1 (Preemption)", "saved before the snapshot"
    finally:
        proc.kill()
        await proc.wait()


@pytest.mark.s3
async def test_silent_or_not_opted_in_program_gets_an_inconsistent_checkpoint(
    store: Store, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    make_state(state)
    signals: list[int] = []

    async def notify() -> None:
        signals.append(1)

    ck = checkpointer(store, control_dir=state / ".nodus", notify=notify, ready_timeout_s=0.3)
    info = await ck.take({STATE: state}, "Interval")
    assert (info.consistent, signals) == (False, []), "no opt-in: never signalled (SIGUSR1 would kill it)"
    assert not (state / ".nodus" / REQUEST_FILE).exists()

    (state / ".nodus" / READY_FILE).write_text("0")
    info = await ck.take({STATE: state}, "Interval")
    assert (info.consistent, signals) == (False, [1]), "opted in but silent: taken anyway, flagged"
    assert info.quiesce_millis >= 300


# -- S3: retention -------------------------------------------------------------------------------------------
@pytest.mark.s3
async def test_old_checkpoints_are_pruned_and_cleanup_deletes_a_jobs_checkpoints(
    store: Store, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    make_state(state)
    ck = checkpointer(store, keep=2)
    for _ in range(3):
        await ck.take({STATE: state}, "Interval")
    names = [k.rsplit("/", 1)[1] for k in await keys(store)]
    assert names == [
        "ckpt-00000002.json",
        "ckpt-00000002.tar.zst",
        "ckpt-00000003.json",
        "ckpt-00000003.tar.zst",
        "latest",
    ]
    other_index = checkpointer(store, attempt="job-a-1-a1", index=1)
    await other_index.take({STATE: state}, "Final")

    assert await ck.cleanup(datetime(2000, 1, 1, tzinfo=UTC)) == 0, "nothing is that old"
    deleted = await ck.cleanup(datetime.now(UTC) + timedelta(minutes=1))
    assert deleted == 8
    assert await keys(store) == []
    assert await ck.latest() is None
    assert await checkpointer(store, attempt="job-a-0-a3").restore({STATE: tmp_path / "fresh"}) is None


# -- S3: sequence numbers continue across Attempts ---------------------------------------------------------
@pytest.mark.s3
async def test_a_replacement_attempt_continues_the_sequence(store: Store, tmp_path: Path) -> None:
    state = tmp_path / "state"
    make_state(state)
    first = checkpointer(store)
    await first.take({STATE: state}, "Interval")
    await first.take({STATE: state}, "Interval")
    second = checkpointer(store, attempt="job-a-0-a2")
    restored = await second.restore(tmp_path / "whole-tree")
    assert restored is not None and restored.sequence == 2
    assert tree(tmp_path / "whole-tree" / "nodus" / "state") == tree(state)
    assert (await second.take({STATE: state}, "Final")).sequence == 3
