"""Authentication, tokens and projects: 401s, tokens stored hashed and shown once, revocation within the
cache TTL, project admins minting only for their projects, and projects deleted only when empty."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.auth import RequestInfo, request_info
from nodus_gateway.authorizing import ADMIN, ANONYMOUS, Principal, decide
from nodus_gateway.config import ConfigError
from nodus_gateway.principals import ID_LENGTH, TOKEN_PREFIX, Principals, TokenCache, cache_ttl_of, pepper_of
from nodus_gateway.resources import stores_for

ADMIN_TOKEN = "auth-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
TTL = 0.3


def client(app: FastAPI, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=headers
    )


def make_app(nc: NATS) -> FastAPI:
    principals = Principals(nc, pepper=b"auth-pepper", cache_ttl_s=TTL)
    return build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals)


@pytest_asyncio.fixture
async def gateway(nc: NATS) -> FastAPI:
    return make_app(nc)


@pytest_asyncio.fixture
async def admin(gateway: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with client(gateway, ADMIN_TOKEN) as c:
        yield c


async def project(admin: httpx.AsyncClient, name: str) -> None:
    resp = await admin.post(f"{V1}/projects", json={"metadata": {"name": name}})
    assert resp.status_code == 201, resp.text


async def mint(api: httpx.AsyncClient, principal: str, roles: dict[str, str]) -> dict[str, Any]:
    resp = await api.post(f"{V1}/tokens", json={"spec": {"principal": principal, "roles": roles}})
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def sweeps(namespace: str, *rest: str) -> str:
    return "/".join([f"{V1}/namespaces/{namespace}/sweeps", *rest])


# -- 401 -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "wrong", f"{TOKEN_PREFIX}not-a-minted-token"])
async def test_401_without_a_valid_token(gateway: FastAPI, token: str | None) -> None:
    async with client(gateway, token) as anon:
        resp = await anon.get(sweeps("default"))
    assert resp.status_code == 401, resp.text
    assert resp.json()["reason"] == "Unauthorized"
    assert resp.headers["www-authenticate"].startswith("Bearer")


async def test_health_stays_open(gateway: FastAPI) -> None:
    async with client(gateway, None) as anon:
        assert (await anon.get("/healthz")).status_code == 200


async def test_admin_token_is_cluster_admin(admin: httpx.AsyncClient, unique: str) -> None:
    # Any namespace, project or not: the local stack uses "default".
    assert (await admin.get(sweeps(unique))).status_code == 200


# -- tokens --------------------------------------------------------------------------------------------------


async def test_minted_token_works_and_secret_is_shown_once(
    admin: httpx.AsyncClient, gateway: FastAPI, unique: str
) -> None:
    await project(admin, unique)
    token = await mint(admin, "carol", {unique: "viewer"})
    secret = token["secret"]
    assert secret.startswith(TOKEN_PREFIX) and len(secret) > 40
    token_id = token["metadata"]["name"]
    assert len(token_id) == ID_LENGTH and token_id not in secret
    assert token["spec"] == {"principal": "carol", "roles": {unique: "viewer"}}
    async with client(gateway, secret) as carol:
        assert (await carol.get(sweeps(unique))).status_code == 200
    listed = await admin.get(f"{V1}/tokens")
    got = await admin.get(f"{V1}/tokens/{token_id}")
    for resp in (listed, got):
        assert resp.status_code == 200, resp.text
        assert secret not in resp.text and "secret" not in resp.text and "digest" not in resp.text
    assert token_id in [t["metadata"]["name"] for t in listed.json()["items"]]
    assert got.json()["spec"]["principal"] == "carol"


async def test_token_is_stored_hashed(admin: httpx.AsyncClient, nc: NATS, unique: str) -> None:
    await project(admin, unique)
    token = await mint(admin, "dave", {unique: "viewer"})
    kv = await nc.jetstream().key_value("tokens")
    entry = await kv.get(f"_.{token['metadata']['name']}")
    assert entry.value is not None
    assert token["secret"].encode() not in entry.value
    assert token["secret"].removeprefix(TOKEN_PREFIX).encode() not in entry.value


async def test_revoked_token_stops_working_within_the_ttl(
    nc: NATS, admin: httpx.AsyncClient, unique: str
) -> None:
    await project(admin, unique)
    token = await mint(admin, "erin", {unique: "viewer"})
    # Two gateway replicas: revoking through one drops its cache at once; the other's expires.
    other = make_app(nc)
    async with client(other, token["secret"]) as erin_elsewhere:
        assert (await erin_elsewhere.get(sweeps(unique))).status_code == 200  # now cached there
        resp = await admin.delete(f"{V1}/tokens/{token['metadata']['name']}")
        assert resp.status_code == 200, resp.text
        assert "secret" not in resp.text
        await asyncio.sleep(TTL + 0.1)
        assert (await erin_elsewhere.get(sweeps(unique))).status_code == 401
    assert (await admin.get(f"{V1}/tokens/{token['metadata']['name']}")).status_code == 404


async def test_revoked_token_stops_at_once_on_the_revoking_gateway(
    gateway: FastAPI, admin: httpx.AsyncClient, unique: str
) -> None:
    await project(admin, unique)
    token = await mint(admin, "frank", {unique: "viewer"})
    async with client(gateway, token["secret"]) as frank:
        assert (await frank.get(sweeps(unique))).status_code == 200
        await admin.delete(f"{V1}/tokens/{token['metadata']['name']}")
        assert (await frank.get(sweeps(unique))).status_code == 401


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"principal": "Not A Name", "roles": {}}, "spec.principal"),
        ({"principal": "admin", "roles": {}}, "spec.principal"),
        ({"principal": "gina", "roles": {"PROJECT": "viewer"}}, "spec.roles[PROJECT]"),
        ({"principal": "gina", "roles": {"team-x": "owner"}}, "spec.roles[team-x]"),
        (
            {"principal": "gina", "roles": {"no-such-project-here": "viewer"}},
            "spec.roles[no-such-project-here]",
        ),
    ],
)
async def test_invalid_token_specs_are_422(
    admin: httpx.AsyncClient, spec: dict[str, Any], field: str
) -> None:
    resp = await admin.post(f"{V1}/tokens", json=spec)  # the bare spec is accepted too
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["reason"] == "Invalid"
    assert field in [c["field"] for c in body["details"]["causes"]]


async def test_project_admin_mints_only_for_its_project(
    gateway: FastAPI, admin: httpx.AsyncClient, unique: str
) -> None:
    mine, theirs = f"m-{unique}", f"t-{unique}"
    await project(admin, mine)
    await project(admin, theirs)
    owner = await mint(admin, "olga", {mine: "admin"})
    outsider = await mint(admin, "tom", {theirs: "editor"})
    async with client(gateway, owner["secret"]) as olga:
        minted = await mint(olga, "pete", {mine: "editor"})
        assert minted["secret"].startswith(TOKEN_PREFIX)
        for roles in ({theirs: "viewer"}, {mine: "viewer", theirs: "viewer"}, {}):
            resp = await olga.post(f"{V1}/tokens", json={"spec": {"principal": "pete", "roles": roles}})
            assert resp.status_code == 403, resp.text
            assert resp.json()["message"].startswith('tokens.nodus.dev is forbidden: User "olga"')
        # A project that does not exist is forbidden too, not Invalid: nothing tells it from another's.
        resp = await olga.post(
            f"{V1}/tokens", json={"spec": {"principal": "pete", "roles": {"zz": "viewer"}}}
        )
        assert resp.status_code == 403, resp.text
        listed = [t["metadata"]["name"] for t in (await olga.get(f"{V1}/tokens")).json()["items"]]
        assert minted["metadata"]["name"] in listed and owner["metadata"]["name"] in listed
        assert outsider["metadata"]["name"] not in listed
        assert (await olga.get(f"{V1}/tokens/{outsider['metadata']['name']}")).status_code == 404
        assert (await olga.delete(f"{V1}/tokens/{outsider['metadata']['name']}")).status_code == 404
        assert (await olga.delete(f"{V1}/tokens/{minted['metadata']['name']}")).status_code == 200
        # A project admin manages its project's objects too (editor and more), and not projects.
        assert (await olga.get(sweeps(mine))).status_code == 200
        assert (await olga.get(f"{V1}/projects")).status_code == 403
    async with client(gateway, outsider["secret"]) as tom:
        resp = await tom.post(
            f"{V1}/tokens", json={"spec": {"principal": "tim", "roles": {theirs: "viewer"}}}
        )
        assert resp.status_code == 403, resp.text
        assert (await tom.get(f"{V1}/tokens")).status_code == 403


# -- projects ------------------------------------------------------------------------------------------------


async def test_projects_crud(admin: httpx.AsyncClient, unique: str) -> None:
    await project(admin, unique)
    got = await admin.get(f"{V1}/projects/{unique}")
    assert got.status_code == 200, got.text
    body = got.json()
    assert (body["kind"], body["metadata"]["name"], body["status"]["phase"]) == ("Project", unique, "Active")
    assert body["metadata"]["uid"] and body["metadata"]["resourceVersion"]
    assert unique in [p["metadata"]["name"] for p in (await admin.get(f"{V1}/projects")).json()["items"]]
    again = await admin.post(f"{V1}/projects", json={"metadata": {"name": unique}})
    assert (again.status_code, again.json()["reason"]) == (409, "AlreadyExists")
    bad = await admin.post(f"{V1}/projects", json={"metadata": {"name": "Bad_Name"}})
    assert (bad.status_code, bad.json()["reason"]) == (422, "Invalid")
    assert (await admin.delete(f"{V1}/projects/{unique}")).status_code == 200
    assert (await admin.get(f"{V1}/projects/{unique}")).status_code == 404


async def test_project_with_objects_is_not_deleted(admin: httpx.AsyncClient, unique: str) -> None:
    await project(admin, unique)
    body = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"image": "ghcr.io/acme/train:1.0", "command": ["true"], "resources": {"gpu": "H100:1"}},
    }
    assert (await admin.post(f"{V1}/namespaces/{unique}/jobs", json=body)).status_code == 201
    resp = await admin.delete(f"{V1}/projects/{unique}")
    assert resp.status_code == 409, resp.text
    assert "1 jobs" in resp.json()["message"] and resp.json()["fix"]
    await admin.delete(f"{V1}/namespaces/{unique}/jobs/j")
    assert (await admin.delete(f"{V1}/projects/{unique}")).status_code == 200


async def test_deleting_a_project_drops_its_roles(
    gateway: FastAPI, admin: httpx.AsyncClient, unique: str
) -> None:
    await project(admin, unique)
    token = await mint(admin, "hank", {unique: "editor"})
    assert (await admin.delete(f"{V1}/projects/{unique}")).status_code == 200
    got = await admin.get(f"{V1}/tokens/{token['metadata']['name']}")
    assert got.json()["spec"].get("roles", {}) == {}
    # Recreated under the same name, the project starts with no one in it.
    await project(admin, unique)
    async with client(gateway, token["secret"]) as hank:
        assert (await hank.get(sweeps(unique))).status_code == 403


# -- units: request info, decisions, settings, cache ---------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "query", "info"),
    [
        ("GET", f"{V1}/namespaces/a/sweeps", b"", RequestInfo("list", "sweeps", "a", None)),
        ("GET", f"{V1}/namespaces/a/sweeps", b"watch=true", RequestInfo("watch", "sweeps", "a", None)),
        ("GET", f"{V1}/namespaces/a/sweeps", b"watch=false", RequestInfo("list", "sweeps", "a", None)),
        ("GET", f"{V1}/watch/namespaces/a/sweeps", b"", RequestInfo("watch", "sweeps", "a", None)),
        ("GET", f"{V1}/namespaces/a/sweeps/x/status", b"", RequestInfo("get", "sweeps", "a", "x")),
        ("POST", f"{V1}/namespaces/a/jobs", b"", RequestInfo("create", "jobs", "a", None)),
        ("PUT", f"{V1}/namespaces/a/jobs/x", b"", RequestInfo("update", "jobs", "a", "x")),
        ("PATCH", f"{V1}/namespaces/a/jobs/x", b"", RequestInfo("patch", "jobs", "a", "x")),
        ("DELETE", f"{V1}/namespaces/a/jobs/x", b"", RequestInfo("delete", "jobs", "a", "x")),
        ("DELETE", f"{V1}/namespaces/a/jobs", b"", RequestInfo("deletecollection", "jobs", "a", None)),
        ("GET", f"{V1}/sweeps", b"", RequestInfo("list", "sweeps", None, None)),
        ("GET", f"{V1}/nodes/n1", b"", RequestInfo("get", "nodes", None, "n1")),
        ("GET", f"{V1}/namespaces/a", b"", RequestInfo("get", "namespaces", None, "a")),
        ("GET", V1, b"", None),
        ("GET", "/apis", b"", None),
        ("GET", "/openapi/v2", b"", None),
        ("OPTIONS", f"{V1}/namespaces/a/jobs", b"", None),
    ],
)
def test_request_info(method: str, path: str, query: bytes, info: RequestInfo | None) -> None:
    assert request_info(method, path, query) == info


def test_decisions() -> None:
    alice = Principal(name="alice", roles={"a": "editor", "c": "admin"})
    assert decide(ADMIN, "delete", "projects", None, "a") is None
    assert decide(alice, "get", "nodes", None, "n1") is None  # the read-only catalog
    assert decide(alice, "list", "offerings", None) is None
    assert decide(alice, "create", "nodes", None) is not None
    assert decide(alice, "delete", "nodes", None, "n1") is not None  # the cluster admin's alone
    assert decide(ADMIN, "delete", "nodes", None, "n1") is None
    assert decide(alice, "list", "sweeps", None) is None  # all namespaces, filtered by the route
    assert decide(alice, "list", "tokens", None) is None  # admin of project c
    assert decide(Principal(name="v", roles={"a": "viewer"}), "list", "tokens", None) is not None
    assert decide(alice, "deletecollection", "sweeps", "a") is None
    err = decide(alice, "get", "sweeps", "b", "x")
    assert err is not None and err.status.code == 404
    err = decide(ANONYMOUS, "list", "sweeps", "b")
    assert err is not None and err.status.code == 403
    with pytest.raises(ValueError, match="unknown verb"):
        decide(alice, "escalate", "sweeps", "a")


def test_settings() -> None:
    assert pepper_of({}, "adm") == b"adm"
    assert pepper_of({"NODUS_TOKEN_PEPPER": "pep"}, "adm") == b"pep"
    assert cache_ttl_of({}) == 5.0
    assert cache_ttl_of({"NODUS_TOKEN_CACHE_TTL_S": "0.5"}) == 0.5
    for bad in ("soon", "-1", "3600"):
        with pytest.raises(ConfigError, match="NODUS_TOKEN_CACHE_TTL_S"):
            cache_ttl_of({"NODUS_TOKEN_CACHE_TTL_S": bad})


def test_cache_expires_and_forgets() -> None:
    now = [100.0]
    cache = TokenCache(2.0, clock=lambda: now[0])
    carol = Principal(name="carol")
    cache.put("d1", carol)
    cache.put("d2", None)
    hit = cache.get("d1")
    assert hit is not None and hit.principal == carol
    miss = cache.get("d2")
    assert miss is not None and miss.principal is None  # unknown tokens are cached as unknown
    cache.forget("d1")
    assert cache.get("d1") is None
    now[0] += 2.0
    assert cache.get("d2") is None
    off = TokenCache(0.0)
    off.put("d3", carol)
    assert off.get("d3") is None
