"""``GET .../jobs/{name}/log`` against the session's nats-server, with lines shipped by the node agent's real
LogShipper into NODUS_LOGS: order, index and attempt, tailLines, sinceSeconds, timestamps, follow (over
uvicorn: httpx's ASGI transport buffers a whole response), authorization, and ``nodus logs``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_agent.logshipping import LogShipper, now_rfc3339
from nodus_cli import main
from nodus_gateway import logstreaming
from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_kit.storing import ObjectStore
from nodus_schema import Job
from nodus_schema.attempts import attempt_name
from nodus_schema.messages import StartAttempt
from nodus_testing.binding import bind_attempt
from nodus_testing.waiting import eventually

from .conftest import ADMIN_TOKEN

V1 = "/apis/nodus.dev/v1"
DEADLINE_S = 10.0


def job_body(name: str, completions: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "image": "ghcr.io/acme/train:1.0",
            "command": ["python", "train.py"],
            "resources": {"gpu": "H100:1"},
            "completions": completions,
        },
    }


def log_path(namespace: str, name: str) -> str:
    return f"{V1}/namespaces/{namespace}/jobs/{name}/log"


class Shipping:
    """Ships lines as a node agent would, for the attempts of one Job."""

    def __init__(self, nc: NATS, root: Path, namespace: str, job: str, uid: str) -> None:
        self.nc, self.root, self.namespace, self.job, self.uid = nc, root, namespace, job, uid

    async def lines(self, index: int, attempt: int, lines: list[str], *, uid: str | None = None) -> None:
        name = attempt_name(self.job, uid or self.uid, index, attempt)
        log = self.root / name / "log.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write("".join(f"{line}\n" for line in lines))
        job = await ObjectStore(self.nc, "jobs", Job).get(self.namespace, self.job)
        # The Attempt the scheduler would have written: the gateway shows a line only from its node.
        await bind_attempt(self.nc, self.namespace, name, job, "node-1", index=index, attempt_no=attempt)
        source = StartAttempt(
            namespace=self.namespace,
            job=self.job,
            attempt=name,
            index=index,
            attempt_no=attempt,
            node="node-1",
        )
        assert await LogShipper(self.nc, source, log).close(final=True)


async def create_job(client: httpx.AsyncClient, namespace: str, name: str) -> str:
    resp = await client.post(f"{V1}/namespaces/{namespace}/jobs", json=job_body(name))
    assert resp.status_code == 201, resp.text
    uid: str = resp.json()["metadata"]["uid"]
    return uid


async def finish_job(nc: NATS, namespace: str, name: str) -> None:
    """What the scheduler does when the last index ends: the Job's phase becomes terminal."""
    store = ObjectStore(nc, "jobs", Job)
    job = await store.get(namespace, name)
    await store.update(
        msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, phase="Succeeded"))
    )


@pytest_asyncio.fixture
async def shipped(api: httpx.AsyncClient, nc: NATS, unique: str, tmp_path: Path) -> Shipping:
    """Job ``train`` in project ``<unique>``: index 0 ran twice (a1 lost its node), index 1 once."""
    uid = await create_job(api, unique, "train")
    ship = Shipping(nc, tmp_path, unique, "train", uid)
    await ship.lines(0, 1, [f"a1 line {i}" for i in range(5)])
    await ship.lines(1, 1, ["index 1 only"])
    await ship.lines(0, 2, [f"a2 line {i}" for i in range(3)])
    return ship


@pytest_asyncio.fixture
async def server(app: FastAPI) -> AsyncIterator[ApiServer]:
    srv = ApiServer(app, "127.0.0.1", 0)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


# -- reading ------------------------------------------------------------------------------------------------
async def test_the_log_of_an_index_is_every_attempt_in_order(
    api: httpx.AsyncClient, shipped: Shipping
) -> None:
    resp = await api.get(log_path(shipped.namespace, "train"))
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    assert resp.text.splitlines() == [f"a1 line {i}" for i in range(5)] + [f"a2 line {i}" for i in range(3)]

    one = await api.get(log_path(shipped.namespace, "train"), params={"attempt": 1})
    assert one.text.splitlines() == [f"a1 line {i}" for i in range(5)]
    other = await api.get(log_path(shipped.namespace, "train"), params={"index": 1})
    assert other.text == "index 1 only\n"


async def test_tail_lines_and_timestamps(api: httpx.AsyncClient, shipped: Shipping) -> None:
    resp = await api.get(log_path(shipped.namespace, "train"), params={"tailLines": 2})
    assert resp.text.splitlines() == ["a2 line 1", "a2 line 2"]
    assert (await api.get(log_path(shipped.namespace, "train"), params={"tailLines": 0})).text == ""
    stamped = await api.get(
        log_path(shipped.namespace, "train"), params={"tailLines": 1, "timestamps": "true"}
    )
    time, _, text = stamped.text.rstrip("\n").partition(" ")
    assert text == "a2 line 2" and time.endswith("Z") and time[:4].isdigit()


async def test_since_seconds_uses_the_time_of_each_line(api: httpx.AsyncClient, shipped: Shipping) -> None:
    old = "2020-01-01T00:00:00.000000000Z stdout"
    await shipped.lines(0, 3, [f"{old} long ago", f"{now_rfc3339()} stderr just now"])
    resp = await api.get(log_path(shipped.namespace, "train"), params={"sinceSeconds": 60, "attempt": 3})
    assert resp.text == "just now\n"


async def test_a_deleted_namesakes_lines_stay_out(api: httpx.AsyncClient, shipped: Shipping) -> None:
    await shipped.lines(0, 1, ["from the Job of the same name deleted last week"], uid="0ldjob00-uid")
    resp = await api.get(log_path(shipped.namespace, "train"), params={"attempt": 1})
    assert "deleted last week" not in resp.text


async def test_errors_are_statuses(api: httpx.AsyncClient, shipped: Shipping) -> None:
    missing = await api.get(log_path(shipped.namespace, "nope"))
    assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"
    out_of_range = await api.get(log_path(shipped.namespace, "train"), params={"index": 2})
    assert out_of_range.status_code == 400 and "indexes 0 to 1" in out_of_range.json()["message"]
    bad = await api.get(log_path(shipped.namespace, "train"), params={"tailLines": -1})
    assert bad.status_code == 400 and bad.json()["kind"] == "Status"


# -- following ----------------------------------------------------------------------------------------------
async def test_follow_streams_new_lines_until_the_job_finishes(
    server: ApiServer, shipped: Shipping, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logstreaming, "JOB_POLL_S", 0.1)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=DEADLINE_S) as client:
        params = {"follow": "true", "tailLines": 1}
        async with client.stream("GET", log_path(shipped.namespace, "train"), params=params) as resp:
            assert resp.status_code == 200
            lines = resp.aiter_lines()
            async with asyncio.timeout(DEADLINE_S):
                assert await anext(lines) == "a2 line 2"
                await shipped.lines(0, 2, ["resumed from the checkpoint"])
                assert await anext(lines) == "resumed from the checkpoint"
                await shipped.lines(0, 2, ["the last line"])
                await finish_job(nc, shipped.namespace, "train")
                rest = [line async for line in lines]  # ends: the Job is terminal and every line was sent
    assert rest == ["the last line"]


# -- authorization ------------------------------------------------------------------------------------------
async def test_reading_a_log_needs_a_role_in_the_project(nc: NATS, unique: str, tmp_path: Path) -> None:
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=Principals(nc, pepper=b"logs"))
    mine, theirs = f"p-{unique}", f"q-{unique}"

    def client(token: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app)
        return httpx.AsyncClient(
            transport=transport, base_url="http://gw", headers={"Authorization": f"Bearer {token}"}
        )

    async with client(ADMIN_TOKEN) as admin:
        for project in (mine, theirs):
            assert (
                await admin.post(f"{V1}/projects", json={"metadata": {"name": project}})
            ).status_code == 201
        uid = await create_job(admin, mine, "train")
        await Shipping(nc, tmp_path, mine, "train", uid).lines(0, 1, ["for viewers of p only"])
        tokens = {}
        for who, project in (("viewer", mine), ("stranger", theirs)):
            resp = await admin.post(
                f"{V1}/tokens", json={"spec": {"principal": who, "roles": {project: "viewer"}}}
            )
            assert resp.status_code == 201, resp.text
            tokens[who] = resp.json()["secret"]
    async with client(tokens["viewer"]) as viewer:
        assert (await viewer.get(log_path(mine, "train"))).text == "for viewers of p only\n"
    async with client(tokens["stranger"]) as stranger:
        resp = await stranger.get(log_path(mine, "train"))
        assert resp.status_code == 404 and "for viewers" not in resp.text  # another tenant's Job: not there


# -- the CLI ------------------------------------------------------------------------------------------------
async def test_nodus_logs_prints_and_follows(
    server: ApiServer,
    shipped: Shipping,
    nc: NATS,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logstreaming, "JOB_POLL_S", 0.1)
    base = ["--server", server.url, "--token", ADMIN_TOKEN, "-n", shipped.namespace, "logs", "train"]
    capsys.readouterr()
    assert await asyncio.to_thread(main, [*base, "--tail", "2"]) == 0
    assert capsys.readouterr().out == "a2 line 1\na2 line 2\n"
    assert await asyncio.to_thread(main, [*base, "--index", "1"]) == 0
    assert capsys.readouterr().out == "index 1 only\n"
    assert await asyncio.to_thread(main, [*base[:-1], "nope"]) == 1
    assert 'jobs.nodus.dev "nope" not found' in capsys.readouterr().err


async def test_nodus_logs_follow_ends_with_the_job(
    server: ApiServer,
    api: httpx.AsyncClient,
    nc: NATS,
    unique: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logstreaming, "JOB_POLL_S", 0.1)
    ship = Shipping(nc, tmp_path, unique, "follow-me", await create_job(api, unique, "follow-me"))
    await ship.lines(0, 1, ["before 1", "before 2"])
    capsys.readouterr()
    args = [
        "--server",
        server.url,
        "--token",
        ADMIN_TOKEN,
        "-n",
        unique,
        "logs",
        "follow-me",
        "-f",
        "--tail",
        "1",
    ]
    following = asyncio.ensure_future(asyncio.to_thread(main, args))

    async def reading() -> bool:  # the gateway's consumer for this Job exists: later lines are "new"
        infos = await nc.jetstream().consumers_info(logstreaming.STREAM)
        return any(i.config.filter_subject == f"nodus.logs.*.{unique}.follow-me.*" for i in infos)

    await eventually(reading, message="the CLI's request never reached the stream")
    await ship.lines(0, 1, ["while following"])
    await finish_job(nc, unique, "follow-me")
    assert await asyncio.wait_for(following, DEADLINE_S) == 0
    assert capsys.readouterr().out.splitlines() == ["before 2", "while following"]
