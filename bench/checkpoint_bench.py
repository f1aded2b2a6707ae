"""Checkpointer.take against a raw aiobotocore multipart upload of the same bytes, same SeaweedFS, same run.

"The same bytes": a 200 MB state (120 MB of random shards that do not compress, 80 MB of a text log that
does, a subdirectory, a link) is packed once into memory; that exact tar.zst is what the baseline uploads
(the same part size and parts in flight, the same client and server), with nothing else to do. The measure
is a whole ``Checkpointer.take`` of the state on disk: walk, tar, zstd, sha256, upload, verify (HEAD),
manifest and ``latest``. Both rates are MB/s of that tar.zst, so the ratio is the time of the raw upload
over the time of the checkpoint: what packing, checking and pointing cost on top of the bare transfer.

The second measure is ``restore`` (download, sha256, decompress, extract 210 MB of files into a staging
directory, move them into place) against a raw ranged download of the same tar.zst into one file (its
bytes on disk, nothing else): the same ranges and ranges in flight, the same client and server.

Context rows: the same take counted in MB/s of the state against uploading the state's files uncompressed
(what compression buys); CPU-seconds (this process's threads plus the SeaweedFS server) of take and
restore against their baselines: on a 2-core machine shared with other work the wall-clock ratio swings
from round to round, the CPU cost does not; and the CPU of the restore's two stages that the raw download
does not have, each alone on one core from memory: the sha256 of the tar.zst, and zstd + tar + writing the
files (``unpack`` of the archive in memory, less that sha256). Each is a rate in MB of tar.zst per
CPU-second against the raw download's wall-clock rate: below 100%, that stage alone on one core is slower
than the download.

``-n`` is the number of rounds (at most 5); each round measures baseline and subject back to back (every
round is printed), and the best round of each counts.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.running import Result
from nodus_agent import chunkstreams, packing, s3, unpacking, uploading
from nodus_agent.checkpointing import Checkpointer
from nodus_testing.seaweed import SeaweedS3

MiB = 1 << 20
RANDOM_MIB, TEXT_MIB = 120, 80
PART_SIZE, IN_FLIGHT = uploading.PART_SIZE, uploading.IN_FLIGHT
STATE = "/nodus/state"


def make_state(root: Path) -> int:
    """The benchmark's state; returns its bytes."""
    (root / "weights").mkdir(parents=True)
    for i in range(4):
        (root / "weights" / f"shard-{i}.bin").write_bytes(os.urandom(RANDOM_MIB * MiB // 4))
    block = b"".join(
        b"step %06d loss %.6f lr %.3e\n" % (i, 1 / (i + 1), 3e-4 * 0.999**i) for i in range(60_000)
    )
    with open(root / "train.log", "wb") as f:
        left = TEXT_MIB * MiB
        while left:
            piece = block[:left]
            f.write(piece)
            left -= len(piece)
    (root / "optim").mkdir()
    (root / "optim" / "state.json").write_text('{"step": 1234}')
    os.symlink("weights/shard-0.bin", root / "latest-shard")
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by this process (every thread) and by the SeaweedFS server ``pid``: on a
    machine shared with other work, the cost that wall-clock rates only hint at."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return time.process_time() + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _file_contents(root: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()]


async def raw_upload(client: Any, bucket: str, key: str, data: bytes | list[bytes]) -> float:
    """Seconds for a plain multipart upload (parts of PART_SIZE, IN_FLIGHT at once) of ``data``, or of
    several bodies one after another (the uncompressed files)."""
    began = time.perf_counter()
    for i, body in enumerate(data if isinstance(data, list) else [data]):
        await _multipart(client, bucket, f"{key}-{i}", body)
    return time.perf_counter() - began


async def _multipart(client: Any, bucket: str, key: str, body: bytes) -> None:
    if len(body) <= PART_SIZE:
        await client.put_object(Bucket=bucket, Key=key, Body=body)
        return
    upload_id = (await client.create_multipart_upload(Bucket=bucket, Key=key))["UploadId"]
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def part(number: int, start: int) -> dict[str, Any]:
        async with gate:
            r = await client.upload_part(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=body[start : start + PART_SIZE],
            )
        return {"PartNumber": number, "ETag": r["ETag"]}

    parts = await asyncio.gather(*(part(i + 1, s) for i, s in enumerate(range(0, len(body), PART_SIZE))))
    await client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )


async def raw_download(client: Any, bucket: str, key: str, path: Path) -> float:
    """Seconds for ranged GETs of PART_SIZE, IN_FLIGHT at once, of the whole object, each range written at
    its offset in one file: the least a restore must do (its bytes on disk)."""
    began = time.perf_counter()
    size = (await client.head_object(Bucket=bucket, Key=key))["ContentLength"]
    gate = asyncio.Semaphore(IN_FLIGHT)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    async def get(start: int) -> int:
        async with gate:
            r = await client.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{start + PART_SIZE - 1}"
            )
            async with r["Body"] as b:
                data = await b.read()
            return await asyncio.to_thread(os.pwrite, fd, data, start)

    try:
        got = sum(await asyncio.gather(*(get(s) for s in range(0, size, PART_SIZE))))
    finally:
        os.close(fd)
    assert got == size
    return time.perf_counter() - began


async def run(n: int) -> list[Result]:
    rounds = max(1, min(n, 5))
    with tempfile.TemporaryDirectory(prefix="nodus-ckpt-bench-") as tmp, SeaweedS3() as server:
        state = Path(tmp) / "state"
        state_bytes = make_state(state)
        bucket = f"bench-{secrets.token_hex(4)}"
        settings = s3.S3Settings(
            bucket=bucket,
            endpoint=server.endpoint_url,
            access_key=server.access_key,
            secret_key=server.secret_key,
        )
        async with s3.client(settings) as client:
            await client.create_bucket(Bucket=bucket)
            assert server.proc is not None
            return await _measure(client, bucket, state, state_bytes, rounds, Path(tmp), server.proc.pid)


async def _measure(
    client: Any, bucket: str, state: Path, state_bytes: int, rounds: int, tmp: Path, server_pid: int
) -> list[Result]:
    async with packing.pack({"nodus/state": state}) as stream:
        archive = await chunkstreams.collect(stream)
    files = await asyncio.to_thread(_file_contents, state)
    ck = Checkpointer(client, bucket, namespace="bench", job="ckpt", index=0, attempt="bench-0-a1")
    await raw_upload(client, bucket, "warm-up", archive)  # the first volumes of a bucket grow slowly

    take_s, raw_s, plain_s, take_cpu, raw_cpu = [], [], [], [], []
    for r in range(rounds):
        cpu = cpu_seconds(server_pid)
        raw_s.append(await raw_upload(client, bucket, f"raw-{r}", archive))
        raw_cpu.append(cpu_seconds(server_pid) - cpu)
        began, cpu = time.perf_counter(), cpu_seconds(server_pid)
        info = await ck.take({STATE: state}, "Interval")
        take_s.append(time.perf_counter() - began)
        take_cpu.append(cpu_seconds(server_pid) - cpu)
        plain_s.append(await raw_upload(client, bucket, f"plain-{r}", files))

        print(
            f"take round {r + 1}: raw upload {raw_s[-1]:.2f} s, take {take_s[-1]:.2f} s "
            f"({raw_s[-1] / take_s[-1]:.0%}); CPU {raw_cpu[-1]:.2f} s, {take_cpu[-1]:.2f} s",
            flush=True,
        )
    assert info.size_bytes == len(archive), "the checkpoint uploads the very bytes the baseline does"

    restore_s, download_s, restore_cpu, download_cpu = [], [], [], []
    for r in range(rounds):
        cpu = cpu_seconds(server_pid)
        download_s.append(await raw_download(client, bucket, info.key, tmp / f"downloaded-{r}"))
        download_cpu.append(cpu_seconds(server_pid) - cpu)
        began, cpu = time.perf_counter(), cpu_seconds(server_pid)
        await ck.restore({STATE: tmp / f"restored-{r}"})
        restore_s.append(time.perf_counter() - began)
        restore_cpu.append(cpu_seconds(server_pid) - cpu)
        print(
            f"restore round {r + 1}: raw download {download_s[-1]:.2f} s, restore {restore_s[-1]:.2f} s "
            f"({download_s[-1] / restore_s[-1]:.0%}); CPU {download_cpu[-1]:.2f} s, {restore_cpu[-1]:.2f} s",
            flush=True,
        )
        await asyncio.to_thread(_remove, tmp / f"downloaded-{r}", tmp / f"restored-{r}")
    sha_cpu, unpack_cpu = await _stages(archive, info.sha256, tmp / "from-memory", rounds)

    mb, state_mb = len(archive) / 1e6, state_bytes / 1e6
    ratio = f"{state_mb:.0f} MB state -> {mb:.0f} MB tar.zst"
    return [
        Result(
            f"Checkpointer.take, {ratio} (MB/s of tar.zst)",
            "raw aiobotocore multipart upload of the same tar.zst",
            mb / min(take_s),
            mb / min(raw_s),
            target=0.90,
        ),
        Result(
            "Checkpointer.take (MB/s of state)",
            "raw multipart upload of the state's files, uncompressed",
            state_mb / min(take_s),
            state_mb / min(plain_s),
        ),
        Result(
            f"Checkpointer.take, MB of tar.zst per CPU-second ({min(take_cpu):.2f} s: agent + SeaweedFS)",
            f"raw multipart upload, MB per CPU-second ({min(raw_cpu):.2f} s)",
            mb / min(take_cpu),
            mb / min(raw_cpu),
        ),
        Result(
            "Checkpointer.restore, verified (MB/s of tar.zst)",
            "raw ranged download of the same tar.zst into a file",
            mb / min(restore_s),
            mb / min(download_s),
            target=0.80,
        ),
        Result(
            f"Checkpointer.restore, MB per CPU-second ({min(restore_cpu):.2f} s: agent + SeaweedFS)",
            f"raw ranged download, MB per CPU-second ({min(download_cpu):.2f} s)",
            mb / min(restore_cpu),
            mb / min(download_cpu),
        ),
        Result(
            f"restore's sha256 alone, one core, MB per CPU-second ({sha_cpu:.2f} s)",
            "raw ranged download of the same tar.zst into a file (MB/s)",
            mb / sha_cpu,
            mb / min(download_s),
        ),
        Result(
            f"restore's zstd + tar + files alone, from memory, MB per CPU-second ({unpack_cpu:.2f} s)",
            "raw ranged download of the same tar.zst into a file (MB/s)",
            mb / unpack_cpu,
            mb / min(download_s),
        ),
    ]


async def _stages(archive: bytes, sha256: str, into: Path, rounds: int) -> tuple[float, float]:
    """CPU-seconds (best of ``rounds``) of the restore's sha256 alone and of its zstd + tar + file writes
    alone (``unpack`` of the archive from memory, in the download's ranges, less the sha256 it makes)."""
    ranges = [archive[i : i + PART_SIZE] for i in range(0, len(archive), PART_SIZE)]

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in ranges:
            yield chunk

    sha, unpack = [], []
    for _ in range(rounds):
        cpu = time.process_time()
        hashlib.sha256(archive).hexdigest()
        sha.append(time.process_time() - cpu)
        cpu = time.process_time()
        await unpacking.unpack(chunks(), {"nodus/state": into}, sha256=sha256, size=len(archive))
        unpack.append(time.process_time() - cpu)
        await asyncio.to_thread(_remove, into)
    return min(sha), min(unpack) - min(sha)


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
