"""retainAfterFinish against SeaweedFS: which Jobs' checkpoints a retention pass deletes, which it keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodus_agent import retaining, s3, uploading
from nodus_agent.checkpointing import Checkpointer
from nodus_schema import noding
from nodus_schema.jobs import CheckpointPolicy, Job, JobSpec, JobStatus, Recovery
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.noding import JobFolder
from nodus_testing.seaweed import SeaweedS3

NAMESPACE = "team-a"


def job(name: str, uid: str, *, finished: datetime | None = None, retain: str | None = None) -> Job:
    status = JobStatus(phase="Succeeded", completion_time=format_time(finished)) if finished else JobStatus()
    recovery = Recovery(checkpoint=CheckpointPolicy(retain_after_finish=retain)) if retain else None
    return Job(
        metadata=ObjectMeta(name=name, namespace=NAMESPACE, uid=uid),
        spec=JobSpec(image="x", recovery=recovery),
        status=status,
    )


class Jobs:
    """The gateway's answer (nodus_gateway.noding) over these Jobs, without the bus: the pure verdict
    is what this file tests; tests/deploy/test_node_restriction.py asks the real endpoint."""

    def __init__(self, *jobs: Job) -> None:
        self.jobs = {j.metadata.name: j for j in jobs}

    async def expired(self, folders: list[JobFolder]) -> list[bool]:
        now = datetime.now(UTC)
        return [noding.expired(self.jobs.get(f.name), f.uid8, now) for f in folders]


def test_which_jobs_are_expired() -> None:
    now = datetime.now(UTC)
    uid = "0123456789abcdef"
    assert noding.expired(None, uid[:8], now)  # deleted
    assert noding.expired(job("a", "ffffffff00000000"), uid[:8], now)  # a new Job of that name
    assert not noding.expired(job("a", uid), uid[:8], now)  # still running
    done = now - timedelta(hours=2)
    assert not noding.expired(job("a", uid, finished=done), uid[:8], now)  # 168h by default
    assert noding.expired(job("a", uid, finished=done, retain="1h"), uid[:8], now)
    assert not noding.expired(job("a", uid, finished=done, retain="3h"), uid[:8], now)


@pytest.mark.s3
async def test_a_pass_deletes_expired_checkpoints_and_keeps_the_rest(
    seaweed: SeaweedS3, unique: str, tmp_path: Path
) -> None:
    store = s3.S3Settings(
        bucket=f"{unique}-ret",
        endpoint=seaweed.endpoint_url,
        region=seaweed.region,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
    )
    now = datetime.now(UTC)
    state = tmp_path / "state"
    state.mkdir()
    (state / "weights.bin").write_bytes(b"x" * 4096)
    kept_uid, gone_uid, old_uid = "aaaaaaaa11111111", "bbbbbbbb22222222", "cccccccc33333333"
    async with s3.client(store) as client:
        await client.create_bucket(Bucket=store.bucket)
        for name, uid in (("running", kept_uid), ("deleted", gone_uid), ("old", old_uid)):
            ckpt = Checkpointer(
                client,
                store.bucket,
                namespace=NAMESPACE,
                job=f"{name}-{uid[:8]}",
                index=0,
                attempt=f"{name}-a1",
            )
            await ckpt.take({"/nodus/state": state}, "Interval")
        # An output folder beside them (no uid suffix): never the retention's to delete.
        await client.put_object(Bucket=store.bucket, Key=f"{NAMESPACE}/running/0/outputs/result", Body=b"r")
        jobs = Jobs(
            job("running", kept_uid),
            job("old", old_uid, finished=now - timedelta(days=8)),  # past the 168h default
        )
        # A moment later than every object written (S3's LastModified is what a pass compares).
        deleted = await retaining.sweep(
            client, store.bucket, jobs, now=datetime.now(UTC) + timedelta(seconds=5)
        )
        left = sorted(
            o["Key"]
            for page in [await client.list_objects_v2(Bucket=store.bucket, Prefix=f"{NAMESPACE}/")]
            for o in page.get("Contents", [])
        )

    assert deleted >= 4  # two Jobs' archive, manifest and latest
    assert all(f"running-{kept_uid[:8]}" in k or "/outputs/" in k for k in left), left
    assert any(k.endswith("/latest") for k in left)
    assert f"{NAMESPACE}/running/0/outputs/result" in left


class Recording:
    """An asker that says every folder has expired, and remembers which it was asked about."""

    def __init__(self) -> None:
        self.asked: list[JobFolder] = []

    async def expired(self, folders: list[JobFolder]) -> list[bool]:
        self.asked += folders
        return [True] * len(folders)


@pytest.mark.s3
async def test_nodus_own_prefix_is_never_taken_for_a_project(seaweed: SeaweedS3, unique: str) -> None:
    store = s3.S3Settings(
        bucket=f"{unique}-own",
        endpoint=seaweed.endpoint_url,
        region=seaweed.region,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
    )
    kept = [
        f"_nodus/blobs/{NAMESPACE}/{'ab' * 32}.tar.zst",
        f"_nodus/workspaces/{NAMESPACE}/home/notes.md",
        "_nodus/cache-0123abcd/0/a1/ckpt-1.tar.zst",  # shaped like a Job folder, but Nodus's own
    ]
    asker = Recording()
    async with s3.client(store) as client:
        await client.create_bucket(Bucket=store.bucket)
        for key in kept:
            await client.put_object(Bucket=store.bucket, Key=key, Body=b"x")
        await client.put_object(Bucket=store.bucket, Key=f"{NAMESPACE}/gone-0123abcd/0/x", Body=b"x")
        await retaining.sweep(client, store.bucket, asker, now=datetime.now(UTC) + timedelta(seconds=5))
        left = {o["Key"] for o in await uploading.list_objects(client, store.bucket, "_nodus/")}

    assert [(f.namespace, f.name) for f in asker.asked] == [(NAMESPACE, "gone")]
    assert left == set(kept)
