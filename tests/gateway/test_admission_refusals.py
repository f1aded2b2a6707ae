"""Admission refuses what nothing downstream can honour, on every write path: create, dry run, PUT, merge
and JSON patch, apply; for Jobs and for Sweeps (whose template is a JobSpec). Each refusal is a 422 Invalid
with the field in details.causes and a fix, never a 500 and never a 503:

* numbers, durations and amounts outside their documented range (docs/errors/Invalid.md);
* output paths the node agent cannot collect;
* fields whose feature Nodus does not support yet;
* names the scheduler's catalog does not know (GPU types, region classes, offerings), while a known name
  that nothing sells stays 503 CapacityUnavailable;
* the nodus.dev/ labels and a Sweep's controller reference, which only the sweep controller sets: a PUT
  may keep them as read from a cell Job written by the controller, but not add, change or remove them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_gateway.resources import stores_for
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Job

API = "/apis/nodus.dev/v1"
DRY = {"dryRun": "All"}
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}
BIG = 2**63


def url(namespace: str, plural: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/{plural}", *rest])


def job_spec(**kw: Any) -> dict[str, Any]:
    return {"image": "ghcr.io/acme/train:1.0", "command": ["python"], "resources": {"gpu": "H100:1"}, **kw}


def job_body(name: str, meta: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": name, **(meta or {})},
        "spec": job_spec(**spec),
    }


def sweep_body(name: str, matrix: dict[str, Any] | None = None, **template: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name},
        "spec": {
            "matrix": matrix or {"params": {"LR": ["0.1", "0.01"]}},
            "template": {"kind": "Job", "spec": job_spec(**template)},
        },
    }


def refused(resp: httpx.Response, *fields: str) -> dict[str, Any]:
    """A 422 Invalid Status naming every field in ``fields``, with a fix and its docs page."""
    assert resp.status_code == 422, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["reason"]) == ("Status", "Invalid")
    assert body["fix"] and body["docs"].endswith("/errors/Invalid")
    got = {c["field"] for c in body["details"]["causes"]}
    assert set(fields) <= got, (fields, body["details"]["causes"])
    return body


def cause(body: dict[str, Any], field: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in body["details"]["causes"] if c["field"] == field)
    return found


async def created(api: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await api.post(path, json=body)
    assert resp.status_code == 201, resp.text
    out: dict[str, Any] = resp.json()
    return out


# -- ranges ---------------------------------------------------------------------------------------------

OUT_OF_RANGE = [
    ({"ttlSecondsAfterFinished": BIG}, "spec.ttlSecondsAfterFinished"),
    ({"ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished"),
    ({"ttlSecondsAfterFinished": 1.5}, "spec.ttlSecondsAfterFinished"),
    ({"activeDeadlineSeconds": BIG}, "spec.activeDeadlineSeconds"),
    ({"timeout": "99999999999999h"}, "spec.timeout"),
    ({"maxCostUSD": "99999999999999"}, "spec.maxCostUSD"),
    ({"backoffLimit": BIG}, "spec.backoffLimit"),
    ({"completions": 1.0}, "spec.completions"),
    ({"placement": {"queueTimeout": "99999999999999h"}}, "spec.placement.queueTimeout"),
    ({"placement": {"maxRateUSDPerHour": "99999999999999"}}, "spec.placement.maxRateUSDPerHour"),
    ({"resources": {"gpu": "H100:1", "memory": "8Ei"}}, "spec.resources.memory"),
]


@pytest.mark.parametrize(("spec", "field"), OUT_OF_RANGE, ids=[f for _, f in OUT_OF_RANGE])
async def test_out_of_range_values_are_422_on_create_and_dry_run_for_jobs_and_sweeps(
    api: httpx.AsyncClient, unique: str, spec: dict[str, Any], field: str
) -> None:
    for params in ({}, DRY):
        refused(await api.post(url(unique, "jobs"), json=job_body("j", **spec), params=params), field)
        template_field = field.replace("spec.", "spec.template.spec.", 1)
        refused(
            await api.post(url(unique, "sweeps"), json=sweep_body("s", **spec), params=params), template_field
        )
    assert (await api.get(url(unique, "jobs"))).json()["items"] == []


async def test_a_number_json_cannot_hold_is_never_a_500(api: httpx.AsyncClient, unique: str) -> None:
    body = json.dumps(job_body("j")).replace('"command"', '"ttlSecondsAfterFinished": 1e400, "command"')
    resp = await api.post(url(unique, "jobs"), content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code in (400, 422), resp.text
    big = json.dumps(job_body("j")).replace('"command"', f'"ttlSecondsAfterFinished": {2**64 + 1}, "command"')
    resp = await api.post(url(unique, "jobs"), content=big, headers={"Content-Type": "application/json"})
    refused(resp, "spec.ttlSecondsAfterFinished")


async def test_the_sweeps_own_cap_is_bounded(api: httpx.AsyncClient, unique: str) -> None:
    body = sweep_body("s")
    body["spec"]["maxCostUSD"] = "99999999999999"
    refused(await api.post(url(unique, "sweeps"), json=body), "spec.maxCostUSD")


async def test_every_update_path_holds_the_ranges(api: httpx.AsyncClient, unique: str) -> None:
    job = await created(api, url(unique, "jobs"), job_body("j"))
    put = {**job, "spec": {**job["spec"], "ttlSecondsAfterFinished": BIG}}
    refused(await api.put(url(unique, "jobs", "j"), json=put), "spec.ttlSecondsAfterFinished")
    refused(await api.put(url(unique, "jobs", "j"), json=put, params=DRY), "spec.ttlSecondsAfterFinished")
    merge = {"spec": {"timeout": "99999999999999h"}}
    refused(await api.patch(url(unique, "jobs", "j"), json=merge, headers=MERGE), "spec.timeout")
    ops = [{"op": "add", "path": "/spec/maxCostUSD", "value": "99999999999999"}]
    refused(await api.patch(url(unique, "jobs", "j"), json=ops, headers=JSON_PATCH), "spec.maxCostUSD")
    apply = "apiVersion: nodus.dev/v1\nkind: Job\nmetadata:\n  name: j\n"
    apply += f"spec:\n  ttlSecondsAfterFinished: {BIG}\n"
    resp = await api.patch(
        url(unique, "jobs", "j"), content=apply, headers=APPLY, params={"fieldManager": "t"}
    )
    refused(resp, "spec.ttlSecondsAfterFinished")
    # A Sweep's own cap, through a patch (it may be raised, but not past a billion).
    await created(api, url(unique, "sweeps"), sweep_body("s"))
    merge = {"spec": {"maxCostUSD": "99999999999999"}}
    refused(await api.patch(url(unique, "sweeps", "s"), json=merge, headers=MERGE), "spec.maxCostUSD")
    # Nothing of it was stored.
    stored = (await api.get(url(unique, "jobs", "j"))).json()
    assert "ttlSecondsAfterFinished" not in stored["spec"] and "timeout" not in stored["spec"]


async def test_an_update_may_keep_a_value_stored_before_the_rule_but_not_set_one(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    """Validation ratcheting: a Job admitted before the ranges (written here straight to the store) can
    still be suspended; what the update changes is held to every rule."""
    legacy = job_body("old", ttlSecondsAfterFinished=BIG, completeByTime="2030-01-01T00:00:00Z")
    await store_job(nc, unique, legacy)
    resp = await api.patch(url(unique, "jobs", "old"), json={"spec": {"state": "Suspended"}}, headers=MERGE)
    assert resp.status_code == 200, resp.text
    assert resp.json()["spec"]["state"] == "Suspended"
    worse = {"spec": {"ttlSecondsAfterFinished": BIG + 1}}
    refused(
        await api.patch(url(unique, "jobs", "old"), json=worse, headers=MERGE), "spec.ttlSecondsAfterFinished"
    )


# -- paths and fields Nodus does not honour ------------------------------------------------------------


async def test_an_output_the_node_cannot_collect_is_422_with_a_fix(
    api: httpx.AsyncClient, unique: str
) -> None:
    body = job_body("j", outputs=[{"name": "host", "path": "/etc/hostname"}, {"name": "rel", "path": "x/y"}])
    refused_body = refused(
        await api.post(url(unique, "jobs"), json=body), "spec.outputs[0].path", "spec.outputs[1].path"
    )
    assert "/nodus/outputs/hostname" in cause(refused_body, "spec.outputs[0].path")["message"]
    ok = job_body("ok", outputs=[{"name": "model", "path": "/nodus/outputs/model.pt"}])
    assert (await api.post(url(unique, "jobs"), json=ok)).status_code == 201
    sweep = sweep_body("s", outputs=[{"name": "n", "path": "/nodus/outputs/a\u0000b"}])
    refused(await api.post(url(unique, "sweeps"), json=sweep), "spec.template.spec.outputs[0].path")


NOT_HONOURED = [
    ({"imageRef": "ghcr.io/acme/train@sha256:" + "a" * 64, "image": "busybox"}, "spec.imageRef"),
]


@pytest.mark.parametrize(("spec", "field"), NOT_HONOURED, ids=[f for _, f in NOT_HONOURED])
async def test_a_field_nodus_does_not_honour_is_422_saying_what_to_use(
    api: httpx.AsyncClient, unique: str, spec: dict[str, Any], field: str
) -> None:
    body = refused(await api.post(url(unique, "jobs"), json=job_body("j", **spec)), field)
    message = cause(body, field)["message"]
    assert "not supported yet" in message and "instead" in message
    assert cause(body, field)["reason"] == "FieldValueForbidden"
    sweep_field = field.replace("spec.", "spec.template.spec.", 1)
    refused(await api.post(url(unique, "sweeps"), json=sweep_body("s", **spec), params=DRY), sweep_field)


# -- unknown names: 422 on the field; a known name with no capacity stays 503 ---------------------------


@pytest_asyncio.fixture
async def endpoints(nc: NATS) -> AsyncIterator[None]:
    """The scheduler's and billing's estimate endpoints, on the real subjects the gateway asks."""
    subs = [await serve_estimates(nc, load_catalog()), await serve_quotes(nc)]
    yield
    for sub in subs:
        await sub.unsubscribe()


async def test_an_unknown_gpu_region_or_offering_is_422_with_the_closest_known(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    body = job_body(
        "j",
        resources={"gpu": {"type": ["NOSUCHGPU", "H10O"]}},
        placement={"regions": ["mars"], "offerings": ["h100-sxm-80g-x1-uss"]},
    )
    for params in ({}, DRY):
        status = refused(
            await api.post(url(unique, "jobs"), json=body, params=params),
            "spec.resources.gpu.type[0]",
            "spec.resources.gpu.type[1]",
            "spec.placement.regions[0]",
            "spec.placement.offerings[0]",
        )
        assert cause(status, "spec.resources.gpu.type[0]")["reason"] == "FieldValueNotSupported"
        assert 'did you mean "H100"?' in cause(status, "spec.resources.gpu.type[1]")["message"]
        # The known region classes: the price book's (asia, eu, us) and any a node of another test registered.
        said = cause(status, "spec.placement.regions[0]")["message"]
        assert all(region in said for region in ("asia", "eu", "us")), said
        assert 'did you mean "h100-sxm-80g-x1-us"?' in cause(status, "spec.placement.offerings[0]")["message"]
    # The string form too, where defaulting made it an object.
    refused(
        await api.post(url(unique, "jobs"), json=job_body("k", resources={"gpu": "NOSUCHGPU:1"})),
        "spec.resources.gpu.type[0]",
    )
    assert (await api.get(url(unique, "jobs"))).json()["items"] == []


async def test_a_sweeps_unknown_matrix_values_are_422_on_their_own_paths(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    body = sweep_body("s", matrix={"gpu": ["H100:1", "NOSUCHGPU:1"], "regions": ["us", "mars"]})
    for params in ({}, DRY):
        refused(
            await api.post(url(unique, "sweeps"), json=body, params=params),
            "spec.matrix.gpu[1].type[0]",
            "spec.matrix.regions[1]",
        )


async def test_a_known_name_nothing_sells_is_still_503_capacity_unavailable(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    for name, gpu, regions in (
        ("b200", "B200:1", ["us"]),
        ("mi300x", "MI300X:1", ["eu"]),
        ("lower", "l4:2", []),
    ):
        resp = await api.post(
            url(unique, "jobs"), json=job_body(name, resources={"gpu": gpu}, placement={"regions": regions})
        )
        assert resp.status_code == 503, resp.text
        status = resp.json()
        assert status["reason"] == "CapacityUnavailable" and status["fix"]


# -- metadata only Nodus sets -----------------------------------------------------------------------------


async def store_job(nc: NATS, namespace: str, body: dict[str, Any]) -> None:
    """Write a Job straight into the store, as the sweep controller writes its cells."""
    job = default_job(msgspec.convert(body, Job))
    meta = msgspec.structs.replace(job.metadata, namespace=namespace, generation=1)
    await stores_for(nc)["jobs"].create(msgspec.structs.replace(job, metadata=meta))


def controller_ref(sweep: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "name": sweep["metadata"]["name"],
        "uid": sweep["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


async def test_a_create_may_set_no_nodus_label_nor_a_sweeps_controller_reference(
    api: httpx.AsyncClient, unique: str
) -> None:
    sweep = await created(api, url(unique, "sweeps"), sweep_body("lr"))
    meta = {"labels": {"nodus.dev/sweep": "lr", "team": "ml"}, "ownerReferences": [controller_ref(sweep)]}
    for params in ({}, DRY):
        body = refused(
            await api.post(url(unique, "jobs"), json=job_body("lr-0", meta), params=params),
            "metadata.labels[nodus.dev/sweep]",
            "metadata.ownerReferences[0].controller",
        )
        assert "example.com/sweep" in cause(body, "metadata.labels[nodus.dev/sweep]")["message"]
    labelled = {**sweep_body("other"), "metadata": {"name": "other", "labels": {"nodus.dev/cell": "0"}}}
    refused(await api.post(url(unique, "sweeps"), json=labelled), "metadata.labels[nodus.dev/cell]")
    budget = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Budget",
        "metadata": {"name": "b", "labels": {"nodus.dev/sweep": "lr"}},
        "spec": {"monthlyUSD": "10"},
    }
    refused(await api.post(url(unique, "budgets"), json=budget), "metadata.labels[nodus.dev/sweep]")
    secret = {"metadata": {"name": "s", "labels": {"nodus.dev/x": "y"}}, "stringData": {"k": "v"}}
    refused(await api.post(url(unique, "secrets"), json=secret), "metadata.labels[nodus.dev/x]")
    # A reference that does not make the Job a cell (controller unset) is the user's to set.
    plain = {"ownerReferences": [{**controller_ref(sweep), "controller": False}]}
    assert (await api.post(url(unique, "jobs"), json=job_body("owned", plain))).status_code == 201


async def test_an_update_of_a_cell_may_keep_what_the_controller_set_and_nothing_else(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    sweep = await created(api, url(unique, "sweeps"), sweep_body("lr"))
    labels = {"nodus.dev/sweep": "lr", "nodus.dev/cell": "0"}
    await store_job(
        nc, unique, job_body("lr-0", {"labels": labels, "ownerReferences": [controller_ref(sweep)]})
    )
    cell_url = url(unique, "jobs", "lr-0")
    read = (await api.get(cell_url)).json()
    # PUT back what was read, with a change of its own: allowed, the server's fields kept as they are.
    put = {
        **read,
        "metadata": {**read["metadata"], "labels": {**labels, "team": "ml"}},
        "spec": {**read["spec"], "backoffLimit": 2},
    }
    for params in (DRY, {}):
        resp = await api.put(cell_url, json=put, params=params)
        assert resp.status_code == 200, resp.text
    after = resp.json()
    assert after["metadata"]["labels"] == {**labels, "team": "ml"} and after["spec"]["backoffLimit"] == 2
    assert after["metadata"]["ownerReferences"] == read["metadata"]["ownerReferences"]
    # A merge patch that leaves the labels alone keeps them.
    resp = await api.patch(cell_url, json={"spec": {"backoffLimit": 3}}, headers=MERGE)
    assert resp.status_code == 200, resp.text
    # Changing, adding or removing a nodus.dev/ label: refused on every path.
    changed = {**after, "metadata": {**after["metadata"], "labels": {**labels, "nodus.dev/sweep": "other"}}}
    refused(await api.put(cell_url, json=changed), "metadata.labels[nodus.dev/sweep]")
    merge = {"metadata": {"labels": {"nodus.dev/extra": "x"}}}
    refused(await api.patch(cell_url, json=merge, headers=MERGE), "metadata.labels[nodus.dev/extra]")
    ops = [{"op": "remove", "path": "/metadata/labels/nodus.dev~1cell"}]
    refused(await api.patch(cell_url, json=ops, headers=JSON_PATCH), "metadata.labels[nodus.dev/cell]")
    apply = (
        "apiVersion: nodus.dev/v1\nkind: Job\nmetadata:\n  name: lr-0\n  labels:\n    nodus.dev/sweep: x\n"
    )
    resp = await api.patch(cell_url, content=apply, headers=APPLY, params={"fieldManager": "t"})
    refused(resp, "metadata.labels[nodus.dev/sweep]")
    # Another Sweep's controller reference: refused; dropping the reference (orphaning) is allowed.
    other = await created(api, url(unique, "sweeps"), sweep_body("other"))
    moved = {"metadata": {"ownerReferences": [controller_ref(other)]}}
    refused(await api.patch(cell_url, json=moved, headers=MERGE), "metadata.ownerReferences[0].controller")
    resp = await api.patch(cell_url, json={"metadata": {"ownerReferences": None}}, headers=MERGE)
    assert resp.status_code == 200, resp.text
    assert "ownerReferences" not in resp.json()["metadata"]
    assert resp.json()["metadata"]["labels"]["nodus.dev/sweep"] == "lr"
