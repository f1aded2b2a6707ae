"""Mounting a Volume revision (issue #20): cold and cached, against a raw aiobotocore download of the same
bytes, same SeaweedFS, same run; and the upload of an unchanged directory.

The revision is a 1 GB dataset (8 shards of random bytes, which do not compress, as weights and encoded
images do not) packed as ``nodus volume push`` packs it (``nodus_sdk.packing``) and stored under its blob
key. Measured through the agent's own path (``nodus_agent.mounting.prepare_mounts`` on a
``VolumeCache``), the way a StartAttempt with a read-only mount runs it:

* **cold**: an empty cache: download, sha256, decompress and extract the revision, then rename it into
  the cache; against ranged GETs of the same tar.zst into one file (its bytes on disk, nothing else).
  Target: at least 80% of the raw download's rate.
* **cached**: the same mount again on that node: the cache answers. Target: at least 10x the cold one.
* **unchanged directory**: ``AsyncClient.upload_dir`` of a source folder through a real gateway, twice;
  the second sends no byte of the archive (counted on the wire by an httpx event hook).

A context row counts CPU-seconds (this process's threads and the SeaweedFS server): on a 2-core machine the
cold mount is bound by CPU, and its work beyond the raw download's (sha256, zstd, tar; both write the same
bytes to disk) is what a host with more cores runs side by side.

``-n`` is the number of rounds (at most 3): each round measures raw, cold and cached back to back; the best
round of each counts.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.checkpoint_bench import cpu_seconds, raw_download, raw_upload
from bench.running import Result
from nodus_agent import s3
from nodus_agent.attemptdir import AttemptDir
from nodus_agent.mounting import MountContext, prepare_mounts, release
from nodus_agent.mountplan import MountPlan
from nodus_agent.volumecache import VolumeCache
from nodus_schema.jobs import VolumeMount
from nodus_schema.messages import StartAttempt
from nodus_schema.noding import GrantedRevision
from nodus_schema.volumes import blob_key
from nodus_sdk import AsyncClient, packing
from nodus_testing.localstack import Stack
from nodus_testing.seaweed import SeaweedS3

MiB = 1 << 20
SHARDS, SHARD_MIB = 8, 128
NAMESPACE = "bench"


def make_dataset(root: Path) -> int:
    root.mkdir(parents=True)
    for i in range(SHARDS):
        with open(root / f"shard-{i:02d}.bin", "wb") as f:
            for _ in range(SHARD_MIB):
                f.write(os.urandom(MiB))
    (root / "index.json").write_text(f'{{"shards": {SHARDS}}}')
    return SHARDS * SHARD_MIB * MiB


def start_attempt(digest: str) -> StartAttempt:
    return StartAttempt(
        namespace=NAMESPACE,
        job="reader",
        attempt="reader-0-a1",
        index=0,
        attempt_no=1,
        node="bench",
        command=["true"],
        volumes=[VolumeMount(volume="data", mount_path="/data", read_only=True, revision=1)],
    )


async def mount_once(ctx: MountContext, msg: StartAttempt, granted: GrantedRevision, work: Path) -> bool:
    """One mount through the agent's path; returns whether the cache already had the revision."""
    plan = MountPlan()
    await prepare_mounts(ctx, msg, AttemptDir(work, msg.namespace, msg.attempt), [granted], plan)
    hit = bool(plan.records[0].cache_hit)
    release(plan)
    return hit


async def run(n: int) -> list[Result]:
    rounds = max(1, min(n, 3))
    with tempfile.TemporaryDirectory(prefix="nodus-volume-bench-") as tmp, SeaweedS3() as server:
        work = Path(tmp)
        make_dataset(work / "dataset")
        packed = await asyncio.to_thread(packing.pack_dir, work / "dataset", tmp_dir=work)
        bucket = f"bench-{secrets.token_hex(4)}"
        settings = s3.S3Settings(
            bucket=bucket,
            endpoint=server.endpoint_url,
            access_key=server.access_key,
            secret_key=server.secret_key,
        )
        async with s3.client(settings) as client:
            await client.create_bucket(Bucket=bucket)
            archive = packed.path.read_bytes()
            await raw_upload(client, bucket, "warm-up", archive)  # a bucket's first volumes grow slowly
            key = blob_key(NAMESPACE, packed.digest)
            await client.put_object(Bucket=bucket, Key=key, Body=archive)
            del archive
            assert server.proc is not None
            results = await _measure(client, bucket, key, packed, rounds, work, server.proc.pid)
        packed.remove()
    return [*results, await _unchanged_upload()]


async def _measure(
    client: Any, bucket: str, key: str, packed: packing.Packed, rounds: int, work: Path, server_pid: int
) -> list[Result]:
    granted = GrantedRevision(volume="data", revision=1, digest=packed.digest, size_bytes=packed.size_bytes)
    msg = start_attempt(packed.digest)
    raw_s, cold_s, cached_s, raw_cpu, cold_cpu = [], [], [], [], []
    for r in range(rounds):
        target = work / f"downloaded-{r}"
        cpu = cpu_seconds(server_pid)
        raw_s.append(await raw_download(client, bucket, key, target))
        raw_cpu.append(cpu_seconds(server_pid) - cpu)
        target.unlink()
        cache = VolumeCache(work / f"cache-{r}", budget_bytes=4 * packed.raw_bytes)
        ctx = MountContext(s3=client, bucket=bucket, cache=cache)
        began, cpu = time.perf_counter(), cpu_seconds(server_pid)
        assert not await mount_once(ctx, msg, granted, work / f"attempts-{r}")
        cold_s.append(time.perf_counter() - began)
        cold_cpu.append(cpu_seconds(server_pid) - cpu)
        began = time.perf_counter()
        assert await mount_once(ctx, msg, granted, work / f"attempts-{r}-again")
        cached_s.append(time.perf_counter() - began)
    mb = packed.size_bytes / 1e6
    return [
        Result(
            f"cold mount of a {mb:.0f} MB revision: download, sha256, extract into the cache (MB/s)",
            "raw aiobotocore ranged download of the same tar.zst into a file",
            mb / min(cold_s),
            mb / min(raw_s),
            target=0.80,
        ),
        Result(
            f"cold mount, MB per CPU-second ({min(cold_cpu):.2f} s: agent + SeaweedFS)",
            f"raw download into a file, MB per CPU-second ({min(raw_cpu):.2f} s)",
            mb / min(cold_cpu),
            mb / min(raw_cpu),
        ),
        Result(
            f"cached mount of the same revision, {min(cached_s) * 1000:.1f} ms (MB/s of the revision)",
            f"cold mount, {min(cold_s):.2f} s",
            mb / min(cached_s),
            mb / min(cold_s),
            target=10.0,
        ),
    ]


class _Counting(httpx.AsyncHTTPTransport):
    """The wire: the bytes of every PUT body (an archive upload), as the client sends them."""

    def __init__(self, ca: str) -> None:
        super().__init__(verify=ssl.create_default_context(cafile=ca))
        self.put_bytes = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            self.put_bytes += int(request.headers.get("content-length") or 0)
        return await super().handle_async_request(request)


async def _unchanged_upload() -> Result:
    """``upload_dir`` twice through a real gateway: archive bytes on the wire the first and second time."""
    with tempfile.TemporaryDirectory(prefix="nodus-upload-bench-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for i in range(200):
            (src / f"module_{i:03d}.py").write_text(f"VALUE = {i}\n" * 200)
        folder_mb = sum(p.stat().st_size for p in src.iterdir()) / 1e6
        stack = Stack(Path(tmp) / "stack")
        values = stack.start(deadline_s=90)
        wire = _Counting(values["NODUS_CA"])
        try:
            async with AsyncClient(
                server=values["NODUS_URL"], token=values["NODUS_TOKEN"], project="bench", transport=wire
            ) as c:
                began = time.perf_counter()
                first = await c.upload_dir(src)
                first_s, first_bytes, wire.put_bytes = time.perf_counter() - began, wire.put_bytes, 0
                began = time.perf_counter()
                again = await c.upload_dir(src)
                again_s = time.perf_counter() - began
        finally:
            stack.stop()
    assert first.digest == again.digest
    return Result(
        f"upload_dir of an unchanged folder: {wire.put_bytes} bytes sent, {again_s * 1000:.0f} ms "
        "(MB/s of the folder)",
        f"the first upload of it: {first_bytes} bytes sent, {first_s * 1000:.0f} ms",
        folder_mb / again_s,
        folder_mb / first_s,
    )
