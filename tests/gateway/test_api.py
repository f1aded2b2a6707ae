"""The nodus.dev/v1 API: create, get, list, delete of Sweeps and Jobs, and every error as a Status."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.resources import stores_for

DOCS = "https://docs.nodus.dev/errors/"


def sweeps(namespace: str, *rest: str) -> str:
    return "/".join([f"/apis/nodus.dev/v1/namespaces/{namespace}/sweeps", *rest])


def jobs(namespace: str, *rest: str) -> str:
    return "/".join([f"/apis/nodus.dev/v1/namespaces/{namespace}/jobs", *rest])


def job_spec() -> dict[str, Any]:
    return {
        "image": "ghcr.io/acme/train:1.0",
        "command": ["python", "train.py"],
        "resources": {"gpu": "H100:1"},
    }


def sweep_body(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A valid Sweep as a user writes it: two learning rates over one H100 Job."""
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "matrix": {"params": {"LR": ["0.1", "0.01"]}},
            "template": {"kind": "Job", "spec": job_spec()},
        },
    }


def assert_status(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    """The response is a metav1.Status failure of this code and reason, with every Nodus extension."""
    assert resp.status_code == code, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = resp.json()
    assert body["kind"] == "Status" and body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert (body["code"], body["reason"]) == (code, reason)
    assert body["message"]
    assert body["docs"] == DOCS + reason
    assert body["fix"]
    assert body["requestId"] == resp.headers["x-request-id"]
    return body


def causes(body: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["field"]: c for c in body["details"]["causes"]}


# ---------------------------------------------------------------------------------------------------------
# Create and read
# ---------------------------------------------------------------------------------------------------------


async def test_create_sweep_returns_201_with_server_fields_and_defaults(
    api: httpx.AsyncClient, unique: str
) -> None:
    resp = await api.post(sweeps(unique), json=sweep_body("lr"))
    assert resp.status_code == 201, resp.text
    created = resp.json()
    meta = created["metadata"]
    assert meta["name"] == "lr" and meta["namespace"] == unique
    assert int(meta["resourceVersion"]) > 0 and meta["uid"] and meta["creationTimestamp"]
    assert meta["generation"] == 1
    # Stored defaulted: readers never have to know the defaults.
    assert created["spec"]["maxParallel"] == 4 and created["spec"]["repetitions"] == 1
    assert created["spec"]["template"]["spec"]["backoffLimit"] == 6
    assert "status" not in created or created["status"] == {}

    got = await api.get(sweeps(unique, "lr"))
    assert got.status_code == 200 and got.json() == created
    status = await api.get(sweeps(unique, "lr", "status"))
    assert status.status_code == 200 and status.json()["metadata"]["uid"] == meta["uid"]


async def test_create_job_and_yaml_body(api: httpx.AsyncClient, unique: str) -> None:
    manifest = (
        "apiVersion: nodus.dev/v1\nkind: Job\nmetadata:\n  name: train\nspec:\n"
        "  image: ghcr.io/acme/train:1.0\n  command: [python, train.py]\n  resources:\n    gpu: H100:1\n"
    )
    resp = await api.post(jobs(unique), content=manifest, headers={"Content-Type": "application/yaml"})
    assert resp.status_code == 201, resp.text
    assert resp.json()["kind"] == "Job" and resp.json()["spec"]["completions"] == 1
    assert (await api.get(jobs(unique, "train"))).json()["metadata"]["name"] == "train"


async def test_generate_name_gets_a_suffix(api: httpx.AsyncClient, unique: str) -> None:
    body = sweep_body("x")
    body["metadata"] = {"generateName": "lr-"}
    resp = await api.post(sweeps(unique), json=body)
    assert resp.status_code == 201, resp.text
    name = resp.json()["metadata"]["name"]
    assert name.startswith("lr-") and len(name) == len("lr-") + 5


async def test_status_in_the_body_is_ignored(api: httpx.AsyncClient, unique: str) -> None:
    body = sweep_body("lr")
    # Even a status that would not decode: users never write status, so it is not even read.
    body["status"] = {"phase": "Succeeded", "cells": [{"index": "zero"}], "cost": {"totalUSD": "0"}}
    body["metadata"].update(uid="mine", resourceVersion="999", generation=7)
    resp = await api.post(sweeps(unique), json=body)
    assert resp.status_code == 201, resp.text
    created = resp.json()
    assert created.get("status", {}) == {}
    assert created["metadata"]["uid"] != "mine" and created["metadata"]["generation"] == 1
    stored = (await api.get(sweeps(unique, "lr"))).json()
    assert stored.get("status", {}) == {}


async def test_duplicate_create_is_409_already_exists(api: httpx.AsyncClient, unique: str) -> None:
    assert (await api.post(sweeps(unique), json=sweep_body("lr"))).status_code == 201
    body = assert_status(await api.post(sweeps(unique), json=sweep_body("lr")), 409, "AlreadyExists")
    assert body["details"]["name"] == "lr"
    assert body["message"] == 'sweeps.nodus.dev "lr" already exists'


# ---------------------------------------------------------------------------------------------------------
# List
# ---------------------------------------------------------------------------------------------------------


async def test_list_with_label_selector(api: httpx.AsyncClient, unique: str) -> None:
    for name, team in (("a", "vision"), ("b", "nlp"), ("c", "vision")):
        assert (await api.post(sweeps(unique), json=sweep_body(name, {"team": team}))).status_code == 201
    resp = await api.get(sweeps(unique), params={"labelSelector": "team=vision"})
    assert resp.status_code == 200
    body = resp.json()
    assert body["kind"] == "SweepList" and body["apiVersion"] == "nodus.dev/v1"
    assert int(body["metadata"]["resourceVersion"]) > 0
    assert [s["metadata"]["name"] for s in body["items"]] == ["a", "c"]
    everything = (await api.get(sweeps(unique))).json()
    assert [s["metadata"]["name"] for s in everything["items"]] == ["a", "b", "c"]
    assert "continue" not in everything["metadata"]
    none = (await api.get(sweeps(unique), params={"labelSelector": "team=none"})).json()
    assert none["items"] == [] and none["kind"] == "SweepList"  # always there, as in Kubernetes


async def test_list_pages_with_limit_and_continue(api: httpx.AsyncClient, unique: str) -> None:
    for name in ("a", "b", "c", "d", "e"):
        assert (await api.post(sweeps(unique), json=sweep_body(name))).status_code == 201
    seen: list[str] = []
    params: dict[str, str | int] = {"limit": 2}
    first_rv = None
    while True:
        page = (await api.get(sweeps(unique), params=params)).json()
        first_rv = first_rv or page["metadata"]["resourceVersion"]
        seen += [s["metadata"]["name"] for s in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
        assert page["metadata"]["remainingItemCount"] == 5 - len(seen)
        params = {"limit": 2, "continue": token}
    assert seen == ["a", "b", "c", "d", "e"]


async def test_list_rejects_bad_parameters_as_400(api: httpx.AsyncClient, unique: str) -> None:
    body = assert_status(await api.get(sweeps(unique), params={"limit": "many"}), 400, "BadRequest")
    assert "limit" in causes(body)
    assert_status(await api.get(sweeps(unique), params={"continue": "garbage!"}), 400, "BadRequest")
    assert_status(await api.get(sweeps(unique), params={"labelSelector": "a=(b"}), 400, "BadRequest")
    assert_status(await api.get(sweeps("Not.A.Namespace")), 400, "BadRequest")


# ---------------------------------------------------------------------------------------------------------
# Delete and not found
# ---------------------------------------------------------------------------------------------------------


async def test_delete_returns_the_object_then_404(api: httpx.AsyncClient, unique: str) -> None:
    created = (await api.post(sweeps(unique), json=sweep_body("lr"))).json()
    resp = await api.delete(sweeps(unique, "lr"))
    assert resp.status_code == 200, resp.text
    deleted = resp.json()
    assert deleted["kind"] == "Sweep" and deleted["metadata"]["uid"] == created["metadata"]["uid"]
    assert deleted["metadata"]["deletionTimestamp"]
    assert_status(await api.get(sweeps(unique, "lr")), 404, "NotFound")
    assert_status(await api.delete(sweeps(unique, "lr")), 404, "NotFound")
    # The name is free again.
    assert (await api.post(sweeps(unique), json=sweep_body("lr"))).status_code == 201


async def test_missing_sweep_is_a_404_status(api: httpx.AsyncClient, unique: str) -> None:
    body = assert_status(await api.get(sweeps(unique, "nope")), 404, "NotFound")
    assert body["message"] == 'sweeps.nodus.dev "nope" not found'
    assert body["details"] == {"name": "nope", "group": "nodus.dev", "kind": "sweeps"}
    assert f"-n {unique}" in body["fix"]
    # A name that could never exist is simply not found (it never reaches the store as a subject).
    assert_status(await api.get(sweeps(unique, "a.b")), 404, "NotFound")


async def test_unknown_route_and_wrong_method_are_statuses(api: httpx.AsyncClient, unique: str) -> None:
    body = assert_status(await api.get("/apis/nodus.dev/v1/namespaces/x/widgets"), 404, "NotFound")
    assert body["message"] == "the server could not find the requested resource"
    assert_status(await api.get("/nothing/here"), 404, "NotFound")
    # A verb the path does not serve (PUT on a collection) is a 405 Status naming what it allows.
    resp = await api.put(sweeps(unique), json=sweep_body("lr"))
    body = assert_status(resp, 405, "MethodNotAllowed")
    assert "allows" in body["fix"]


# ---------------------------------------------------------------------------------------------------------
# Authentication
# ---------------------------------------------------------------------------------------------------------


async def test_requests_without_or_with_a_wrong_token_are_401(app: FastAPI, unique: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as anon:
        body = assert_status(await anon.get(sweeps(unique)), 401, "Unauthorized")
        assert ".nodus/local.env" in body["fix"]
        assert "no bearer token" in body["message"]
        # Before routing: an unknown path says nothing about what exists.
        assert_status(await anon.get("/nothing/here"), 401, "Unauthorized")
        wrong = {"Authorization": "Bearer not-the-token"}
        body = assert_status(
            await anon.post(sweeps(unique), json=sweep_body("lr"), headers=wrong), 401, "Unauthorized"
        )
        assert "not valid" in body["message"]
        basic = {"Authorization": "Basic dXNlcjpwYXNz"}
        assert_status(await anon.get(sweeps(unique), headers=basic), 401, "Unauthorized")
        # Health and version stay open, as in Kubernetes.
        assert (await anon.get("/healthz")).text == "ok"
        assert (await anon.get("/readyz")).text == "ok"
        version = (await anon.get("/version")).json()
        assert version["gitVersion"] == "v0.1.0-nodus" and version["major"] == "0"


# ---------------------------------------------------------------------------------------------------------
# Bad bodies
# ---------------------------------------------------------------------------------------------------------


async def test_oversized_body_is_413(api: httpx.AsyncClient, unique: str) -> None:
    body = sweep_body("big")
    body["metadata"]["annotations"] = {"blob": "x" * (1 << 20)}
    assert_status(await api.post(sweeps(unique), json=body), 413, "RequestEntityTooLarge")

    # Without a Content-Length (chunked), the limit holds while streaming.
    async def chunks() -> Any:
        for _ in range(20):
            yield b"x" * 65536

    assert_status(await api.post(sweeps(unique), content=chunks()), 413, "RequestEntityTooLarge")


async def test_invalid_sweep_lists_every_cause(api: httpx.AsyncClient, unique: str) -> None:
    body = sweep_body("lr")
    body["spec"].update(maxParallel=0, repetitions=100, state="Paused", maxCostUSD="ten")
    body["spec"]["matrix"]["params"] = {"lr": ["0.1"]}
    del body["spec"]["template"]["spec"]["image"]
    body["spec"]["template"]["spec"]["resources"]["gpu"] = "H100:3"
    status = assert_status(await api.post(sweeps(unique), json=body), 422, "Invalid")
    found = causes(status)
    assert set(found) >= {
        "spec.maxParallel",
        "spec.repetitions",
        "spec.state",
        "spec.maxCostUSD",
        "spec.matrix.params[lr]",
        "spec.template.spec.image",
        "spec.template.spec.resources.gpu",
    }
    assert found["spec.state"]["reason"] == "FieldValueNotSupported"
    assert found["spec.template.spec.image"]["reason"] == "FieldValueRequired"
    assert status["details"]["kind"] == "Sweep" and status["details"]["name"] == "lr"
    assert status["message"].startswith('Sweep.nodus.dev "lr" is invalid: [')
    assert_status(await api.get(sweeps(unique, "lr")), 404, "NotFound")  # nothing was stored


async def test_unknown_fields_and_type_errors_are_422_with_did_you_mean(
    api: httpx.AsyncClient, unique: str
) -> None:
    body = sweep_body("lr")
    body["spec"]["maxParalel"] = 2
    body["spec"]["template"]["spec"]["comand"] = ["python"]
    body["spec"]["template"]["spec"]["completions"] = "three"
    status = assert_status(await api.post(sweeps(unique), json=body), 422, "Invalid")
    found = causes(status)
    assert found["spec.maxParalel"]["reason"] == "FieldValueUnknown"
    assert 'did you mean "maxParallel"?' in found["spec.maxParalel"]["message"]
    assert 'did you mean "command"?' in found["spec.template.spec.comand"]["message"]
    assert found["spec.template.spec.completions"]["reason"] == "FieldValueTypeInvalid"


async def test_malformed_bodies_are_400(api: httpx.AsyncClient, unique: str) -> None:
    json_header = {"Content-Type": "application/json"}
    body = assert_status(
        await api.post(sweeps(unique), content=b'{"kind": "Sweep",', headers=json_header), 400, "BadRequest"
    )
    assert "not valid JSON" in body["message"]
    assert_status(await api.post(sweeps(unique), content=b"[1, 2]", headers=json_header), 400, "BadRequest")
    yaml_header = {"Content-Type": "application/yaml"}
    bomb = b"a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
    assert_status(await api.post(sweeps(unique), content=bomb, headers=yaml_header), 400, "BadRequest")
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert_status(await api.post(sweeps(unique), content=b"a=b", headers=form), 415, "UnsupportedMediaType")


async def test_kind_api_version_and_namespace_mismatches_are_400(api: httpx.AsyncClient, unique: str) -> None:
    body = sweep_body("lr")
    body["kind"] = "Job"
    msg = assert_status(await api.post(sweeps(unique), json=body), 400, "BadRequest")["message"]
    assert "kind in the data (Job)" in msg
    body = sweep_body("lr")
    body["apiVersion"] = "batch/v1"
    assert_status(await api.post(sweeps(unique), json=body), 400, "BadRequest")
    body = sweep_body("lr")
    body["metadata"]["namespace"] = "elsewhere"
    msg = assert_status(await api.post(sweeps(unique), json=body), 400, "BadRequest")["message"]
    assert "does not match the namespace sent on the request" in msg
    body["metadata"]["namespace"] = unique  # the same namespace is fine
    assert (await api.post(sweeps(unique), json=body)).status_code == 201


# ---------------------------------------------------------------------------------------------------------
# Request ids and crashes
# ---------------------------------------------------------------------------------------------------------


async def test_request_id_is_taken_from_the_caller_or_generated(api: httpx.AsyncClient, unique: str) -> None:
    resp = await api.get(sweeps(unique, "nope"), headers={"X-Request-Id": "req-abc.123"})
    assert resp.headers["x-request-id"] == "req-abc.123"
    assert resp.json()["requestId"] == "req-abc.123"
    generated = await api.get(sweeps(unique, "nope"))
    assert (
        generated.headers["x-request-id"]
        and generated.json()["requestId"] == generated.headers["x-request-id"]
    )
    # A caller's id that is not a plain token is replaced, not echoed into headers and logs.
    odd = await api.get(sweeps(unique, "nope"), headers={"X-Request-Id": "x" * 300})
    assert odd.headers["x-request-id"] != "x" * 300
    ok = await api.get(sweeps(unique))
    assert ok.status_code == 200 and ok.headers["x-request-id"]


async def test_unexpected_errors_are_500_without_a_traceback(nc: NATS, unique: str) -> None:
    class Broken:
        async def get(self, namespace: str, name: str) -> Any:
            raise RuntimeError("secret internal detail")

    stores: dict[str, Any] = {**stores_for(nc), "sweeps": Broken()}
    app = build_app(stores, admin_token="t")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": "Bearer t"},
    ) as client:
        resp = await client.get(sweeps(unique, "lr"))
    assert_status(resp, 500, "InternalError")
    assert "secret internal detail" not in resp.text and "Traceback" not in resp.text
    assert json.loads(resp.text)["requestId"] == resp.headers["x-request-id"]


async def test_readyz_is_a_503_status_when_nats_is_down(nc: NATS) -> None:
    app = build_app(stores_for(nc), admin_token="t", ready=lambda: False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        assert_status(await client.get("/readyz"), 503, "ServiceUnavailable")


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/version"])
async def test_public_endpoints(api: httpx.AsyncClient, path: str) -> None:
    assert (await api.get(path)).status_code == 200
