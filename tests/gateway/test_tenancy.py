"""Tenancy: a token with roles in one project can neither read, list, watch, patch nor delete another's.

Two tenants per test (projects ``a-<unique>`` and ``b-<unique>``): alice is an editor in A, bob a viewer
in B, and the cluster admin creates an object in B first. Every verb is tried across the boundary, for
every kind a tenant writes (the matrix at the end); the tokens of runs' ServiceAccounts are held to the
same boundary in test_service_accounts.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.authorizing import ADMIN, Principal, visible_namespaces
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for
from nodus_kit.storing import ObjectStore
from nodus_schema import ObjectMeta
from nodus_schema.nodes import Node, NodeSpec

ADMIN_TOKEN = "tenancy-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"


def sweeps(namespace: str, *rest: str) -> str:
    return "/".join([f"{V1}/namespaces/{namespace}/sweeps", *rest])


def sweep_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name},
        "spec": {
            "matrix": {"params": {"LR": ["0.1", "0.01"]}},
            "template": {
                "kind": "Job",
                "spec": {
                    "image": "ghcr.io/acme/train:1.0",
                    "command": ["python", "train.py"],
                    "resources": {"gpu": "H100:1"},
                },
            },
        },
    }


def client(app: FastAPI, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {token}"},
    )


@dataclass
class Tenants:
    a: str
    b: str
    admin: httpx.AsyncClient
    alice: httpx.AsyncClient
    bob: httpx.AsyncClient
    bobs_sweep: str
    """A Sweep in project B, created by the cluster admin."""
    app: FastAPI
    """The gateway, for a client of another token."""


async def mint(admin: httpx.AsyncClient, principal: str, roles: dict[str, str]) -> str:
    resp = await admin.post(f"{V1}/tokens", json={"spec": {"principal": principal, "roles": roles}})
    assert resp.status_code == 201, resp.text
    secret: str = resp.json()["secret"]
    return secret


@pytest_asyncio.fixture
async def tenants(nc: NATS, unique: str) -> AsyncIterator[Tenants]:
    principals = Principals(nc, pepper=b"tenancy-pepper", cache_ttl_s=0.2)
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals)
    a, b = f"a-{unique}", f"b-{unique}"
    async with client(app, ADMIN_TOKEN) as admin:
        for project in (a, b):
            resp = await admin.post(f"{V1}/projects", json={"metadata": {"name": project}})
            assert resp.status_code == 201, resp.text
        alice_token = await mint(admin, "alice", {a: "editor"})
        bob_token = await mint(admin, "bob", {b: "viewer"})
        resp = await admin.post(sweeps(b), json=sweep_body("bobs"))
        assert resp.status_code == 201, resp.text
        async with client(app, alice_token) as alice, client(app, bob_token) as bob:
            yield Tenants(a, b, admin, alice, bob, "bobs", app)


def assert_reason(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", reason, code)
    assert body["fix"]
    return body


# -- alice (editor in A) against B ---------------------------------------------------------------------------


async def test_editor_in_own_project_creates_and_reads(tenants: Tenants) -> None:
    resp = await tenants.alice.post(sweeps(tenants.a), json=sweep_body("alices"))
    assert resp.status_code == 201, resp.text
    assert (await tenants.alice.get(sweeps(tenants.a, "alices"))).status_code == 200
    listed = await tenants.alice.get(sweeps(tenants.a))
    assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["alices"]


async def test_cannot_read_other_project_404_like_a_missing_object(tenants: Tenants) -> None:
    resp = await tenants.alice.get(sweeps(tenants.b, tenants.bobs_sweep))
    body = assert_reason(resp, 404, "NotFound")
    # Exactly what a name that does not exist gets: nothing says project B exists.
    assert body["message"] == f'sweeps.nodus.dev "{tenants.bobs_sweep}" not found'
    missing = await tenants.alice.get(sweeps(tenants.b, "no-such-sweep"))
    assert_reason(missing, 404, "NotFound")
    status = await tenants.alice.get(sweeps(tenants.b, tenants.bobs_sweep, "status"))
    assert_reason(status, 404, "NotFound")


async def test_cannot_list_other_project_403(tenants: Tenants) -> None:
    resp = await tenants.alice.get(sweeps(tenants.b))
    body = assert_reason(resp, 403, "Forbidden")
    assert body["message"] == (
        f'sweeps.nodus.dev is forbidden: User "alice" cannot list resource "sweeps" in API group '
        f'"nodus.dev" in the namespace "{tenants.b}"'
    )
    assert tenants.a in body["fix"]  # says which projects alice does have


async def test_cannot_watch_other_project_403(tenants: Tenants) -> None:
    resp = await tenants.alice.get(sweeps(tenants.b), params={"watch": "true"})
    body = assert_reason(resp, 403, "Forbidden")
    assert 'cannot watch resource "sweeps"' in body["message"]
    old_style = await tenants.alice.get(f"{V1}/watch/namespaces/{tenants.b}/sweeps")
    assert_reason(old_style, 403, "Forbidden")


async def test_cannot_patch_other_project_404(tenants: Tenants) -> None:
    resp = await tenants.alice.patch(
        sweeps(tenants.b, tenants.bobs_sweep),
        json={"metadata": {"labels": {"owner": "alice"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert_reason(resp, 404, "NotFound")


async def test_cannot_update_other_project_404(tenants: Tenants) -> None:
    current = (await tenants.admin.get(sweeps(tenants.b, tenants.bobs_sweep))).json()
    current["metadata"]["labels"] = {"owner": "alice"}
    resp = await tenants.alice.put(sweeps(tenants.b, tenants.bobs_sweep), json=current)
    assert_reason(resp, 404, "NotFound")


async def test_cannot_delete_other_project_404(tenants: Tenants) -> None:
    resp = await tenants.alice.delete(sweeps(tenants.b, tenants.bobs_sweep))
    assert_reason(resp, 404, "NotFound")
    # Still there.
    assert (await tenants.admin.get(sweeps(tenants.b, tenants.bobs_sweep))).status_code == 200


async def test_cannot_create_or_deletecollection_in_other_project_403(tenants: Tenants) -> None:
    resp = await tenants.alice.post(sweeps(tenants.b), json=sweep_body("intruder"))
    assert_reason(resp, 403, "Forbidden")
    resp = await tenants.alice.delete(sweeps(tenants.b))
    assert_reason(resp, 403, "Forbidden")
    assert (await tenants.admin.get(sweeps(tenants.b, "intruder"))).status_code == 404


async def test_jobs_are_guarded_too(tenants: Tenants) -> None:
    resp = await tenants.alice.get(f"{V1}/namespaces/{tenants.b}/jobs")
    assert_reason(resp, 403, "Forbidden")
    resp = await tenants.alice.get(f"{V1}/namespaces/{tenants.b}/jobs/bobs-0")
    assert_reason(resp, 404, "NotFound")


# -- bob (viewer in B) ---------------------------------------------------------------------------------------


async def test_viewer_reads_and_lists_own_project(tenants: Tenants) -> None:
    got = await tenants.bob.get(sweeps(tenants.b, tenants.bobs_sweep))
    assert got.status_code == 200, got.text
    listed = await tenants.bob.get(sweeps(tenants.b))
    assert listed.status_code == 200, listed.text
    assert [i["metadata"]["name"] for i in listed.json()["items"]] == [tenants.bobs_sweep]


async def test_viewer_cannot_create_or_delete_403(tenants: Tenants) -> None:
    resp = await tenants.bob.post(sweeps(tenants.b), json=sweep_body("by-bob"))
    body = assert_reason(resp, 403, "Forbidden")
    assert body["message"] == (
        f'sweeps.nodus.dev is forbidden: User "bob" cannot create resource "sweeps" in API group '
        f'"nodus.dev" in the namespace "{tenants.b}"'
    )
    assert "viewer" in body["fix"] and "editor" in body["fix"]
    resp = await tenants.bob.delete(sweeps(tenants.b, tenants.bobs_sweep))
    body = assert_reason(resp, 403, "Forbidden")
    assert body["message"].startswith(f'sweeps.nodus.dev "{tenants.bobs_sweep}" is forbidden: User "bob"')
    assert (await tenants.admin.get(sweeps(tenants.b, tenants.bobs_sweep))).status_code == 200


async def test_viewer_cannot_patch_403(tenants: Tenants) -> None:
    resp = await tenants.bob.patch(
        sweeps(tenants.b, tenants.bobs_sweep),
        json={"metadata": {"labels": {"x": "y"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert_reason(resp, 403, "Forbidden")


# -- across all namespaces -----------------------------------------------------------------------------------


def test_visible_namespaces() -> None:
    assert visible_namespaces(ADMIN) is None
    alice = Principal(name="alice", roles={"team-a": "editor", "team-c": "viewer"})
    assert visible_namespaces(alice) == frozenset({"team-a", "team-c"})
    assert visible_namespaces(Principal(name="nobody")) == frozenset()


async def test_cluster_scoped_needs_cluster_admin(tenants: Tenants) -> None:
    assert_reason(await tenants.alice.get(f"{V1}/projects"), 403, "Forbidden")
    resp = await tenants.alice.post(f"{V1}/projects", json={"metadata": {"name": "mine"}})
    body = assert_reason(resp, 403, "Forbidden")
    assert "at the cluster scope" in body["message"]
    assert_reason(await tenants.alice.delete(f"{V1}/projects/{tenants.b}"), 403, "Forbidden")


async def test_only_the_cluster_admin_deletes_a_node(tenants: Tenants, nc: NATS, unique: str) -> None:
    node = Node(metadata=ObjectMeta(name=unique), spec=NodeSpec(offering="h100-x1", region_class="us"))
    await ObjectStore(nc, "nodes", Node).create(node)
    item = f"{V1}/nodes/{unique}"
    assert (await tenants.alice.get(item)).status_code == 200  # every tenant reads the catalog
    project_admin = await mint(tenants.admin, "carol", {tenants.a: "admin"})
    async with client(tenants.app, project_admin) as carol:
        for tenant, who in ((tenants.alice, "alice"), (tenants.bob, "bob"), (carol, "carol")):
            body = assert_reason(await tenant.delete(item), 403, "Forbidden")
            assert body["message"] == (
                f'nodes.nodus.dev "{unique}" is forbidden: User "{who}" cannot delete resource "nodes" '
                'in API group "nodus.dev" at the cluster scope'
            )
            assert "cluster admin" in body["fix"]
    assert (await tenants.admin.get(item)).status_code == 200  # still there
    assert (await tenants.admin.delete(item)).status_code == 200
    assert_reason(await tenants.admin.get(item), 404, "NotFound")


async def _all_namespaces_route(app_client: httpx.AsyncClient) -> bool:
    resp = await app_client.get(f"{V1}/sweeps")
    return resp.status_code not in (404, 405)


async def test_all_namespaces_list_shows_only_permitted_projects(tenants: Tenants) -> None:
    created = await tenants.alice.post(sweeps(tenants.a), json=sweep_body("alices"))
    assert created.status_code == 201, created.text
    assert await _all_namespaces_route(tenants.admin), "GET /apis/nodus.dev/v1/sweeps must be served"
    resp = await tenants.alice.get(f"{V1}/sweeps")
    assert resp.status_code == 200, resp.text
    namespaces = {i["metadata"]["namespace"] for i in resp.json()["items"]}
    assert namespaces == {tenants.a}
    # The admin sees both (and whatever other tests left in other projects).
    everyone = await tenants.admin.get(f"{V1}/sweeps")
    assert {tenants.a, tenants.b} <= {i["metadata"]["namespace"] for i in everyone.json()["items"]}


# -- the matrix: every kind a tenant writes, every verb across the boundary ----------------------------------

KINDS: dict[str, dict[str, Any]] = {
    "sweeps": {"spec": sweep_body("x")["spec"]},
    "connections": {"spec": {"type": "S3", "s3": {"endpoint": "https://s3.example.com", "bucket": "bkt"}}},
    "budgets": {"spec": {"monthlyUSD": "10"}},
    "volumes": {"spec": {"description": "data"}},
    "workspaces": {"spec": {}},
    "serviceaccounts": {"spec": {"role": "editor"}},
    "pipelines": {
        "spec": {
            "stages": [{"name": "train", "template": {"job": sweep_body("x")["spec"]["template"]["spec"]}}]
        }
    },
}
"""A body per kind (its name added), created in B by the cluster admin, then tried by alice (editor in A)
and bob (viewer in B)."""


@pytest.mark.parametrize("plural", KINDS)
async def test_no_kind_crosses_the_boundary(tenants: Tenants, plural: str) -> None:
    def body(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, **KINDS[plural]}

    in_b = f"{V1}/namespaces/{tenants.b}/{plural}"
    created = await tenants.admin.post(in_b, json=body("theirs"))
    assert created.status_code == 201, created.text
    item, merge = f"{in_b}/theirs", {"Content-Type": "application/merge-patch+json"}
    # alice, an editor in A only: a name in B looks missing, a collection of B is forbidden.
    assert_reason(await tenants.alice.get(item), 404, "NotFound")
    label = {"metadata": {"labels": {"a": "b"}}}
    assert_reason(await tenants.alice.patch(item, json=label, headers=merge), 404, "NotFound")
    assert_reason(await tenants.alice.delete(item), 404, "NotFound")
    assert_reason(await tenants.alice.get(in_b), 403, "Forbidden")
    assert_reason(await tenants.alice.post(in_b, json=body("intruder")), 403, "Forbidden")
    listed = await tenants.alice.get(f"{V1}/{plural}")
    assert listed.status_code == 200, listed.text
    assert tenants.b not in {i["metadata"]["namespace"] for i in listed.json()["items"]}
    # bob, a viewer in B: reads, never writes.
    assert (await tenants.bob.get(item)).status_code == 200
    assert (await tenants.bob.get(in_b)).status_code == 200
    assert_reason(await tenants.bob.post(in_b, json=body("by-bob")), 403, "Forbidden")
    assert_reason(await tenants.bob.patch(item, json=label, headers=merge), 403, "Forbidden")
    assert_reason(await tenants.bob.delete(item), 403, "Forbidden")
    assert (await tenants.admin.get(item)).status_code == 200
