"""Code and data in (issue #20), end to end: every service as its own process, real SeaweedFS, a real git
host over https on loopback (its own CA, trusted by the gateway and the agents), two agents with the
process runtime and one with the docker runtime on podman.

A Job runs code from a git tag and from an uploaded directory; a Sweep whose cells mount one Volume
revision downloads it once per node (the Attempts say which mounts hit the cache); a writable mount makes
revision n+1 with the program's files; a Workspace file reaches a Job; bad references are refused at
admission with their causes; a repository that vanished after admission fails the Attempt with
SourceUnavailable. The container agent runs the same checkout, Volume and Workspace in a container.
"""

from __future__ import annotations

import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from nodus_sdk import AsyncClient
from nodus_testing.gitserver import GitServer
from nodus_testing.localstack import Stack, agent
from nodus_testing.podman import SANDBOX_ULIMITS, PodmanService
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow

NS = "data"
BASE = f"/apis/nodus.dev/v1/namespaces/{NS}"
PY = sys.executable
L4 = "L4:1"  # the two process agents
A10G = "A10G:1"  # the container agent


def _ulimits() -> str:
    return ",".join(f"{u['Name']}={u['Soft']}:{u['Hard']}" for u in SANDBOX_ULIMITS)


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, git_server: GitServer, podman: PodmanService, busybox_image: str
) -> Iterator[dict[str, str]]:
    ca = str(git_server.ca)
    container_agent = {
        **agent("a10g-c", "a10g-x1-us", "us", "A10G", "24Gi"),
        "NODUS_AGENT_RUNTIME": "docker",
        "NODUS_AGENT_DOCKER_SOCKET": str(podman.socket_path),
        "NODUS_AGENT_DOCKER_GPU_MODE": "none",
        "NODUS_AGENT_DOCKER_ULIMITS": _ulimits(),
    }
    s = Stack(
        tmp_path_factory.mktemp("stack"),
        agents=[
            agent("l4-a", "l4-x1-us", "us", "L4", "24Gi"),
            agent("l4-b", "l4-x1-us", "us", "L4", "24Gi"),
            container_agent,
        ],
        env={
            "NODUS_GIT_HOST": git_server.base,
            "NODUS_GATEWAY_GIT_CA_BUNDLE": ca,
            "NODUS_AGENT_CA_BUNDLE": ca,
        },
    )
    try:
        yield s.start(deadline_s=120)
    finally:
        s.stop()


@pytest_asyncio.fixture
async def http(stack: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=stack["NODUS_URL"],
        headers={"Authorization": f"Bearer {stack['NODUS_TOKEN']}"},
        timeout=30,
        verify=ssl.create_default_context(cafile=stack["NODUS_CA"]),
    ) as c:
        yield c


@pytest_asyncio.fixture
async def sdk(stack: dict[str, str]) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(
        server=stack["NODUS_URL"], token=stack["NODUS_TOKEN"], project=NS, ca=stack["NODUS_CA"]
    ) as c:
        yield c


def job(name: str, gpu: str = L4, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"image": "python:3.11-slim", "resources": {"gpu": gpu}, "backoffLimit": 0, **spec},
    }


def program(text: str) -> list[str]:
    """A Python program for the process agents: the interpreter of this test, the text inline."""
    return [PY, "-c", text]


async def created(http: httpx.AsyncClient, body: dict[str, Any], plural: str = "jobs") -> dict[str, Any]:
    r = await http.post(f"{BASE}/{plural}", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def finished(http: httpx.AsyncClient, name: str, plural: str = "jobs") -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        obj = (await http.get(f"{BASE}/{plural}/{name}")).json()
        return obj if obj.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    return await eventually(done, deadline_s=120, interval_s=0.3, message=f"{plural}/{name} never finished")


async def attempts_of(http: httpx.AsyncClient, job_name: str) -> list[dict[str, Any]]:
    r = await http.get(f"{BASE}/attempts", params={"labelSelector": f"nodus.dev/job={job_name}"})
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


async def log_of(http: httpx.AsyncClient, name: str) -> str:
    return (await http.get(f"{BASE}/jobs/{name}/log")).text


def causes(r: httpx.Response) -> dict[str, str]:
    assert r.status_code == 422, r.text
    return {c["field"]: c["message"] for c in r.json()["details"]["causes"]}


# -- code --------------------------------------------------------------------------------------------------
async def test_a_job_runs_code_from_a_git_tag_and_records_the_commit(
    http: httpx.AsyncClient, git_server: GitServer
) -> None:
    repo, _ = git_server.create_repo("acme/train", {"train.py": "print('v0')\n", "VERSION": "0\n"})
    tagged = repo.commit({"train.py": "import os; print('trained at', os.getcwd())\n", "VERSION": "1\n"})
    repo.tag("v1", tagged)
    repo.commit({"train.py": "raise SystemExit('main moved on: not this one')\n"})
    await created(
        http,
        job(
            "from-git",
            source={"git": {"repo": "acme/train", "ref": "v1"}},
            command=[PY, "-c", "exec(open('train.py').read()); assert open('VERSION').read() == '1\\n'"],
        ),
    )
    done = await finished(http, "from-git")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    (attempt,) = await attempts_of(http, "from-git")
    source = attempt["status"]["source"]
    assert source["commit"] == tagged and source["ref"] == "v1"
    assert source["repo"] == git_server.url("acme/train")


async def test_a_job_runs_code_from_an_uploaded_directory_and_an_unchanged_one_uploads_nothing(
    http: httpx.AsyncClient, sdk: AsyncClient, tmp_path: Path
) -> None:
    (tmp_path / "main.py").write_text("import json; print(json.load(open('conf/params.json'))['lr'])\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "params.json").write_text('{"lr": 0.125}')
    (tmp_path / ".nodusignore").write_text("*.ckpt\n")
    (tmp_path / "big.ckpt").write_bytes(b"left out" * 1000)
    first = await sdk.upload_dir(tmp_path)
    again = await sdk.upload_dir(tmp_path)
    assert first.uploaded and not again.uploaded and first.digest == again.digest
    await created(http, job("from-dir", source={"blob": first.digest}, command=[PY, "main.py"]))
    done = await finished(http, "from-dir")
    assert done["status"]["phase"] == "Succeeded", await log_of(http, "from-dir")
    assert "0.125" in await log_of(http, "from-dir")
    (attempt,) = await attempts_of(http, "from-dir")
    assert attempt["status"]["source"]["blob"] == first.digest


# -- data --------------------------------------------------------------------------------------------------
async def test_a_sweep_over_one_volume_revision_downloads_it_once_per_node(
    http: httpx.AsyncClient, sdk: AsyncClient, tmp_path: Path
) -> None:
    (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
    volume, _ = await sdk.volumes.push("dataset", tmp_path)
    assert volume.status.latest == 1
    read = "import os; assert open(os.environ['NODUS_MOUNTS'] + '/data/rows.csv').read() == 'a,b\\n1,2\\n'"
    sweep = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": "over-data"},
        "spec": {
            "maxParallel": 2,
            "matrix": {"params": {"X": ["a", "b", "c", "d", "e", "f"]}},
            "template": {
                "kind": "Job",
                "spec": {
                    **job("t")["spec"],
                    "command": program(read),
                    "volumes": [{"volume": "dataset", "mountPath": "/data", "readOnly": True}],
                },
            },
        },
    }
    stored = await created(http, sweep, "sweeps")
    # Pinned at admission: every cell reads revision 1, whatever is pushed meanwhile.
    assert stored["spec"]["template"]["spec"]["volumes"][0]["revision"] == 1
    await sdk.volumes.push("dataset", _changed(tmp_path))
    done = await finished(http, "over-data", "sweeps")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    mounts = []
    for i in range(6):
        for a in await attempts_of(http, f"over-data-{i}"):
            (m,) = a["status"]["mounts"]
            assert (m["name"], m["revision"], m["mountPath"]) == ("dataset", 1, "/data")
            mounts.append((a["spec"]["node"], m["cacheHit"]))
    misses = [node for node, hit in mounts if not hit]
    # Each node downloaded revision 1 at most once; every other cell on it was a cache hit.
    assert len(misses) == len(set(misses)) <= 2
    assert sum(hit for _, hit in mounts) >= len(mounts) - 2


def _changed(folder: Path) -> Path:
    (folder / "rows.csv").write_text("a,b\n3,4\n")
    return folder


async def test_a_writable_mount_makes_the_next_revision_with_the_programs_files(
    http: httpx.AsyncClient, sdk: AsyncClient, tmp_path: Path
) -> None:
    (tmp_path / "seed.txt").write_text("seed\n")
    await sdk.volumes.push("results", tmp_path)
    write = (
        "import os; d = os.environ['NODUS_MOUNTS'] + '/out'; "
        "assert open(d + '/seed.txt').read() == 'seed\\n'; open(d + '/model.txt', 'w').write('trained\\n')"
    )
    await created(
        http,
        job(
            "writer",
            command=program(write),
            volumes=[{"volume": "results", "mountPath": "/out", "readOnly": False}],
        ),
    )
    done = await finished(http, "writer")
    assert done["status"]["phase"] == "Succeeded", await log_of(http, "writer")
    volume = (await http.get(f"{BASE}/volumes/results")).json()
    assert volume["status"]["latest"] == 2
    made = volume["status"]["revisions"][-1]
    assert made["creator"] == "job:writer" and made["attempt"]
    check = (
        "import os; d = os.environ['NODUS_MOUNTS'] + '/in'; "
        "assert sorted(os.listdir(d)) == ['model.txt', 'seed.txt'], os.listdir(d)"
    )
    reader = job(
        "reader",
        command=program(check),
        volumes=[{"volume": "results", "mountPath": "/in", "readOnly": True}],
    )
    assert (await created(http, reader))["spec"]["volumes"][0]["revision"] == 2
    assert (await finished(http, "reader"))["status"]["phase"] == "Succeeded", await log_of(http, "reader")


async def test_a_workspace_file_reaches_a_job(
    http: httpx.AsyncClient, sdk: AsyncClient, tmp_path: Path
) -> None:
    (tmp_path / "tokenizer.json").write_text('{"vocab": 32000}')
    await sdk.workspaces.push("alice", tmp_path, to="tokenizers")
    read = (
        "import os, json; print(json.load(open(os.environ['NODUS_INPUTS'] + '/tok/tokenizer.json'))['vocab'])"
    )
    await created(
        http,
        job(
            "with-home",
            command=program(read),
            inputs=[{"name": "tok", "fromWorkspace": {"name": "alice", "path": "tokenizers"}}],
        ),
    )
    assert (await finished(http, "with-home"))["status"]["phase"] == "Succeeded", await log_of(
        http, "with-home"
    )
    assert "32000" in await log_of(http, "with-home")


# -- refusals ----------------------------------------------------------------------------------------------
async def test_bad_references_are_refused_at_admission_with_their_causes(
    http: httpx.AsyncClient, sdk: AsyncClient, git_server: GitServer, tmp_path: Path
) -> None:
    git_server.create_repo("acme/refs", {"a.py": "pass\n"})
    (tmp_path / "x").write_text("x")
    await sdk.volumes.push("refdata", tmp_path)
    unknown_blob = "sha256:" + "0" * 64
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"volumes": [{"volume": "no-such-volume", "mountPath": "/d", "readOnly": True}]},
            "spec.volumes[0].volume",
        ),
        (
            {"inputs": [{"name": "d", "volume": {"name": "refdata", "revision": 0}}]},
            "spec.inputs[0].volume.revision",
        ),
        (
            {"inputs": [{"name": "d", "volume": {"name": "refdata", "revision": 99}}]},
            "spec.inputs[0].volume.revision",
        ),
        ({"source": {"git": {"repo": "acme/refs", "ref": "no-such-branch"}}}, "spec.source.git.ref"),
        ({"source": {"blob": unknown_blob}}, "spec.source.blob"),
        (
            {"volumes": [{"volume": "refdata", "mountPath": "/nodus/data", "readOnly": True}]},
            "spec.volumes[0].mountPath",
        ),
        (
            {"volumes": [{"volume": "refdata", "mountPath": "/proc", "readOnly": True}]},
            "spec.volumes[0].mountPath",
        ),
        (
            {"inputs": [{"name": "h", "fromWorkspace": {"name": "nobody"}}]},
            "spec.inputs[0].fromWorkspace.name",
        ),
    ]
    for i, (spec, field) in enumerate(cases):
        r = await http.post(f"{BASE}/jobs", json=job(f"refused-{i}", command=["true"], **spec))
        found = causes(r)
        assert field in found, (field, found)
        assert (await http.get(f"{BASE}/jobs/refused-{i}")).status_code == 404  # nothing half-written


async def test_a_repository_that_vanished_after_admission_fails_the_attempt_with_source_unavailable(
    http: httpx.AsyncClient, git_server: GitServer
) -> None:
    git_server.create_repo("acme/gone", {"train.py": "print('hi')\n"})
    await created(
        http,
        job(
            "orphan",
            state="Suspended",
            source={"git": {"repo": "acme/gone", "ref": "main"}},
            command=[PY, "train.py"],
        ),
    )
    git_server.delete_repo("acme/gone")
    r = await http.patch(
        f"{BASE}/jobs/orphan",
        json={"spec": {"state": "Running"}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 200, r.text
    done = await finished(http, "orphan")
    assert done["status"]["phase"] == "Failed"
    (attempt,) = await attempts_of(http, "orphan")
    st = attempt["status"]
    assert st["reason"] == "SourceUnavailable" and "acme/gone" in st["message"]
    assert "startTime" not in st  # the program never ran: nothing of it is billed as Running


# -- the container runtime ---------------------------------------------------------------------------------
async def test_a_container_sees_the_checkout_the_volume_and_the_workspace(
    http: httpx.AsyncClient, sdk: AsyncClient, git_server: GitServer, busybox_image: str, tmp_path: Path
) -> None:
    _, commit = git_server.create_repo("acme/box", {"run.sh": "echo from-git\n"})
    (tmp_path / "d.txt").write_text("from-volume\n")
    await sdk.volumes.push("boxdata", tmp_path)
    await sdk.workspaces.push("bob", tmp_path, to="notes")
    script = "set -e; sh run.sh; cat /data/d.txt; cat /nodus/inputs/notes/d.txt; pwd"
    body = job(
        "in-a-box",
        gpu=A10G,
        image=busybox_image,
        source={"git": {"repo": "acme/box", "ref": "main"}},
        command=["sh", "-c", script],
        volumes=[{"volume": "boxdata", "mountPath": "/data", "readOnly": True}],
        inputs=[{"name": "notes", "fromWorkspace": {"name": "bob", "path": "notes"}}],
    )
    await created(http, body)
    done = await finished(http, "in-a-box")
    text = await log_of(http, "in-a-box")
    assert done["status"]["phase"] == "Succeeded", text
    assert "from-git" in text and text.count("from-volume") == 2 and "/nodus/src" in text
    (attempt,) = await attempts_of(http, "in-a-box")
    assert attempt["spec"]["node"] == "a10g-c" and attempt["status"]["source"]["commit"] == commit
