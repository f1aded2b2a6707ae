"""Watch streams over a real HTTP server (uvicorn): httpx's ASGI transport buffers a whole response, so
it cannot read a stream that has not ended."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway import watching
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_kit.watching import Watch
from nodus_testing.waiting import eventually

API = "/apis/nodus.dev/v1"
MERGE = {"Content-Type": "application/merge-patch+json"}
DEADLINE_S = 10.0

Event = dict[str, Any]


def sweeps(namespace: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/sweeps", *rest])


def sweep_body(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    job = {
        "image": "ghcr.io/acme/train:1.0",
        "command": ["python", "train.py"],
        "resources": {"gpu": "H100:1"},
    }
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"matrix": {"params": {"LR": ["0.1", "0.01"]}}, "template": {"spec": job}},
    }


@pytest_asyncio.fixture
async def client(app: FastAPI, api: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app served by uvicorn on a free port (with the in-process client's token)."""
    server = ApiServer(app, "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": api.headers["Authorization"]}, timeout=DEADLINE_S
        ) as c:
            yield c
    finally:
        await server.stop()


class Stream:
    """The events of a watch response, each read under a deadline."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()

    async def next(self, deadline_s: float = DEADLINE_S) -> Event:
        async with asyncio.timeout(deadline_s):
            while True:
                line = await anext(self._lines)
                if line.strip():
                    event: Event = json.loads(line)
                    return event

    async def until(self, wanted: Callable[[Event], bool], deadline_s: float = DEADLINE_S) -> Event:
        async with asyncio.timeout(deadline_s):
            while True:
                event = await self.next(deadline_s)
                if wanted(event):
                    return event

    async def rest(self, deadline_s: float = DEADLINE_S) -> list[Event]:
        """Every remaining event, once the server ends the stream."""
        events: list[Event] = []
        async with asyncio.timeout(deadline_s):
            while True:
                try:
                    events.append(await self.next(deadline_s))
                except StopAsyncIteration:
                    return events


@asynccontextmanager
async def watch(client: httpx.AsyncClient, url: str, **params: Any) -> AsyncIterator[Stream]:
    async with client.stream("GET", url, params={"watch": "true", **params}) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("application/json")
        yield Stream(resp)


def summary(event: Event) -> tuple[str, str]:
    return event["type"], event["object"]["metadata"]["name"]


async def patch(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await client.patch(url, json=body, headers=MERGE)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


async def create(client: httpx.AsyncClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(sweeps(namespace), json=body)
    assert resp.status_code == 201, resp.text
    out: dict[str, Any] = resp.json()
    return out


async def test_added_modified_deleted_in_order(client: httpx.AsyncClient, unique: str) -> None:
    await create(client, unique, sweep_body("before"))
    async with watch(client, sweeps(unique)) as stream:
        # Without a resourceVersion, the current objects come first, as ADDED.
        assert summary(await stream.next()) == ("ADDED", "before")
        await create(client, unique, sweep_body("lr"))
        await patch(client, sweeps(unique, "lr"), {"spec": {"maxParallel": 1}})
        assert (await client.delete(sweeps(unique, "lr"))).status_code == 200
        events = [await stream.next() for _ in range(3)]
    assert [summary(e) for e in events] == [("ADDED", "lr"), ("MODIFIED", "lr"), ("DELETED", "lr")]
    assert events[1]["object"]["spec"]["maxParallel"] == 1
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and len(set(versions)) == 3


async def test_watch_from_a_resource_version(client: httpx.AsyncClient, unique: str) -> None:
    await create(client, unique, sweep_body("lr"))
    listed = (await client.get(sweeps(unique))).json()
    await patch(client, sweeps(unique, "lr"), {"spec": {"maxParallel": 2}})
    async with watch(client, sweeps(unique), resourceVersion=listed["metadata"]["resourceVersion"]) as stream:
        event = await stream.next()
    # Only what changed after the list: no ADDED for what the list already had.
    assert summary(event) == ("MODIFIED", "lr")
    assert event["object"]["spec"]["maxParallel"] == 2


async def test_one_object_by_field_selector(client: httpx.AsyncClient, unique: str) -> None:
    await create(client, unique, sweep_body("a"))
    await create(client, unique, sweep_body("b"))
    # What `kubectl get sweep a -w` sends.
    async with watch(client, sweeps(unique), fieldSelector="metadata.name=a") as stream:
        assert summary(await stream.next()) == ("ADDED", "a")
        await patch(client, sweeps(unique, "b"), {"spec": {"maxParallel": 1}})
        await patch(client, sweeps(unique, "a"), {"spec": {"maxParallel": 2}})
        # b's change came first and is not for this watch.
        assert summary(await stream.next()) == ("MODIFIED", "a")


async def test_label_selector_transitions_are_added_and_deleted(
    client: httpx.AsyncClient, unique: str
) -> None:
    async with watch(client, sweeps(unique), labelSelector="tier=gold") as stream:
        await create(client, unique, sweep_body("lr", labels={"tier": "gold"}))
        assert summary(await stream.next()) == ("ADDED", "lr")
        await patch(client, sweeps(unique, "lr"), {"metadata": {"labels": {"tier": "bronze"}}})
        # It no longer matches: for this watcher it is gone, as Kubernetes' watch cache reports it.
        assert summary(await stream.next()) == ("DELETED", "lr")
        await patch(client, sweeps(unique, "lr"), {"spec": {"maxParallel": 1}})
        await patch(client, sweeps(unique, "lr"), {"metadata": {"labels": {"tier": "gold"}}})
        event = await stream.next()
    assert summary(event) == ("ADDED", "lr") and event["object"]["spec"]["maxParallel"] == 1


async def test_bookmarks_when_asked_for(
    client: httpx.AsyncClient, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watching, "BOOKMARK_INTERVAL_S", 0.2)
    created = await create(client, unique, sweep_body("lr"))
    rv = created["metadata"]["resourceVersion"]
    async with watch(client, sweeps(unique), resourceVersion=rv, allowWatchBookmarks="true") as stream:
        event = await stream.next()
    assert event["type"] == "BOOKMARK"
    assert event["object"]["apiVersion"] == "nodus.dev/v1" and event["object"]["kind"] == "Sweep"
    assert list(event["object"]["metadata"]) == ["resourceVersion"]
    assert int(event["object"]["metadata"]["resourceVersion"]) >= int(rv)


async def test_timeout_seconds_ends_the_stream(client: httpx.AsyncClient, unique: str) -> None:
    await create(client, unique, sweep_body("lr"))
    loop = asyncio.get_running_loop()
    began = loop.time()
    async with watch(client, sweeps(unique), timeoutSeconds=1) as stream:
        events = await stream.rest(deadline_s=5)
    assert [summary(e) for e in events] == [("ADDED", "lr")]
    assert loop.time() - began >= 1


async def test_expired_resource_version_is_an_error_event(
    client: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    before = (await client.get(sweeps(unique))).json()["metadata"]["resourceVersion"]
    await create(client, unique, sweep_body("lr"))
    assert (await client.delete(sweeps(unique, "lr"))).status_code == 200
    # Compaction is bucket-wide: it drops every old delete marker and moves the horizon past `before`.
    assert await stores_for(nc)["sweeps"].compact(older_than_s=0) >= 1
    async with watch(client, sweeps(unique), resourceVersion=before) as stream:
        events = await stream.rest()
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert "list again" in status["message"]


async def test_watch_across_all_namespaces(client: httpx.AsyncClient, unique: str) -> None:
    other = f"{unique}-b"
    async with watch(client, f"{API}/sweeps", labelSelector=f"t={unique}") as stream:
        await create(client, unique, sweep_body("lr", labels={"t": unique}))
        await create(client, other, sweep_body("lr", labels={"t": unique}))
        events = [await stream.next() for _ in range(2)]
    assert [(e["type"], e["object"]["metadata"]["namespace"]) for e in events] == [
        ("ADDED", unique),
        ("ADDED", other),
    ]


async def test_a_client_that_leaves_stops_the_store_watch(
    client: httpx.AsyncClient, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped: list[str] = []
    original = Watch.stop

    async def recording_stop(self: Watch[Any]) -> None:
        stopped.append(self.subject)
        await original(self)

    monkeypatch.setattr(Watch, "stop", recording_stop)
    await create(client, unique, sweep_body("lr"))
    async with watch(client, sweeps(unique)) as stream:
        assert summary(await stream.next()) == ("ADDED", "lr")
    # The client closed the connection mid-stream; the server notices and closes the NATS consumer.
    await eventually(lambda: any(unique in s for s in stopped), deadline_s=DEADLINE_S)


async def test_bad_watch_parameters_are_400_before_any_stream(client: httpx.AsyncClient, unique: str) -> None:
    for params in ({"resourceVersion": "abc"}, {"fieldSelector": "spec.x=1"}, {"timeoutSeconds": "-1"}):
        resp = await client.get(sweeps(unique), params={"watch": "1", **params})
        assert resp.status_code == 400, (params, resp.text)
        assert resp.json()["reason"] == "BadRequest"
