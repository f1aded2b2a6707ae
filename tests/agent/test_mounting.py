"""Volumes and Workspaces of a run against SeaweedFS: read-only mounts and volume inputs from the node's
cache (one download per node), the refusals (a blob that is not its digest, a missing blob, a Volume the
grant does not name), Workspace snapshots (the home and a subdirectory), and writable mounts: a private
copy, packed and uploaded as a blob named by its sha256, committed through the gateway's interface."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from pathlib import Path

import msgspec
import pytest
import zstandard
from nats.aio.client import Client as NATS

from nodus_agent import packing, unpacking, uploading
from nodus_agent.attemptdir import AttemptDir
from nodus_agent.chunkstreams import collect
from nodus_agent.mounting import MountContext, MountError, commit_mounts, prepare_mounts, release, retain
from nodus_agent.mountplan import MountPlan
from nodus_agent.volumecache import VolumeCache
from nodus_agent.volumecommit import Committer, VolumeCommitter
from nodus_kit import errors, messaging
from nodus_schema.jobs import JobInput, VolumeInput, VolumeMount, WorkspaceInput
from nodus_schema.messages import StartAttempt
from nodus_schema.noding import GrantedRevision, VolumeCommitReply, VolumeCommitRequest, commit_subject
from nodus_schema.volumes import blob_key, workspace_prefix
from tests.agent.conftest import Store

pytestmark = pytest.mark.s3


class FakeCommitter:
    """The gateway's side of a commit as the agent sees it: one new revision per (attempt, digest)."""

    def __init__(self, latest: int = 0) -> None:
        self.latest = latest
        self.requests: list[VolumeCommitRequest] = []
        self.made: dict[tuple[str, str], int] = {}

    async def commit(self, request: VolumeCommitRequest) -> VolumeCommitReply:
        self.requests.append(request)
        key = (request.attempt, request.digest)
        if key not in self.made:
            self.latest += 1
            self.made[key] = self.latest
        return VolumeCommitReply(revision=self.made[key])


async def push(store: Store, namespace: str, folder: Path) -> GrantedRevision:
    """What ``nodus volume push`` leaves in the store: the folder as a blob named by its digest."""
    body = await collect(packing.pack_tree(folder))
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    await store.client.put_object(Bucket=store.bucket, Key=blob_key(namespace, digest), Body=body)
    return GrantedRevision(volume="data", revision=1, digest=digest, size_bytes=len(body))


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
    return root


def start(namespace: str, attempt: str = "a1", **kw: object) -> StartAttempt:
    return StartAttempt(
        namespace=namespace, job="train", attempt=attempt, index=0, attempt_no=1, node="n1", **kw
    )  # type: ignore[arg-type]


def attempt_dir(tmp_path: Path, namespace: str, attempt: str = "a1") -> AttemptDir:
    adir = AttemptDir(tmp_path / "work", namespace, attempt)
    adir.create()
    return adir


@pytest.fixture
def namespace(unique: str) -> str:
    return unique  # keys of blobs and homes are per project: each test its own


def context(
    store: Store, tmp_path: Path, committer: VolumeCommitter | None = None, budget: int = 1 << 30
) -> MountContext:
    return MountContext(store.client, store.bucket, VolumeCache(tmp_path / "cache", budget), committer)


async def test_read_only_mount_and_volume_input_share_one_download(
    store: Store, namespace: str, tmp_path: Path
) -> None:
    rev = await push(store, namespace, tree(tmp_path / "ds", {"train.csv": b"a,b\n", "img/1.png": b"png"}))
    ctx = context(store, tmp_path)
    msg = start(
        namespace,
        volumes=[VolumeMount(volume="data", mount_path="/data", read_only=True, revision=1)],
        inputs=[JobInput(name="weights", volume=VolumeInput(name="data", revision=1))],
    )
    plan = MountPlan()
    await prepare_mounts(ctx, msg, attempt_dir(tmp_path, namespace), [rev], plan)

    assert [(m.target, m.read_only) for m in plan.mounts] == [
        ("/data", True),
        ("/nodus/inputs/weights", True),
    ]
    host = plan.mounts[0].host
    assert host == plan.mounts[1].host == ctx.cache.entry(rev.digest or "")
    assert (host / "train.csv").read_bytes() == b"a,b\n" and (host / "img" / "1.png").read_bytes() == b"png"
    first, second = plan.records
    assert (first.name, first.kind, first.mount_path, first.revision, first.digest) == (
        "data",
        "Volume",
        "/data",
        1,
        rev.digest,
    )
    assert (first.cache_hit, second.cache_hit, first.size_bytes) == (False, True, rev.size_bytes)
    assert second.mount_path == "/nodus/inputs/weights" and ctx.cache.downloads == 1
    assert len(plan.leases) == 2
    release(plan)
    assert plan.leases == []


async def test_one_volume_at_two_revisions_mounts_each(store: Store, namespace: str, tmp_path: Path) -> None:
    """A Job may read revision 1 at a mount and revision 2 as an input: grants are told apart by revision."""
    one = await push(store, namespace, tree(tmp_path / "v1", {"x": b"1"}))
    two = msgspec.structs.replace(
        await push(store, namespace, tree(tmp_path / "v2", {"x": b"2"})), revision=2
    )
    msg = start(
        namespace,
        volumes=[VolumeMount(volume="data", mount_path="/data", read_only=True, revision=1)],
        inputs=[JobInput(name="newer", volume=VolumeInput(name="data", revision=2))],
    )
    plan = MountPlan()
    await prepare_mounts(context(store, tmp_path), msg, attempt_dir(tmp_path, namespace), [two, one], plan)
    assert [(r.mount_path, r.revision) for r in plan.records] == [("/data", 1), ("/nodus/inputs/newer", 2)]
    assert [(m.host / "x").read_bytes() for m in plan.mounts] == [b"1", b"2"]
    release(plan)


async def test_a_blob_that_is_not_its_digest_is_refused_and_not_cached(
    store: Store, namespace: str, tmp_path: Path
) -> None:
    rev = await push(store, namespace, tree(tmp_path / "ds", {"a.txt": b"honest"}))
    other = await collect(packing.pack_tree(tree(tmp_path / "evil", {"a.txt": b"swapped"})))
    await store.client.put_object(Bucket=store.bucket, Key=blob_key(namespace, rev.digest or ""), Body=other)
    ctx = context(store, tmp_path)
    msg = start(namespace, volumes=[VolumeMount(volume="data", mount_path="/data", read_only=True)])

    with pytest.raises(MountError, match=r"Volume 'data' revision 1: .* is not the revision's blob") as e:
        await prepare_mounts(ctx, msg, attempt_dir(tmp_path, namespace), [rev], MountPlan())
    assert not e.value.retryable
    assert not ctx.cache.entry(rev.digest or "").exists() and ctx.cache.usage() == 0


async def test_missing_blob_and_missing_grant_are_refused_naming_the_volume(
    store: Store, namespace: str, tmp_path: Path
) -> None:
    ctx = context(store, tmp_path)
    msg = start(namespace, volumes=[VolumeMount(volume="data", mount_path="/data", read_only=True)])
    gone = GrantedRevision(volume="data", revision=3, digest="sha256:" + "0" * 64, size_bytes=10)
    with pytest.raises(MountError, match=r"revision 3: s3://.* is missing from the store") as e:
        await prepare_mounts(ctx, msg, attempt_dir(tmp_path, namespace), [gone], MountPlan())
    assert not e.value.retryable
    with pytest.raises(MountError, match=r"Volume 'data' .*granted no such revision") as e:
        await prepare_mounts(ctx, msg, attempt_dir(tmp_path, namespace), [], MountPlan())
    assert not e.value.retryable
    climbing = start(
        namespace, volumes=[VolumeMount(volume="data", mount_path="/data/../etc", read_only=True)]
    )
    with pytest.raises(MountError, match=r"mountPath '/data/../etc' must be an absolute path"):
        await prepare_mounts(ctx, climbing, attempt_dir(tmp_path, namespace), [gone], MountPlan())


async def test_workspace_inputs_snapshot_the_home_and_a_subdirectory(
    store: Store, namespace: str, tmp_path: Path
) -> None:
    home = workspace_prefix(namespace, "home")
    files = {"notes.md": b"# notes", "sub/b.txt": b"b", "sub/deep/c.txt": b"c", "subway.txt": b"not sub"}
    for rel, body in files.items():
        await store.client.put_object(Bucket=store.bucket, Key=home + rel, Body=body)
    # Another project's home of the same name: never read.
    await store.client.put_object(
        Bucket=store.bucket, Key=workspace_prefix(f"{namespace}x", "home") + "secret", Body=b"s"
    )
    ctx = context(store, tmp_path)
    msg = start(
        namespace,
        inputs=[
            JobInput(name="all", from_workspace=WorkspaceInput(name="home")),
            JobInput(name="part", from_workspace=WorkspaceInput(name="home", path="/sub/")),
            JobInput(name="one", from_workspace=WorkspaceInput(name="home", path="notes.md")),
        ],
    )
    adir = attempt_dir(tmp_path, namespace)
    plan = MountPlan()
    await prepare_mounts(ctx, msg, adir, [], plan)

    inputs = adir.inputs
    assert sorted(str(p.relative_to(inputs / "all")) for p in (inputs / "all").rglob("*") if p.is_file()) == [
        "notes.md",
        "sub/b.txt",
        "sub/deep/c.txt",
        "subway.txt",
    ]
    assert (inputs / "part" / "b.txt").read_bytes() == b"b"
    assert (inputs / "part" / "deep" / "c.txt").read_bytes() == b"c"
    assert not (inputs / "part" / "subway.txt").exists()
    assert (inputs / "one").read_bytes() == b"# notes"
    assert [(r.name, r.kind, r.mount_path, r.size_bytes) for r in plan.records] == [
        ("home", "Workspace", "/nodus/inputs/all", sum(len(b) for b in files.values())),
        ("home", "Workspace", "/nodus/inputs/part", 2),
        ("home", "Workspace", "/nodus/inputs/one", 7),
    ]
    assert plan.mounts == []  # under inputs/, which the run sees already

    # A snapshot: a later push changes nothing for this run, also when it is prepared again.
    await store.client.put_object(Bucket=store.bucket, Key=home + "sub/b.txt", Body=b"changed")
    await prepare_mounts(ctx, msg, adir, [], MountPlan())
    assert (inputs / "part" / "b.txt").read_bytes() == b"b"

    missing = start(
        namespace, inputs=[JobInput(name="x", from_workspace=WorkspaceInput(name="home", path="nope"))]
    )
    with pytest.raises(MountError, match="Workspace 'home' has no file or folder 'nope'") as e:
        await prepare_mounts(ctx, missing, adir, [], MountPlan())
    assert not e.value.retryable
    climbing = start(
        namespace, inputs=[JobInput(name="y", from_workspace=WorkspaceInput(name="home", path="../x"))]
    )
    with pytest.raises(MountError, match="would leave the home"):
        await prepare_mounts(ctx, climbing, adir, [], MountPlan())


async def test_a_writable_mount_is_a_private_copy_committed_as_a_blob(
    store: Store, namespace: str, tmp_path: Path
) -> None:
    rev = await push(store, namespace, tree(tmp_path / "ds", {"seen.txt": b"1"}))
    committer = FakeCommitter(latest=1)
    ctx = context(store, tmp_path, committer)
    msg = start(namespace, volumes=[VolumeMount(volume="data", mount_path="/work/data", read_only=False)])
    adir = attempt_dir(tmp_path, namespace)
    plan = MountPlan()
    await prepare_mounts(ctx, msg, adir, [rev], plan)

    (mount,) = plan.writable
    assert mount.host == adir.root / "volumes" / "data" and plan.mounts[0].read_only is False
    assert (mount.host / "seen.txt").read_bytes() == b"1"
    (mount.host / "seen.txt").write_bytes(b"2")  # the copy is the run's own
    (mount.host / "new" / "made.txt").parent.mkdir()
    (mount.host / "new" / "made.txt").write_bytes(b"by the run")
    assert (ctx.cache.entry(rev.digest or "") / "seen.txt").read_bytes() == b"1"
    assert plan.leases == []  # the copy holds no lease: the entry may be evicted

    await commit_mounts(ctx, msg, plan)
    await commit_mounts(ctx, msg, plan)  # repeated: nothing is asked twice

    (request,) = committer.requests
    assert (request.namespace, request.attempt, request.volume) == (namespace, "a1", "data")
    assert mount.record.committed_revision == 2 and plan.records[0].committed_revision == 2
    stored = await store.client.get_object(Bucket=store.bucket, Key=blob_key(namespace, request.digest))
    async with stored["Body"] as body:
        blob = await body.read()
    assert request.digest == "sha256:" + hashlib.sha256(blob).hexdigest()
    assert request.size_bytes == len(blob)
    out = tmp_path / "check"
    chunks = uploading.download(store.client, store.bucket, blob_key(namespace, request.digest))
    async with contextlib.aclosing(chunks):
        await unpacking.unpack_tree(chunks, out)
    assert (out / "seen.txt").read_bytes() == b"2" and (
        out / "new" / "made.txt"
    ).read_bytes() == b"by the run"
    assert not list(mount.host.parent.glob(".*"))  # no archive or copy left beside it

    # Prepared again (a restarted agent): the copy with the run's writes is kept, not reset.
    again = MountPlan()
    await prepare_mounts(ctx, msg, adir, [rev], again)
    assert (again.writable[0].host / "seen.txt").read_bytes() == b"2"


async def test_a_writable_mount_of_a_volume_without_revisions_starts_empty(
    store: Store, namespace: str, tmp_path: Path
) -> None:
    committer = FakeCommitter()
    ctx = context(store, tmp_path, committer)
    msg = start(namespace, volumes=[VolumeMount(volume="fresh", mount_path="/out", read_only=False)])
    plan = MountPlan()
    await prepare_mounts(ctx, msg, attempt_dir(tmp_path, namespace), [GrantedRevision(volume="fresh")], plan)

    (mount,) = plan.writable
    assert list(mount.host.iterdir()) == []
    assert (mount.record.revision, mount.record.digest, mount.record.read_only) == (None, None, False)
    (mount.host / "result.txt").write_bytes(b"42")
    await commit_mounts(ctx, msg, plan)
    assert committer.requests[0].volume == "fresh" and mount.record.committed_revision == 1
    head = await store.client.head_object(
        Bucket=store.bucket, Key=blob_key(namespace, committer.requests[0].digest)
    )
    assert head["ContentLength"] == committer.requests[0].size_bytes

    without = context(store, tmp_path / "other")
    plan.writable[0].record.committed_revision = None
    with pytest.raises(MountError, match="cannot commit"):
        await commit_mounts(without, msg, plan)


def tar_zst(members: list[tuple[str, bytes | None]]) -> bytes:
    """A tar.zst as other tools write one: ``None`` is a folder; names are taken as given."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, body in members:
            info = tarfile.TarInfo(name)
            if body is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return zstandard.ZstdCompressor().compress(raw.getvalue())


async def put_blob(store: Store, namespace: str, body: bytes) -> GrantedRevision:
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    await store.client.put_object(Bucket=store.bucket, Key=blob_key(namespace, digest), Body=body)
    return GrantedRevision(volume="data", revision=1, digest=digest, size_bytes=len(body))


async def test_blobs_from_other_tools_are_read_and_hostile_ones_refused(
    store: Store, namespace: str, tmp_path: Path
) -> None:
    msg = start(namespace, volumes=[VolumeMount(volume="data", mount_path="/data", read_only=True)])
    ctx = context(store, tmp_path, budget=1000)
    # ``tar -C dir .`` names the root "./" and every member "./<path>".
    gnu = await put_blob(store, namespace, tar_zst([("./", None), ("./d/", None), ("./d/a.txt", b"a")]))
    plan = MountPlan()
    await prepare_mounts(ctx, msg, attempt_dir(tmp_path, namespace), [gnu], plan)
    assert (plan.mounts[0].host / "d" / "a.txt").read_bytes() == b"a"
    release(plan)

    climbing = await put_blob(store, namespace, tar_zst([("ok.txt", b"x"), ("../../escape.txt", b"x")]))
    with pytest.raises(MountError, match="is refused") as e:
        await prepare_mounts(ctx, msg, attempt_dir(tmp_path, namespace, "a2"), [climbing], MountPlan())
    assert not e.value.retryable
    assert not (tmp_path / "cache" / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
    # Small to download, large once extracted: stopped at the cache's budget, before it fills the disk.
    bomb = await put_blob(store, namespace, tar_zst([("zeros.bin", bytes(5000))]))
    with pytest.raises(MountError, match="NODUS_AGENT_CACHE_BYTES") as e:
        await prepare_mounts(ctx, msg, attempt_dir(tmp_path, namespace, "a3"), [bomb], MountPlan())
    assert not e.value.retryable and not ctx.cache.entry(bomb.digest or "").exists()


async def test_a_re_adopted_run_holds_its_entries_again(store: Store, namespace: str, tmp_path: Path) -> None:
    rev = await push(store, namespace, tree(tmp_path / "ds", {"a.bin": os.urandom(6000)}))
    msg = start(namespace, volumes=[VolumeMount(volume="data", mount_path="/data", read_only=True)])
    plan = MountPlan()
    await prepare_mounts(
        context(store, tmp_path, budget=10_000), msg, attempt_dir(tmp_path, namespace), [rev], plan
    )
    release(plan)  # what a killed agent's leases amount to

    restarted = context(store, tmp_path, budget=10_000)
    adopted = MountPlan(records=plan.records)
    await retain(restarted, adopted)
    assert [lease.hit for lease in adopted.leases] == [True] and restarted.cache.downloads == 0
    # Another revision that needs the room cannot evict it while the run is adopted.
    other = await push(store, namespace, tree(tmp_path / "big", {"b.bin": os.urandom(6000)}))
    msg2 = start(namespace, volumes=[VolumeMount(volume="data", mount_path="/data", read_only=True)])
    with pytest.raises(MountError, match="held by revisions in use"):
        await prepare_mounts(restarted, msg2, attempt_dir(tmp_path, namespace, "a2"), [other], MountPlan())
    assert restarted.cache.entry(rev.digest or "").is_dir()
    release(adopted)


async def test_the_commit_goes_over_the_node_subject_and_a_refusal_is_final(
    nc: NATS, store: Store, namespace: str, unique: str, tmp_path: Path
) -> None:
    node = f"n{unique}"
    asked: list[VolumeCommitRequest] = []

    async def gateway(request: VolumeCommitRequest) -> VolumeCommitReply:
        asked.append(request)
        if request.volume == "claimed":
            raise errors.NotFound("Job train does not hold the writer claim of Volume 'claimed'")
        return VolumeCommitReply(revision=7)

    sub = await messaging.serve(nc, commit_subject(node), VolumeCommitRequest, gateway)
    try:
        ctx = context(store, tmp_path, Committer(nc, node))
        mounts = [VolumeMount(volume=v, mount_path=f"/{v}", read_only=False) for v in ("data", "claimed")]
        msg = start(namespace, volumes=mounts)
        plan = MountPlan()
        grants = [GrantedRevision(volume="data"), GrantedRevision(volume="claimed")]
        await prepare_mounts(ctx, msg, attempt_dir(tmp_path, namespace), grants, plan)
        with pytest.raises(MountError, match=r"did not commit .*writer claim") as e:
            await commit_mounts(ctx, msg, plan)
    finally:
        await sub.unsubscribe()

    assert not e.value.retryable
    assert [(r.volume, r.namespace, r.attempt) for r in asked] == [
        ("data", namespace, "a1"),
        ("claimed", namespace, "a1"),
    ]
    assert [w.record.committed_revision for w in plan.writable] == [7, None]
