"""Code and data in through the CLI (ADR-0036), against a real gateway with a store (a bucket of its own on
the session's SeaweedFS) over the session's nats-server: ``apply`` with ``source.dir`` and ``--source-dir``,
``volume push/ls``, ``workspace push/ls/pull``, what ``describe`` shows of an Attempt's source and mounts,
and the async SDK underneath (the CLI runs the generated sync client).

The gateway is wrapped in a counter of blob uploads (``PUT .../blobs/...``), so "an unchanged directory is
not sent again" is asserted on the wire, not only on what the CLI prints.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_cli import main
from nodus_cli.describing import describe_sweep
from nodus_gateway.app import build_app
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_gateway.storeaccess import StoreAccess, StoreSettings
from nodus_kit.storing import ObjectStore
from nodus_schema import ObjectMeta, Sweep, SweepCell, SweepStatus
from nodus_schema.attempts import JOB_LABEL, Attempt, AttemptSpec, AttemptStatus, MountRecord, SourceRecord
from nodus_sdk import AsyncClient, Config, Invalid, pack_dir
from nodus_testing.seaweed import SeaweedS3

TOKEN = "code-and-data-token-0123456789"
COMMIT = "3f2a9c1b7d0e5a4b3c2d1e0f9a8b7c6d5e4f3a2b"

JOB_YAML = """\
apiVersion: nodus.dev/v1
kind: Job
metadata:
  name: train
spec:
  image: ghcr.io/acme/train:1.0
  command: [python, train.py]
  source:
    dir: src
"""

SWEEP_YAML = """\
apiVersion: nodus.dev/v1
kind: Sweep
metadata:
  name: lr
spec:
  matrix:
    params:
      LR: ["0.1", "0.01"]
  template:
    kind: Job
    spec:
      image: ghcr.io/acme/train:1.0
      command: [python, train.py]
"""


@dataclass
class Uploads:
    """Every blob upload the gateway was sent: (path, Content-Length)."""

    seen: list[tuple[str, str]] = field(default_factory=list)

    def wrap(self, app: Any) -> Any:
        async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["method"] == "PUT" and "/blobs/" in scope["path"]:
                headers = dict(scope["headers"])
                self.seen.append((scope["path"], headers.get(b"content-length", b"").decode()))
            await app(scope, receive, send)

        return counted


@dataclass
class Gateway:
    url: str
    uploads: Uploads


@pytest_asyncio.fixture(scope="module")
async def gateway(nc: NATS, seaweed: SeaweedS3) -> AsyncIterator[Gateway]:
    bucket = f"cli-data-{secrets.token_hex(4)}"
    store = StoreAccess(
        StoreSettings(
            bucket=bucket,
            endpoint=seaweed.endpoint_url,
            access_key=seaweed.access_key,
            secret_key=seaweed.secret_key,
        )
    )
    await (await store.client()).create_bucket(Bucket=bucket)
    uploads = Uploads()
    app = build_app(stores_for(nc), admin_token=TOKEN, store=store)
    server = ApiServer(uploads.wrap(app), "127.0.0.1", 0)
    await server.start()
    yield Gateway(server.url, uploads)
    await server.stop()
    await store.close()


class Cli:
    """Runs ``nodus`` in a thread against the gateway, in one namespace; collects what it printed."""

    def __init__(self, url: str, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url, self.namespace, self.capsys = url, namespace, capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        args = ["--server", self.url, "--token", TOKEN, "-n", self.namespace, *argv]
        code = await asyncio.to_thread(main, args)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def nodus(gateway: Gateway, unique: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(gateway.url, unique, capsys)


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def code_tree(root: Path) -> Path:
    src = root / "src"
    write(src, "train.py", "print('training')\n")
    write(src, "lib/model.py", "W = 1\n")
    write(src, ".gitignore", "*.log\n")
    write(src, "run.log", "not sent")
    return src


def digest_of(folder: Path) -> str:
    with pack_dir(folder) as packed:
        return packed.digest


async def test_apply_packs_source_dir_uploads_it_once_and_sends_the_blob(
    nodus: Cli, gateway: Gateway, tmp_path: Path
) -> None:
    src = code_tree(tmp_path)
    manifest = write(tmp_path, "job.yaml", JOB_YAML)
    before = len(gateway.uploads.seen)

    code, out, err = await nodus("apply", "-f", str(manifest))
    assert (code, out.strip()) == (0, "job.nodus.dev/train created"), err
    digest = digest_of(src)
    assert "source: packed 3 files, " in err and f"{digest[:19]}… (uploaded)" in err
    assert len(gateway.uploads.seen) == before + 1
    path, length = gateway.uploads.seen[-1]
    assert path.endswith(f"/blobs/{digest}") and int(length) > 0  # a Content-Length, not chunked
    code, out, _ = await nodus("get", "job", "train", "-o", "json")
    assert json.loads(out)["spec"]["source"] == {"blob": digest}  # dir never reaches the server

    # The same folder again (from another working directory: paths are the manifest's): nothing is sent.
    code, out, err = await nodus("apply", "-f", str(manifest))
    assert (code, out.strip()) == (0, "job.nodus.dev/train unchanged"), err
    assert "(unchanged, not sent)" in err
    assert len(gateway.uploads.seen) == before + 1


async def test_estimate_resolves_source_dir_as_apply_does(
    nodus: Cli, gateway: Gateway, tmp_path: Path
) -> None:
    """The estimate is a dry-run create: its admission checks the blob, so the folder is uploaded first,
    and `dir` never reaches the server (which would refuse it as an unknown field)."""
    src = code_tree(tmp_path)
    manifest = write(tmp_path, "job.yaml", JOB_YAML)
    before = len(gateway.uploads.seen)
    _, _, err = await nodus("estimate", "-f", str(manifest))
    assert "unknown field" not in err and "spec.source.dir" not in err, err
    assert f"{digest_of(src)[:19]}… (uploaded)" in err
    assert len(gateway.uploads.seen) == before + 1


async def test_apply_source_dir_flag_fills_every_object_without_a_source(
    nodus: Cli, gateway: Gateway, tmp_path: Path
) -> None:
    src = code_tree(tmp_path)
    manifest = write(tmp_path, "sweep.yaml", SWEEP_YAML)
    code, out, err = await nodus("apply", "-f", str(manifest), "--source-dir", str(src))
    assert (code, out.strip()) == (0, "sweep.nodus.dev/lr created"), err
    code, out, _ = await nodus("get", "sweep", "lr", "-o", "json")
    assert json.loads(out)["spec"]["template"]["spec"]["source"] == {"blob": digest_of(src)}

    # A changed file is a new blob, uploaded (and only the new one).
    write(src, "train.py", "print('training harder')\n")
    before = len(gateway.uploads.seen)
    job = write(tmp_path, "job.yaml", JOB_YAML.replace("name: train", "name: train2"))
    code, _, err = await nodus("apply", "-f", str(job))
    assert code == 0 and "(uploaded)" in err, err
    assert len(gateway.uploads.seen) == before + 1
    assert gateway.uploads.seen[-1][0].endswith(digest_of(src))


async def test_source_dir_beside_git_or_missing_is_refused_before_anything_is_sent(
    nodus: Cli, gateway: Gateway, tmp_path: Path
) -> None:
    code_tree(tmp_path)
    both = JOB_YAML.replace("    dir: src\n", "    dir: src\n    git:\n      repo: acme/train\n")
    before = len(gateway.uploads.seen)
    code, out, err = await nodus("apply", "-f", str(write(tmp_path, "both.yaml", both)))
    assert (code, out) == (1, "")
    assert "spec.source: set one of dir, git and blob, not dir and git" in err and "fix:" in err

    missing = JOB_YAML.replace("dir: src", "dir: nowhere")
    code, out, err = await nodus("apply", "-f", str(write(tmp_path, "missing.yaml", missing)))
    assert (code, out) == (1, "")
    assert "spec.source.dir: " in err and "nowhere is not a directory" in err
    assert len(gateway.uploads.seen) == before
    code, _, err = await nodus("get", "job", "train")
    assert code == 1 and "not found" in err


async def test_volume_push_twice_makes_revisions_1_and_2(nodus: Cli, tmp_path: Path) -> None:
    data = tmp_path / "data"
    write(data, "train/0.csv", "a,b\n1,2\n")
    code, out, err = await nodus("volume", "push", "imagenet", str(data))
    assert code == 0, err
    assert out.startswith(f"volume imagenet: revision 1 ({digest_of(data)[:19]}…, ") and "1 files)" in out
    assert "volume: packed 1 files, " in err and "(uploaded)" in err

    write(data, "train/1.csv", "a,b\n3,4\n")
    code, out, err = await nodus("volume", "push", "imagenet", str(data))
    assert (code, out.split("(")[0]) == (0, "volume imagenet: revision 2 "), err

    for argv in (("get", "volumes"), ("volume", "ls"), ("get", "vol")):
        code, out, _ = await nodus(*argv)
        header, row = out.strip().splitlines()
        assert code == 0
        assert header.split() == ["NAME", "LATEST", "SIZE", "WRITER", "AGE"]
        assert row.split()[:2] == ["imagenet", "2"]

    code, out, _ = await nodus("describe", "volume", "imagenet")
    assert code == 0
    revisions = out.split("Revisions:")[1].strip().splitlines()
    assert revisions[0].split()[:2] == ["REVISION", "DIGEST"]
    assert [r.split()[0] for r in revisions[1:]] == ["1", "2"]
    assert digest_of(data)[:19] in revisions[2]


async def test_workspace_push_ls_pull_round_trip(nodus: Cli, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    write(notes, "a.md", "alpha\n")
    write(notes, "deep/b.md", "beta\n")
    write(notes, ".gitignore", "*.tmp\n")
    write(notes, "scratch.tmp", "left out")
    code, out, err = await nodus("workspace", "push", "home", str(notes), "--to", "proj/notes")
    assert (code, out.strip()) == (0, "pushed 3 file(s), 17 B to workspace.nodus.dev/home:/proj/notes"), err

    code, out, _ = await nodus("workspace", "ls", "home", "proj")
    assert code == 0
    listed = [line.split()[0] for line in out.strip().splitlines()[1:]]
    assert listed == ["proj/notes/.gitignore", "proj/notes/a.md", "proj/notes/deep/b.md"]

    dest = tmp_path / "back"
    code, out, err = await nodus("workspace", "pull", "home", "proj/notes", "--to", str(dest))
    assert code == 0, err
    assert (dest / "a.md").read_text() == "alpha\n" and (dest / "deep" / "b.md").read_text() == "beta\n"
    assert not (dest / "scratch.tmp").exists()

    one = tmp_path / "one"
    code, out, err = await nodus("workspace", "pull", "home", "proj/notes/deep/b.md", "--to", str(one))
    assert code == 0, err
    assert [p.name for p in one.iterdir()] == ["b.md"]

    code, out, err = await nodus("workspace", "pull", "home", "proj/none", "--to", str(one))
    assert code == 1 and "error:" in err

    code, out, _ = await nodus("get", "ws")
    assert out.split()[:3] == ["NAME", "FILES", "SIZE"] and out.splitlines()[1].split()[:2] == ["home", "3"]


async def test_describe_shows_each_attempts_source_and_mounts(
    nodus: Cli, nc: NATS, tmp_path: Path, unique: str
) -> None:
    code, _, err = await nodus("apply", "-f", str(write(tmp_path, "j.yaml", JOB_YAML.replace(
        "  source:\n    dir: src\n", ""))))  # fmt: skip
    assert code == 0, err
    spec = AttemptSpec(
        job="train",
        index=0,
        attempt=1,
        node="n1",
        offering="h100-sxm-80g-x1-us",
        region_class="us",
        rate_micros_per_hour=2_990_000,
        pricebook_version="2026-11-30.1",
    )
    status = AttemptStatus(
        phase="Running",
        source=SourceRecord(repo="https://github.com/acme/train.git", ref="main", commit=COMMIT, millis=900),
        mounts=[
            MountRecord(
                name="imagenet", mount_path="/data", revision=3, digest="sha256:" + "ab" * 32,
                cache_hit=True, size_bytes=3 * 1024**3, millis=12,
            ),
            MountRecord(name="home", kind="Workspace", mount_path="/nodus/inputs/notes", cache_hit=None),
        ],
    )  # fmt: skip
    meta = ObjectMeta(name="train-0-a1", namespace=unique, labels={JOB_LABEL: "train"})
    await ObjectStore(nc, "attempts", Attempt).create(Attempt(metadata=meta, spec=spec, status=status))

    code, out, _ = await nodus("describe", "job", "train")
    assert code == 0
    attempts = out.split("Attempts:")[1]
    assert "train-0-a1  index 0  Running  node n1" in attempts
    assert "source:  3f2a9c1b7d0e (main) https://github.com/acme/train.git" in attempts
    assert "mount:   imagenet@3 at /data (read-only, cache hit, 3.0 GiB)" in attempts
    assert "mount:   workspace home at /nodus/inputs/notes (read-only)" in attempts

    code, out, _ = await nodus("describe", "attempt", "train-0-a1")
    assert code == 0
    assert "Source:" in out and "3f2a9c1b7d0e (main)" in out and "900 ms" in out
    assert "imagenet@3 at /data" in out

    # A Sweep whose cell Job "train" ran that commit: describe asks for the cells' Attempts by label.
    assert (await nodus("apply", "-f", str(write(tmp_path, "s.yaml", SWEEP_YAML))))[0] == 0
    cells = [
        SweepCell(index=0, repetition=0, object="train"),
        SweepCell(index=1, repetition=0, object="lr-1"),
    ]
    await ObjectStore(nc, "sweeps", Sweep).mutate(
        unique, "lr", lambda s: msgspec.structs.replace(s, status=SweepStatus(cells=cells))
    )
    code, out, err = await nodus("describe", "sweep", "lr")
    assert code == 0, err
    rows = out.split("\nCells:\n")[1].splitlines()
    assert rows[0].split()[-1] == "SOURCE"
    assert rows[1].split()[-1] == COMMIT[:12] and rows[2].split()[-1] == "-"


def test_describe_sweep_shows_the_code_each_cell_ran() -> None:
    sweep = msgspec.convert(
        {
            "metadata": {"name": "lr"},
            "spec": {"matrix": {"params": {"LR": ["0.1", "0.01"]}}, "template": {"spec": {"image": "x"}}},
            "status": {"cells": [{"index": 0, "repetition": 0}, {"index": 1, "repetition": 0}]},
        },
        Sweep,
    )

    def attempt(job: str, n: int, source: SourceRecord) -> Attempt:
        spec = AttemptSpec(job=job, index=0, attempt=n, node="n1", offering="o", region_class="us",
                           rate_micros_per_hour=1, pricebook_version="v")  # fmt: skip
        return Attempt(
            metadata=ObjectMeta(name=f"{job}-a{n}"), spec=spec, status=AttemptStatus(source=source)
        )

    old, new = "1" * 40, "2" * 40
    attempts = [
        attempt("lr-0", 1, SourceRecord(commit=old)),
        attempt("lr-0", 2, SourceRecord(commit=new)),  # the retry ran the branch's newer commit
        attempt("lr-1", 1, SourceRecord(blob="sha256:" + "cd" * 32)),
    ]
    cells = describe_sweep(sweep, attempts).split("\nCells:\n")[1].splitlines()
    assert cells[0].split()[-1] == "SOURCE"
    assert cells[1].split()[-1] == new[:12]
    assert cells[2].split()[-1] == "sha256:cdcdcdcdcdcd…"
    # No Attempt has reported its code yet: no column at all.
    assert "SOURCE" not in describe_sweep(sweep, [])


async def test_the_async_sdk_uploads_once_and_says_no_clearly(
    gateway: Gateway, unique: str, tmp_path: Path
) -> None:
    src = code_tree(tmp_path)
    async with AsyncClient(Config(server=gateway.url, token=TOKEN, project=unique)) as nodus:
        first = await nodus.upload_dir(src)
        assert (first.uploaded, first.files, first.digest) == (True, 3, digest_of(src))
        again = await nodus.upload_dir(src)
        assert (again.uploaded, again.digest, again.size_bytes) == (False, first.digest, first.size_bytes)

        volume, done = await nodus.volumes.push("ds", src)
        assert (volume.status.latest, done.uploaded) == (1, False)
        assert volume.status.revisions[0].digest == first.digest

        pushed = await nodus.workspaces.push("w", src, to="code")
        assert sorted(pushed.paths) == ["code/.gitignore", "code/lib/model.py", "code/train.py"]
        assert [f.path async for f in nodus.workspaces.ls("w", "code/lib")] == ["code/lib/model.py"]

        raw = write(tmp_path, "raw.bin", "not a tar.zst")
        with pytest.raises(Invalid) as refused:
            await nodus.upload_blob(raw)
        assert refused.value.code == 422 and refused.value.fix
