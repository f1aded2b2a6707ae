"""Jobs that call the Nodus API as their ServiceAccount (issue #21, ADR-0037), end to end: every service as
its own process, https with the local CA, one agent with the process runtime.

A Job names a ServiceAccount with the editor role; its program, with nothing but the env the agent gave it
(NODUS_URL, NODUS_TOKEN, NODUS_CA, NODUS_NAMESPACE), creates a second Job in its project with the SDK and
lists the project's Jobs with a plain HTTP client trusting NODUS_CA. The second Job exists; the token is
masked in the shipped log and appears in no object; once the first Attempt has ended the same token gets
401 and its files are gone from the node.
"""

from __future__ import annotations

import errno
import os
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from nodus_testing.localstack import Stack, agent
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow

NS = "sa-e2e"
BASE = f"/apis/nodus.dev/v1/namespaces/{NS}"
PY = sys.executable
NODE = "l4-sa"

PROGRAM = """
import json, os, ssl, sys, urllib.request
from nodus_sdk import Client, load_objects

child = {
    "apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "child"},
    "spec": {"image": "python:3.11-slim", "command": [sys.executable, "-c", "pass"],
             "resources": {"gpu": "L4:1"}, "backoffLimit": 0},
}
with Client() as nodus:  # NODUS_URL, NODUS_TOKEN, NODUS_CA and NODUS_NAMESPACE: nothing else
    made = nodus.jobs.create(load_objects(json.dumps(child))[0])
    print("created", made.metadata.name, "in", nodus.project, flush=True)
request = urllib.request.Request(
    os.environ["NODUS_URL"] + "/apis/nodus.dev/v1/namespaces/" + os.environ["NODUS_NAMESPACE"] + "/jobs",
    headers={"Authorization": "Bearer " + open(os.environ["NODUS_SA_DIR"] + "/token").read()},
)
context = ssl.create_default_context(cafile=os.environ["NODUS_CA"])
names = [j["metadata"]["name"] for j in json.load(urllib.request.urlopen(request, context=context))["items"]]
print("jobs seen:", sorted(names), flush=True)
print("the token is", os.environ["NODUS_TOKEN"], flush=True)
open(os.environ["GO"]).read()  # blocks until the test writes to the FIFO: then the run ends
"""


@pytest.fixture(scope="module")
def stack_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="module")
def stack(stack_root: Path) -> Iterator[dict[str, str]]:
    s = Stack(stack_root, agents=[agent(NODE, "l4-x1-us", "us", "L4", "24Gi")], s3=False)
    try:
        yield s.start(deadline_s=120)
    finally:
        s.stop()


def client(stack: dict[str, str], token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=stack["NODUS_URL"],
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
        verify=ssl.create_default_context(cafile=stack["NODUS_CA"]),
    )


@pytest_asyncio.fixture
async def http(stack: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with client(stack, stack["NODUS_TOKEN"]) as c:
        yield c


async def created(http: httpx.AsyncClient, plural: str, body: dict[str, Any]) -> None:
    r = await http.post(f"{BASE}/{plural}", json=body)
    assert r.status_code == 201, r.text


async def attempt_of(http: httpx.AsyncClient, job: str) -> dict[str, Any] | None:
    r = await http.get(f"{BASE}/attempts", params={"labelSelector": f"nodus.dev/job={job}"})
    items = r.json()["items"]
    return dict(items[0]) if items else None


def wake(fifo: Path) -> bool:
    """Tell the program to end: write to its FIFO once it reads it (without blocking: ENXIO until then)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return False
        raise
    with os.fdopen(fd, "w") as f:
        f.write("go\n")
    return True


async def test_a_job_creates_a_job_with_its_service_account_until_its_run_ends(
    stack: dict[str, str], stack_root: Path, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    os.mkfifo(go)
    await created(http, "serviceaccounts", {"metadata": {"name": "launcher"}, "spec": {"role": "editor"}})
    parent = {
        "metadata": {"name": "parent"},
        "spec": {
            "image": "python:3.11-slim",
            "command": [PY, "-c", PROGRAM],
            "env": [{"name": "GO", "value": str(go)}],
            "resources": {"gpu": "L4:1"},
            "backoffLimit": 0,
            "serviceAccountName": "launcher",
        },
    }
    await created(http, "jobs", parent)

    async def child() -> dict[str, Any] | None:
        r = await http.get(f"{BASE}/jobs/child")
        return dict(r.json()) if r.status_code == 200 else None

    made = await eventually(child, deadline_s=90, interval_s=0.3, message="the program created no Job")
    assert made["metadata"]["namespace"] == NS

    # While the run lives, its token (from its folder on the node) works, as an editor of NS only.
    running = await eventually(lambda: attempt_of(http, "parent"), deadline_s=30, message="no Attempt")
    folder = stack_root / "agents" / NODE / NS / running["metadata"]["name"] / "serviceaccount"
    token_file = folder / "token"
    token = await eventually(
        lambda: token_file.read_text() if token_file.exists() else None, message="no token file on the node"
    )
    async with client(stack, token) as sa:
        jobs = await sa.get(f"{BASE}/jobs")
        assert jobs.status_code == 200, jobs.text
        assert (await sa.get("/apis/nodus.dev/v1/namespaces/someone-else/jobs")).status_code == 403

    async def logged() -> str | None:
        text = (await http.get(f"{BASE}/jobs/parent/log")).text
        return text if "the token is" in text else None

    log = await eventually(logged, deadline_s=30, interval_s=0.3, message="the program's log never arrived")
    assert "created child in sa-e2e" in log and "'child'" in log and "'parent'" in log
    assert "the token is ***" in log and token not in log

    # The run ends: the same token is refused, as an unknown token is, and its files are gone.
    await eventually(lambda: wake(go), deadline_s=30, message="the program never waited to be told to end")

    async def ended() -> bool:
        a = await attempt_of(http, "parent")
        return a is not None and a["status"].get("phase") == "Succeeded"

    await eventually(ended, deadline_s=60, interval_s=0.3, message="the parent's Attempt never succeeded")

    async def refused() -> bool:
        async with client(stack, token) as sa:
            return (await sa.get(f"{BASE}/jobs")).status_code == 401

    await eventually(refused, deadline_s=5, interval_s=0.2, message="the token outlived its run")
    assert not folder.exists()
    mac = token.rsplit(".", 1)[1]
    for plural in ("jobs", "attempts", "serviceaccounts"):
        assert mac not in (await http.get(f"{BASE}/{plural}")).text
