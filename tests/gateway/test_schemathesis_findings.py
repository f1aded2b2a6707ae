"""Regressions of what the schemathesis work found: the server errors it led to, and the places where the
OpenAPI documents did not say what the server does (test_schemathesis.py is the run itself)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for
from nodus_gateway.versions import MAX_RESOURCE_VERSION, parse_resource_version

API = "/apis/nodus.dev/v1"
ADMIN_TOKEN = "test-admin-token-0123456789"  # conftest.py's
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}

# resourceVersions no server issued: Python's int() takes the last four, and the store used to.
NEVER_ISSUED = ["abc", "1.5", "-1", " 1", "1_0", "\u0661", str(MAX_RESOURCE_VERSION + 1), str(2**64 + 1)]


def sweep_body(name: str, rv: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name} if rv is None else {"name": name, "resourceVersion": rv}
    job = {
        "image": "ghcr.io/acme/train:1.0",
        "command": ["python", "train.py"],
        "resources": {"gpu": "H100:1"},
    }
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": meta,
        "spec": {"matrix": {"params": {"LR": ["0.1"]}}, "template": {"spec": job}},
    }


def assert_status(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["code"], body["reason"]) == ("Status", code, reason)
    return body


def test_parse_resource_version_takes_only_what_the_server_issues() -> None:
    assert parse_resource_version("1") == 1
    assert parse_resource_version("0") == 0
    assert parse_resource_version(str(MAX_RESOURCE_VERSION)) == MAX_RESOURCE_VERSION
    for value in NEVER_ISSUED:
        assert parse_resource_version(value) is None, value


# ---------------------------------------------------------------------------------------------------------
# A resourceVersion the server never issued was a 500 (update, patch, apply) or a 503 (watch)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rv", NEVER_ISSUED)
async def test_update_with_a_resource_version_never_issued_is_422_not_500(
    api: httpx.AsyncClient, unique: str, rv: str
) -> None:
    path = f"{API}/namespaces/{unique}/sweeps"
    created = await api.post(path, json=sweep_body("s"))
    assert created.status_code == 201, created.text
    attempts = [
        api.put(f"{path}/s", json=sweep_body("s", rv)),
        api.patch(f"{path}/s", content=json.dumps({"metadata": {"resourceVersion": rv}}), headers=MERGE),
        api.patch(
            f"{path}/s",
            content=json.dumps([{"op": "replace", "path": "/metadata/resourceVersion", "value": rv}]),
            headers=JSON_PATCH,
        ),
        api.patch(f"{path}/s?fieldManager=me", content=json.dumps(sweep_body("s", rv)), headers=APPLY),
    ]
    for attempt in attempts:
        body = assert_status(await attempt, 422, "Invalid")
        assert [c["field"] for c in body["details"]["causes"]] == ["metadata.resourceVersion"]
    # Nothing was written; the version the server did issue still works.
    got = (await api.get(f"{path}/s")).json()
    assert got["metadata"]["resourceVersion"] == created.json()["metadata"]["resourceVersion"]
    resp = await api.put(f"{path}/s", json=sweep_body("s", got["metadata"]["resourceVersion"]))
    assert resp.status_code == 200, resp.text


async def test_secret_update_with_a_resource_version_never_issued_is_422_not_500(
    api: httpx.AsyncClient, unique: str
) -> None:
    path = f"{API}/namespaces/{unique}/secrets"
    secret = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "stringData": {"a": "b"},
    }
    assert (await api.post(path, json=secret)).status_code == 201
    for rv in ("abc", "1.5"):
        stale = {**secret, "metadata": {"name": "s", "resourceVersion": rv}}
        assert_status(await api.put(f"{path}/s", json=stale), 422, "Invalid")
        patch = json.dumps({"metadata": {"resourceVersion": rv}})
        assert_status(await api.patch(f"{path}/s", content=patch, headers=MERGE), 422, "Invalid")


@pytest.mark.parametrize("rv", [str(2**64 + 1), str(2**64 - 1), str(MAX_RESOURCE_VERSION + 1), "\u0661"])
async def test_watch_from_a_resource_version_never_issued_is_400_not_503(
    api: httpx.AsyncClient, unique: str, rv: str
) -> None:
    # A 400 answers before any stream starts, so the in-process client can read it whole.
    for path in (f"{API}/namespaces/{unique}/sweeps", f"{API}/watch/sweeps"):
        resp = await api.get(path, params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": 1})
        body = assert_status(resp, 400, "BadRequest")
        assert "resourceVersion" in body["message"]


# ---------------------------------------------------------------------------------------------------------
# The documents, as the server answers
# ---------------------------------------------------------------------------------------------------------


async def group_document(app: FastAPI) -> dict[str, Any]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as client:
        index = (await client.get("/openapi/v3")).json()
        url = index["paths"]["apis/nodus.dev/v1"]["serverRelativeURL"]
        doc: dict[str, Any] = (await client.get(url)).json()
        return doc


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def success(op: dict[str, Any]) -> dict[str, Any]:
    return {code: r for code, r in op["responses"].items() if code.startswith("2")}


async def test_projects_and_tokens_are_documented_with_their_types(nc: NATS) -> None:
    # They were documented with empty schemas and no request body: a client could not tell what to send
    # or what comes back.
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=Principals(nc, pepper=b"pepper"))
    doc = await group_document(app)
    paths = doc["paths"]
    for plural, kind in (("projects", "Project"), ("tokens", "Token")):
        collection, item = paths[f"{API}/{plural}"], paths[f"{API}/{plural}/{{name}}"]
        assert collection["get"]["responses"]["200"]["content"]["application/json"]["schema"] == ref(
            f"{kind}List"
        )
        assert collection["post"]["responses"]["201"]["content"]["application/json"]["schema"] == ref(kind)
        body = collection["post"]["requestBody"]
        assert body["required"] and set(body["content"]) == {"application/json", "application/yaml"}
        assert body["content"]["application/json"]["schema"] == ref(kind)
        for method in ("get", "delete"):
            assert item[method]["responses"]["200"]["content"]["application/json"]["schema"] == ref(kind)
        gvk = doc["components"]["schemas"][kind]["x-kubernetes-group-version-kind"]
        assert gvk == [{"group": "nodus.dev", "kind": kind, "version": "v1"}]
    assert "secret" in doc["components"]["schemas"]["Token"]["properties"]


async def test_writes_that_are_always_405_are_documented_as_405(app: FastAPI, api: httpx.AsyncClient) -> None:
    # They were documented with 200/201 and the object: read-only resources and status subresources.
    doc = await group_document(app)
    refused = {
        ("post", f"{API}/nodes"),
        ("put", f"{API}/nodes/{{name}}"),
        ("delete", f"{API}/offerings/{{name}}"),
        ("post", f"{API}/namespaces/{{namespace}}/attempts"),
        ("patch", f"{API}/namespaces/{{namespace}}/attempts/{{name}}"),
        ("put", f"{API}/namespaces/{{namespace}}/sweeps/{{name}}/status"),
        ("patch", f"{API}/namespaces/{{namespace}}/jobs/{{name}}/status"),
    }
    for method, path in refused:
        op = doc["paths"][path][method]
        assert success(op) == {} and "requestBody" not in op, (method, path)
        assert op["responses"]["405"]["content"]["application/json"]["schema"] == ref("Status")
        served = path.replace("{namespace}", "p").replace("{name}", "n")
        assert_status(await api.request(method.upper(), served, json={}), 405, "MethodNotAllowed")
    # What is served keeps its answers: a Node's delete (the cluster admin's) answers the deleted Node.
    assert "200" in doc["paths"][f"{API}/namespaces/{{namespace}}/sweeps/{{name}}"]["put"]["responses"]
    node_delete = doc["paths"][f"{API}/nodes/{{name}}"]["delete"]["responses"]["200"]
    assert node_delete["content"]["application/json"]["schema"] == {"anyOf": [ref("Node"), ref("Status")]}
    assert "200" in doc["paths"][f"{API}/namespaces/{{namespace}}/sweeps/{{name}}/status"]["get"]["responses"]


async def test_secret_patch_types_are_the_ones_served(
    app: FastAPI, api: httpx.AsyncClient, unique: str
) -> None:
    # Secrets take no apply patch (415); the document offered it.
    doc = await group_document(app)
    secret = doc["paths"][f"{API}/namespaces/{{namespace}}/secrets/{{name}}"]["patch"]["requestBody"]
    assert set(secret["content"]) == {"application/merge-patch+json", "application/json-patch+json"}
    sweep = doc["paths"][f"{API}/namespaces/{{namespace}}/sweeps/{{name}}"]["patch"]["requestBody"]
    assert "application/apply-patch+yaml" in sweep["content"]
    created = await api.post(
        f"{API}/namespaces/{unique}/secrets",
        json={
            "apiVersion": "nodus.dev/v1",
            "kind": "Secret",
            "metadata": {"name": "s"},
            "stringData": {"a": "b"},
        },
    )
    assert created.status_code == 201, created.text
    resp = await api.patch(
        f"{API}/namespaces/{unique}/secrets/s?fieldManager=me", content=b"{}", headers=APPLY
    )
    assert_status(resp, 415, "UnsupportedMediaType")
