"""Inputs that were accepted and ignored (#17: nothing accepted is ignored). dryRun=All on the admin kinds:
a dry-run token create mints nothing that works and stores nothing; a dry-run project create stores
nothing and still says AlreadyExists. A DELETE body that is no DeleteOptions is a 400."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for

V1 = "/apis/nodus.dev/v1"
ADMIN_TOKEN = "dry-admin-token-0123456789"


@pytest_asyncio.fixture
async def api(nc: NATS) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway with its token and project routes (Principals), as the admin."""
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=Principals(nc, pepper=b"dry-pepper"))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as client:
        yield client


async def test_a_dry_run_token_is_shown_and_never_minted(api: httpx.AsyncClient, unique: str) -> None:
    project = f"p-{unique}"
    assert (await api.post(f"{V1}/projects", json={"metadata": {"name": project}})).status_code == 201
    before = {t["metadata"]["name"] for t in (await api.get(f"{V1}/tokens")).json()["items"]}
    spec = {"spec": {"principal": f"dry-{unique}", "roles": {project: "viewer"}, "expirationSeconds": 3600}}
    resp = await api.post(f"{V1}/tokens", params={"dryRun": "All"}, json=spec)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["status"]["expirationTimestamp"]  # what a real create would grant
    assert "secret" not in body and "secret" not in body.get("status", {})
    after = {t["metadata"]["name"] for t in (await api.get(f"{V1}/tokens")).json()["items"]}
    assert after == before
    assert (await api.get(f"{V1}/tokens/{body['metadata']['name']}")).status_code == 404
    bad = await api.post(f"{V1}/tokens", params={"dryRun": "Sometimes"}, json=spec)
    assert bad.status_code == 400  # an unknown dryRun is refused, never a real write


async def test_a_dry_run_project_stores_nothing(api: httpx.AsyncClient, unique: str) -> None:
    name = f"dry-{unique}"
    resp = await api.post(f"{V1}/projects", params={"dryRun": "All"}, json={"metadata": {"name": name}})
    assert resp.status_code == 201, resp.text
    assert resp.json()["metadata"]["name"] == name
    assert (await api.get(f"{V1}/projects/{name}")).status_code == 404
    assert (await api.post(f"{V1}/projects", json={"metadata": {"name": name}})).status_code == 201
    again = await api.post(f"{V1}/projects", params={"dryRun": "All"}, json={"metadata": {"name": name}})
    assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists"


async def test_a_delete_body_that_is_no_object_is_refused(api: httpx.AsyncClient, unique: str) -> None:
    """Not silently ignored (it answered 200 and deleted before): a 400 saying what DeleteOptions is."""
    body = {
        "metadata": {"name": "del"},
        "spec": {"image": "x", "command": ["true"], "resources": {"gpu": "H100:1"}},
    }
    base = f"{V1}/namespaces/{unique}/jobs"
    assert (await api.post(base, json=body)).status_code == 201
    for sent in (b"1", b"[1]", b'"Orphan"'):
        resp = await api.request(
            "DELETE", f"{base}/del", content=sent, headers={"Content-Type": "application/json"}
        )
        assert resp.status_code == 400 and resp.json()["reason"] == "BadRequest", resp.text
    assert (await api.get(f"{base}/del")).status_code == 200  # nothing deleted
    ok = await api.request("DELETE", f"{base}/del", json={"propagationPolicy": "Background"})
    assert ok.status_code == 200, ok.text
