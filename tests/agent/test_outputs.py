"""Outputs uploaded when an index succeeds, against the session's real SeaweedFS: the layout of keys, the
records for the Job's status, a file sent as is, a directory as tar.zst, and the ranks of a gang."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from nodus_agent import chunkstreams, unpacking, uploading
from nodus_agent.outputs import (
    DeclaredOutput,
    OutputRecord,
    OutputsMissing,
    check_output_name,
    output_key,
    upload_outputs,
)

if TYPE_CHECKING:  # the fixtures' type; the fixtures themselves are tests/agent/conftest.py's
    from tests.agent.conftest import Store

MiB = 1 << 20
PREFIX = "team-a/train/2/outputs/"

pytestmark = pytest.mark.s3


async def upload(store: Store, **kw: Any) -> list[OutputRecord]:
    kw.setdefault("outputs_dir", None)
    kw.setdefault("declared", [])
    return await upload_outputs(
        store.client,
        store.bucket,
        namespace="team-a",
        job="train",
        index=2,
        part_size=5 * MiB,
        root=store.root,
        **kw,
    )


async def read(store: Store, key: str) -> bytes:
    """An object of this test (``key`` without the test's prefix)."""
    chunks = uploading.download(store.client, store.bucket, store.root + key, chunk_size=5 * MiB)
    async with contextlib.aclosing(chunks):
        return await chunkstreams.collect(chunks)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files(root: Path) -> dict[str, bytes | str]:
    """Relative path -> contents (or link target) of everything under root."""
    found: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            found[rel] = os.readlink(p)
        elif p.is_file():
            found[rel] = p.read_bytes()
    return found


def make_model(root: Path) -> None:
    (root / "tokenizer").mkdir(parents=True)
    (root / "config.json").write_text('{"layers": 2}')
    (root / "tokenizer" / "vocab.txt").write_text("a\nb\nc\n" * 1000)
    os.symlink("config.json", root / "current")


async def test_files_as_they_are_directories_as_tar_zst_and_outputs_dir(store: Store, tmp_path: Path) -> None:
    client, bucket = store.client, store.bucket
    work = tmp_path / "workspace"
    make_model(work / "model")
    (work / "metrics.csv").write_text("step,loss\n1,0.5\n")
    (work / "weights.bin").write_bytes(os.urandom(7 * MiB))  # over one part: a multipart upload
    outputs_dir = tmp_path / "outputs"
    (outputs_dir / "plots").mkdir(parents=True)
    (outputs_dir / "plots" / "loss.svg").write_text("<svg/>")

    records = await upload(
        store,
        declared=[
            DeclaredOutput("model", work / "model"),
            DeclaredOutput("metrics.csv", work / "metrics.csv"),
            DeclaredOutput("weights", work / "weights.bin"),
        ],
        outputs_dir=outputs_dir,
    )

    assert [(r.name, r.key.removeprefix(store.root), r.format) for r in records] == [
        ("model", f"{PREFIX}model.tar.zst", "tar.zst"),
        ("metrics.csv", f"{PREFIX}metrics.csv", "file"),
        ("weights", f"{PREFIX}weights", "file"),
        ("outputs", f"{PREFIX}outputs.tar.zst", "tar.zst"),
    ]
    for r in records:
        body = await read(store, r.key.removeprefix(store.root))
        assert (r.size_bytes, r.sha256, r.uri) == (len(body), sha(body), f"s3://{bucket}/{r.key}")
        assert r.rank is None
    assert await read(store, f"{PREFIX}metrics.csv") == b"step,loss\n1,0.5\n"
    assert await read(store, f"{PREFIX}weights") == (work / "weights.bin").read_bytes()
    head = await client.head_object(Bucket=bucket, Key=f"{store.root}{PREFIX}metrics.csv")
    assert head["Metadata"]["sha256"] == records[1].sha256, "a one-PUT object carries its digest"

    model = records[0]
    chunks = uploading.download(client, bucket, model.key)
    async with contextlib.aclosing(chunks):
        await unpacking.unpack(
            chunks, {"model": tmp_path / "got"}, sha256=model.sha256, size=model.size_bytes
        )
    assert files(tmp_path / "got") == files(work / "model")
    assert (model.files, model.raw_bytes) == (2, len('{"layers": 2}') + 6000)


async def test_ranks_of_a_gang(store: Store, tmp_path: Path) -> None:
    work = tmp_path / "workspace"
    make_model(work / "model")
    (work / "rank.log").write_text("rank 1 was here")
    outputs_dir = tmp_path / "outputs"
    outputs_dir.mkdir()
    (outputs_dir / "trace.json").write_text("{}")
    declared = [
        DeclaredOutput("model", work / "model", from_ranks="Zero"),
        DeclaredOutput("logs", work / "rank.log", from_ranks="All"),
    ]

    rank1 = await upload(store, declared=declared, outputs_dir=outputs_dir, rank=1)
    assert [(r.name, r.key.removeprefix(store.root), r.rank) for r in rank1] == [
        ("logs", f"{PREFIX}logs/rank-1", 1),
        ("outputs", f"{PREFIX}outputs/rank-1.tar.zst", 1),
    ], "rank 1 leaves fromRanks Zero to rank 0"
    plain = await upload(store, declared=declared, outputs_dir=tmp_path / "nothing-here")
    assert [(r.name, r.key.removeprefix(store.root)) for r in plain] == [
        ("model", f"{PREFIX}model.tar.zst"),
        ("logs", f"{PREFIX}logs/rank-0"),
    ], "a Job that is no gang is rank 0 for fromRanks All; a missing outputs dir makes no record"
    assert await read(store, f"{PREFIX}logs/rank-1") == b"rank 1 was here"


async def test_missing_declared_output_is_reported_after_the_others_are_stored(
    store: Store, tmp_path: Path
) -> None:
    (tmp_path / "present.txt").write_text("here")
    (tmp_path / "outputs").mkdir()  # empty: no record
    with pytest.raises(OutputsMissing, match=r"absent \(.*absent.txt\); write them before exiting") as err:
        await upload(
            store,
            declared=[
                DeclaredOutput("absent", tmp_path / "absent.txt"),
                DeclaredOutput("present", tmp_path / "present.txt"),
            ],
            outputs_dir=tmp_path / "outputs",
        )
    assert [r.name for r in err.value.records] == ["present"]
    assert [o.name for o in err.value.missing] == ["absent"]
    assert await read(store, f"{PREFIX}present") == b"here"


async def test_names_are_checked(store: Store, tmp_path: Path) -> None:
    for bad in ("Model", "nodus.reserved", "..", "a/b", ""):
        with pytest.raises(ValueError, match="output name"):
            check_output_name(bad)
    with pytest.raises(ValueError, match="unique and not 'outputs'"):
        await upload(store, declared=[DeclaredOutput("outputs", tmp_path)])
    with pytest.raises(ValueError, match="unique"):
        await upload(store, declared=[DeclaredOutput("a", tmp_path), DeclaredOutput("a", tmp_path)])
    assert output_key("ns", "job", 0, "m", directory=True, rank=3, root="nodus/") == (
        "nodus/ns/job/0/outputs/m/rank-3.tar.zst"
    )
