"""The write and read verbs beyond create/get: update, patch (merge, JSON, apply), delete with propagation,
deletecollection, field selectors, all-namespaces lists and fieldValidation; and the pure patch functions."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_gateway.patching import PatchApplyError, PatchDecodeError, json_patch, merge_patch
from nodus_gateway.resources import stores_for
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Job

API = "/apis/nodus.dev/v1"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}


def sweeps(namespace: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/sweeps", *rest])


def jobs(namespace: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/jobs", *rest])


def job_spec() -> dict[str, Any]:
    return {
        "image": "ghcr.io/acme/train:1.0",
        "command": ["python", "train.py"],
        "resources": {"gpu": "H100:1"},
    }


def sweep_body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name},
        "spec": {
            "matrix": {"params": {"LR": ["0.1", "0.01"]}},
            "template": {"kind": "Job", "spec": job_spec()},
            **spec,
        },
    }


def job_body(
    name: str, labels: dict[str, str] | None = None, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "nodus.dev/v1",
                "kind": "Sweep",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": meta, "spec": job_spec()}


async def create(api: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await api.post(url, json=body)
    assert resp.status_code == 201, resp.text
    out: dict[str, Any] = resp.json()
    return out


def failure(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["code"], body["reason"]) == ("Status", code, reason)
    assert body["fix"]
    return body


def cause_fields(status: dict[str, Any]) -> set[str]:
    return {c["field"] for c in status["details"]["causes"]}


async def set_phase(nc: NATS, plural: str, namespace: str, name: str, phase: str, **status: Any) -> None:
    """Write a status as a controller does (straight to the store: the API never lets users write it)."""
    store = stores_for(nc)[plural]

    def change(obj: Any) -> Any:
        return msgspec.structs.replace(obj, status=msgspec.structs.replace(obj.status, phase=phase, **status))

    await store.mutate(namespace, name, change)


# ---------------------------------------------------------------------------------------------------------
# PUT
# ---------------------------------------------------------------------------------------------------------


async def test_put_updates_and_a_stale_resource_version_is_409(api: httpx.AsyncClient, unique: str) -> None:
    created = await create(api, sweeps(unique), sweep_body("lr"))
    assert created["metadata"]["generation"] == 1
    changed = {**created, "spec": {**created["spec"], "maxParallel": 2}}
    resp = await api.put(sweeps(unique, "lr"), json=changed)
    assert resp.status_code == 200, resp.text
    updated = resp.json()
    assert updated["spec"]["maxParallel"] == 2
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert updated["metadata"]["generation"] == 2
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    assert updated["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]

    stale = {**created, "spec": {**created["spec"], "maxParallel": 3}}
    body = failure(await api.put(sweeps(unique, "lr"), json=stale), 409, "Conflict")
    assert "modified" in body["message"]
    assert "get the object again" in body["fix"].lower()
    assert (await api.get(sweeps(unique, "lr"))).json()["spec"]["maxParallel"] == 2


async def test_put_needs_a_resource_version_and_an_existing_object(
    api: httpx.AsyncClient, unique: str
) -> None:
    await create(api, sweeps(unique), sweep_body("lr"))
    body = failure(await api.put(sweeps(unique, "lr"), json=sweep_body("lr")), 422, "Invalid")
    assert body["message"] == (
        'Sweep.nodus.dev "lr" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified '
        "for an update"
    )
    missing = sweep_body("nope")
    missing["metadata"]["resourceVersion"] = "1"
    failure(await api.put(sweeps(unique, "nope"), json=missing), 404, "NotFound")
    renamed = (await api.get(sweeps(unique, "lr"))).json()
    renamed["metadata"]["name"] = "other"
    failure(await api.put(sweeps(unique, "lr"), json=renamed), 400, "BadRequest")


async def test_immutable_fields_and_lowering_the_cost_cap_are_422(
    api: httpx.AsyncClient, unique: str
) -> None:
    created = await create(api, sweeps(unique), sweep_body("lr", maxCostUSD="100"))
    changed = {**created, "spec": {**created["spec"], "maxCostUSD": "50"}}
    changed["spec"]["template"]["spec"]["image"] = "ghcr.io/acme/train:2.0"
    body = failure(await api.put(sweeps(unique, "lr"), json=changed), 422, "Invalid")
    assert cause_fields(body) == {"spec.template.spec.image", "spec.maxCostUSD"}
    assert "immutable" in body["message"] and "can only be raised" in body["message"]
    # The same rules hold for a patch, and raising the cap is fine.
    lower = {"spec": {"maxCostUSD": "10"}}
    body = failure(await api.patch(sweeps(unique, "lr"), json=lower, headers=MERGE), 422, "Invalid")
    assert cause_fields(body) == {"spec.maxCostUSD"}
    raised = await api.patch(sweeps(unique, "lr"), json={"spec": {"maxCostUSD": "200"}}, headers=MERGE)
    assert raised.status_code == 200, raised.text
    assert raised.json()["spec"]["maxCostUSD"] == "200"


async def test_status_is_never_written_by_users_and_generation_follows_the_spec(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    await create(api, sweeps(unique), sweep_body("lr"))
    await set_phase(nc, "sweeps", unique, "lr", "Running", observed_generation=1)
    current = (await api.get(sweeps(unique, "lr"))).json()

    # A label change and a status in the body: the status is the stored one, the generation stays.
    relabelled = {**current, "status": {"phase": "Succeeded"}}
    relabelled["metadata"]["labels"] = {"team": "ml"}
    resp = await api.put(sweeps(unique, "lr"), json=relabelled)
    assert resp.status_code == 200, resp.text
    after = resp.json()
    assert after["metadata"]["labels"] == {"team": "ml"}
    assert after["status"] == {"phase": "Running", "observedGeneration": 1}
    assert after["metadata"]["generation"] == 1

    # A spec change moves the generation; the controllers' observedGeneration stays until they look.
    resp = await api.patch(sweeps(unique, "lr"), json={"spec": {"maxParallel": 1}}, headers=MERGE)
    assert resp.json()["metadata"]["generation"] == 2
    assert resp.json()["status"]["observedGeneration"] == 1
    # A patch of the status alone changes nothing at all.
    resp = await api.patch(sweeps(unique, "lr"), json={"status": {"phase": "Failed"}}, headers=MERGE)
    assert resp.json()["status"]["phase"] == "Running" and resp.json()["metadata"]["generation"] == 2

    # The status subresource is read-only for users.
    body = failure(await api.put(sweeps(unique, "lr", "status"), json=after), 405, "MethodNotAllowed")
    assert "controllers" in body["message"]
    failure(await api.patch(sweeps(unique, "lr", "status"), json={}, headers=MERGE), 405, "MethodNotAllowed")
    assert (await api.get(sweeps(unique, "lr", "status"))).json()["status"]["phase"] == "Running"


# ---------------------------------------------------------------------------------------------------------
# PATCH
# ---------------------------------------------------------------------------------------------------------


async def test_merge_patch_changes_max_parallel(api: httpx.AsyncClient, unique: str) -> None:
    await create(api, sweeps(unique), sweep_body("lr"))
    resp = await api.patch(sweeps(unique, "lr"), json={"spec": {"maxParallel": 3}}, headers=MERGE)
    assert resp.status_code == 200, resp.text
    assert resp.json()["spec"]["maxParallel"] == 3
    assert resp.json()["spec"]["matrix"] == {"params": {"LR": ["0.1", "0.01"]}}  # the rest is untouched
    # A strategic merge patch is read as a merge patch (no patch-merge keys on custom resources).
    strategic = {"Content-Type": "application/strategic-merge-patch+json"}
    resp = await api.patch(sweeps(unique, "lr"), json={"spec": {"maxParallel": 2}}, headers=strategic)
    assert resp.status_code == 200 and resp.json()["spec"]["maxParallel"] == 2


async def test_a_patch_that_pins_a_stale_resource_version_is_409(api: httpx.AsyncClient, unique: str) -> None:
    created = await create(api, sweeps(unique), sweep_body("lr"))
    await api.patch(sweeps(unique, "lr"), json={"spec": {"maxParallel": 3}}, headers=MERGE)
    stale = {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "spec": {"maxParallel": 1},
    }
    failure(await api.patch(sweeps(unique, "lr"), json=stale, headers=MERGE), 409, "Conflict")
    assert (await api.get(sweeps(unique, "lr"))).json()["spec"]["maxParallel"] == 3


async def test_json_patch_applies_all_or_nothing(api: httpx.AsyncClient, unique: str) -> None:
    await create(api, sweeps(unique), sweep_body("lr"))
    ok = [
        {"op": "test", "path": "/spec/maxParallel", "value": 4},
        {"op": "replace", "path": "/spec/maxParallel", "value": 2},
        {"op": "add", "path": "/metadata/labels", "value": {"team": "ml"}},
    ]
    resp = await api.patch(sweeps(unique, "lr"), json=ok, headers=JSON_PATCH)
    assert resp.status_code == 200, resp.text
    assert resp.json()["spec"]["maxParallel"] == 2 and resp.json()["metadata"]["labels"] == {"team": "ml"}

    failing = [
        {"op": "replace", "path": "/spec/maxParallel", "value": 1},
        {"op": "test", "path": "/spec/maxParallel", "value": 99},
    ]
    body = failure(await api.patch(sweeps(unique, "lr"), json=failing, headers=JSON_PATCH), 422, "Invalid")
    assert "test failed" in body["message"]
    assert (await api.get(sweeps(unique, "lr"))).json()["spec"]["maxParallel"] == 2
    bad = [{"op": "frobnicate", "path": "/spec"}]
    failure(await api.patch(sweeps(unique, "lr"), json=bad, headers=JSON_PATCH), 400, "BadRequest")


async def test_apply_creates_then_merges_and_records_the_field_manager(
    api: httpx.AsyncClient, unique: str
) -> None:
    manifest = """
apiVersion: nodus.dev/v1
kind: Sweep
metadata:
  name: lr
  labels: {team: ml}
spec:
  maxParallel: 2
  matrix: {params: {LR: ["0.1", "0.01"]}}
  template:
    spec: {image: "ghcr.io/acme/train:1.0", command: [python, train.py], resources: {gpu: "H100:1"}}
"""
    url = sweeps(unique, "lr")
    first = await api.patch(url, content=manifest, headers=APPLY, params={"fieldManager": "ci"})
    assert first.status_code == 201, first.text
    managed = first.json()["metadata"]["managedFields"]
    assert [(m["manager"], m["operation"], m["fieldsType"]) for m in managed] == [("ci", "Apply", "FieldsV1")]
    assert managed[0]["apiVersion"] == "nodus.dev/v1" and managed[0]["time"]
    assert "f:maxParallel" in managed[0]["fieldsV1"]["f:spec"]
    assert first.json()["metadata"]["generation"] == 1

    second = await api.patch(
        url,
        content=manifest.replace("maxParallel: 2", "maxParallel: 3"),
        headers=APPLY,
        params={"fieldManager": "ci", "force": "true"},
    )
    assert second.status_code == 200, second.text
    obj = second.json()
    assert obj["spec"]["maxParallel"] == 3 and obj["metadata"]["labels"] == {"team": "ml"}
    assert obj["metadata"]["generation"] == 2
    assert [m["manager"] for m in obj["metadata"]["managedFields"]] == ["ci"]  # replaced, not added

    body = failure(await api.patch(url, content=manifest, headers=APPLY), 400, "BadRequest")
    assert "fieldManager" in body["message"]


async def test_unknown_patch_type_is_415(api: httpx.AsyncClient, unique: str) -> None:
    await create(api, sweeps(unique), sweep_body("lr"))
    resp = await api.patch(sweeps(unique, "lr"), json={}, headers={"Content-Type": "application/json"})
    body = failure(resp, 415, "UnsupportedMediaType")
    assert "application/merge-patch+json" in body["message"]


async def test_field_validation_strict_warn_ignore(api: httpx.AsyncClient, unique: str) -> None:
    body = sweep_body("lr")
    body["spec"]["maxParalel"] = 2
    failure(await api.post(sweeps(unique), json=body), 422, "Invalid")  # Strict by default
    resp = await api.post(sweeps(unique), json=body, params={"fieldValidation": "Warn"})
    assert resp.status_code == 201, resp.text
    warnings = resp.headers.get_list("warning")
    assert warnings[0] == '299 - "unknown field \\"spec.maxParalel\\"; did you mean \\"maxParallel\\"?"'
    # These tests serve no estimate services: the create says it has no estimate (ADR-031), after admission's.
    assert all(w.startswith('299 - "no estimate: ') for w in warnings[1:])
    resp = await api.patch(
        sweeps(unique, "lr"), json={"spec": {"bogus": 1}}, headers=MERGE, params={"fieldValidation": "Ignore"}
    )
    assert resp.status_code == 200 and "warning" not in resp.headers
    assert "bogus" not in resp.json()["spec"]
    failure(await api.post(sweeps(unique), json=body, params={"fieldValidation": "Loose"}), 400, "BadRequest")


# ---------------------------------------------------------------------------------------------------------
# DELETE and deletecollection
# ---------------------------------------------------------------------------------------------------------


async def store_job(nc: NATS, namespace: str, body: dict[str, Any]) -> None:
    """Write a Job straight into the store, as the sweep controller writes its cells: the API refuses the
    nodus.dev/ labels and a Sweep's controller reference in what users write."""
    job = default_job(msgspec.convert(body, Job))
    meta = msgspec.structs.replace(job.metadata, namespace=namespace, generation=1)
    await stores_for(nc)["jobs"].create(msgspec.structs.replace(job, metadata=meta))


async def sweep_with_cells(api: httpx.AsyncClient, nc: NATS, namespace: str, name: str) -> dict[str, Any]:
    """A Sweep and two cell Jobs it owns (written to the store, as the controller writes them)."""
    sweep = await create(api, sweeps(namespace), sweep_body(name))
    for i in range(2):
        cell = job_body(
            f"{name}-{i}", labels={"nodus.dev/sweep": name, "nodus.dev/cell": str(i)}, owner=sweep
        )
        await store_job(nc, namespace, cell)
    return sweep


async def job_names(api: httpx.AsyncClient, namespace: str) -> list[str]:
    return [j["metadata"]["name"] for j in (await api.get(jobs(namespace))).json()["items"]]


async def test_orphan_delete_keeps_the_cells_without_their_owner(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    await sweep_with_cells(api, nc, unique, "lr")
    resp = await api.delete(sweeps(unique, "lr"), params={"propagationPolicy": "Orphan"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["metadata"]["name"] == "lr"
    failure(await api.get(sweeps(unique, "lr")), 404, "NotFound")
    cells = (await api.get(jobs(unique))).json()["items"]
    assert [c["metadata"]["name"] for c in cells] == ["lr-0", "lr-1"]
    for cell in cells:
        assert "ownerReferences" not in cell["metadata"]
        assert cell["metadata"]["labels"]["nodus.dev/sweep"] == "lr"  # labels stay


async def test_foreground_delete_removes_the_cells_first(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    await sweep_with_cells(api, nc, unique, "lr")
    await store_job(nc, unique, job_body("unowned", labels={"nodus.dev/sweep": "lr"}))
    # kubectl sends the options as a DeleteOptions body.
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}
    resp = await api.request("DELETE", sweeps(unique, "lr"), json=options)
    assert resp.status_code == 200, resp.text
    assert await job_names(api, unique) == ["unowned"]  # only what the Sweep owned went with it
    failure(await api.get(sweeps(unique, "lr")), 404, "NotFound")


async def test_background_delete_leaves_the_cells_to_the_controller(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    await sweep_with_cells(api, nc, unique, "lr")
    resp = await api.delete(sweeps(unique, "lr"))
    assert resp.status_code == 200, resp.text
    failure(await api.get(sweeps(unique, "lr")), 404, "NotFound")
    # The sweep controller (not running in these tests) collects them; the gateway returned at once.
    assert await job_names(api, unique) == ["lr-0", "lr-1"]


async def test_delete_preconditions_and_options(api: httpx.AsyncClient, unique: str) -> None:
    created = await create(api, sweeps(unique), sweep_body("lr"))
    wrong_uid = {"preconditions": {"uid": "not-the-uid"}}
    body = failure(await api.request("DELETE", sweeps(unique, "lr"), json=wrong_uid), 409, "Conflict")
    assert body["message"].startswith("Precondition failed: UID in precondition: not-the-uid")
    await api.patch(sweeps(unique, "lr"), json={"spec": {"maxParallel": 1}}, headers=MERGE)
    stale = {"preconditions": {"resourceVersion": created["metadata"]["resourceVersion"]}}
    failure(await api.request("DELETE", sweeps(unique, "lr"), json=stale), 409, "Conflict")
    body = failure(
        await api.delete(sweeps(unique, "lr"), params={"propagationPolicy": "Later"}), 422, "Invalid"
    )
    assert "propagationPolicy" in cause_fields(body)
    right = {"preconditions": {"uid": created["metadata"]["uid"]}}
    assert (await api.request("DELETE", sweeps(unique, "lr"), json=right)).status_code == 200


async def test_deletecollection_by_label_returns_what_it_deleted(api: httpx.AsyncClient, unique: str) -> None:
    for name, team in (("a", "ml"), ("b", "ml"), ("c", "web")):
        await create(api, jobs(unique), job_body(name, labels={"team": team}))
    resp = await api.delete(jobs(unique), params={"labelSelector": "team=ml"})
    assert resp.status_code == 200, resp.text
    deleted = resp.json()
    assert deleted["kind"] == "JobList"
    assert [j["metadata"]["name"] for j in deleted["items"]] == ["a", "b"]
    assert await job_names(api, unique) == ["c"]
    # Nothing matches: an empty list, not an error.
    resp = await api.delete(jobs(unique), params={"fieldSelector": "metadata.name=zzz"})
    assert resp.status_code == 200 and resp.json()["items"] == []


# ---------------------------------------------------------------------------------------------------------
# Lists: field selectors, all namespaces
# ---------------------------------------------------------------------------------------------------------


async def test_field_selectors(api: httpx.AsyncClient, nc: NATS, unique: str) -> None:
    for name in ("a", "b", "c"):
        await create(api, jobs(unique), job_body(name))
    await set_phase(nc, "jobs", unique, "a", "Running")
    await set_phase(nc, "jobs", unique, "b", "Running")

    async def names(selector: str, **params: Any) -> list[str]:
        resp = await api.get(jobs(unique), params={"fieldSelector": selector, **params})
        assert resp.status_code == 200, resp.text
        return [j["metadata"]["name"] for j in resp.json()["items"]]

    assert await names("status.phase=Running") == ["a", "b"]
    assert await names("status.phase!=Running") == ["c"]
    assert await names("status.phase==Running,metadata.name!=a") == ["b"]
    assert await names(f"metadata.namespace={unique},metadata.name=c") == ["c"]
    # A filtered page still pages: the token resumes after the last match.
    first = (await api.get(jobs(unique), params={"fieldSelector": "status.phase=Running", "limit": 1})).json()
    assert [j["metadata"]["name"] for j in first["items"]] == ["a"]
    token = first["metadata"]["continue"]
    assert await names("status.phase=Running", limit=1, **{"continue": token}) == ["b"]

    body = failure(await api.get(jobs(unique), params={"fieldSelector": "spec.image=x"}), 400, "BadRequest")
    assert "metadata.name, metadata.namespace, status.phase" in body["message"]
    failure(await api.get(jobs(unique), params={"fieldSelector": "status.phase"}), 400, "BadRequest")


async def test_list_across_all_namespaces(api: httpx.AsyncClient, unique: str) -> None:
    other = f"{unique}-b"
    await create(
        api, sweeps(unique), {**sweep_body("lr"), "metadata": {"name": "lr", "labels": {"t": unique}}}
    )
    await create(
        api, sweeps(other), {**sweep_body("lr"), "metadata": {"name": "lr", "labels": {"t": unique}}}
    )
    resp = await api.get(f"{API}/sweeps", params={"labelSelector": f"t={unique}"})
    assert resp.status_code == 200, resp.text
    found = [(s["metadata"]["namespace"], s["metadata"]["name"]) for s in resp.json()["items"]]
    assert sorted(found) == [(unique, "lr"), (other, "lr")]
    narrowed = await api.get(f"{API}/sweeps", params={"fieldSelector": f"metadata.namespace={other}"})
    assert [s["metadata"]["namespace"] for s in narrowed.json()["items"]] == [other]
    assert (await api.get(f"{API}/jobs", params={"labelSelector": f"t={unique}"})).json()["items"] == []


# ---------------------------------------------------------------------------------------------------------
# patching.py: the pure functions
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [  # RFC 7386, appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_follows_rfc_7386(target: Any, patch: Any, result: Any) -> None:
    before = msgspec.json.encode(target)
    assert merge_patch(target, patch) == result
    assert msgspec.json.encode(target) == before  # the target is not modified


def test_json_patch_operations() -> None:
    doc = {"foo": ["bar", "baz"], "a/b": 1, "m~n": 2, "obj": {"x": 1}}
    ops = [
        {"op": "add", "path": "/foo/1", "value": "qux"},
        {"op": "add", "path": "/foo/-", "value": "end"},
        {"op": "remove", "path": "/a~1b"},
        {"op": "replace", "path": "/m~0n", "value": 3},
        {"op": "copy", "from": "/obj", "path": "/copy"},
        {"op": "move", "from": "/obj/x", "path": "/moved"},
        {"op": "test", "path": "/foo", "value": ["bar", "qux", "baz", "end"]},
        {"op": "test", "path": "/moved", "value": 1.0},
    ]
    assert json_patch(doc, ops) == {
        "foo": ["bar", "qux", "baz", "end"],
        "m~n": 3,
        "obj": {},
        "copy": {"x": 1},
        "moved": 1,
    }
    assert doc["foo"] == ["bar", "baz"]  # the input is not modified
    assert json_patch({"a": 1}, [{"op": "replace", "path": "", "value": [1]}]) == [1]


@pytest.mark.parametrize(
    ("ops", "error"),
    [
        ({"op": "add"}, PatchDecodeError),
        ([{"op": "jump", "path": "/a"}], PatchDecodeError),
        ([{"op": "add", "path": "/a"}], PatchDecodeError),  # no value
        ([{"op": "move", "path": "/a"}], PatchDecodeError),  # no from
        ([{"op": "add", "path": "a", "value": 1}], PatchDecodeError),  # not a pointer
        ([{"op": "test", "path": "/a", "value": 2}], PatchApplyError),
        ([{"op": "test", "path": "/t", "value": 1}], PatchApplyError),  # true is not 1 in JSON
        ([{"op": "remove", "path": "/missing"}], PatchApplyError),
        ([{"op": "replace", "path": "/missing", "value": 1}], PatchApplyError),
        ([{"op": "add", "path": "/l/5", "value": 1}], PatchApplyError),
        ([{"op": "add", "path": "/l/01", "value": 1}], PatchApplyError),
        ([{"op": "add", "path": "/a/b/c", "value": 1}], PatchApplyError),
        ([{"op": "move", "from": "/o", "path": "/o/inner"}], PatchApplyError),
    ],
)
def test_json_patch_errors(ops: Any, error: type[Exception]) -> None:
    doc = {"a": 1, "t": True, "l": [1, 2], "o": {}}
    with pytest.raises(error):
        json_patch(doc, ops)
    assert doc == {"a": 1, "t": True, "l": [1, 2], "o": {}}


async def test_dry_run_admits_and_stores_nothing(api: httpx.AsyncClient, unique: str) -> None:
    dry = {"dryRun": "All"}
    # A dry-run create answers an estimate (ADR-031); these tests serve no estimate services, so it is a
    # 503 (test_estimates.py has the dry runs that answer), and still stores nothing.
    failure(await api.post(sweeps(unique), json=sweep_body("lr"), params=dry), 503, "ServiceUnavailable")
    failure(await api.get(sweeps(unique, "lr")), 404, "NotFound")
    invalid = sweep_body("lr", maxParallel=0)
    failure(await api.post(sweeps(unique), json=invalid, params=dry), 422, "Invalid")

    await create(api, sweeps(unique), sweep_body("lr"))
    resp = await api.patch(sweeps(unique, "lr"), json={"spec": {"maxParallel": 1}}, headers=MERGE, params=dry)
    assert resp.status_code == 200 and resp.json()["spec"]["maxParallel"] == 1
    assert (await api.get(sweeps(unique, "lr"))).json()["spec"]["maxParallel"] == 4
    assert (await api.delete(sweeps(unique, "lr"), params=dry)).status_code == 200
    assert (await api.get(sweeps(unique, "lr"))).status_code == 200
    failure(await api.delete(sweeps(unique, "lr"), params={"dryRun": "Maybe"}), 400, "BadRequest")
