"""The Pipeline kind through the API (issue #22): its verbs as kubectl sends them, admission (the DAG's 422s,
the stages' reference checks, the update rule), discovery, OpenAPI, Tables, and the deletion cascade to the
children the sweep controller creates.

The gateway runs in-process against the session's real nats-server. No estimate service answers here, so a
create is admitted with a ``no estimate`` warning (test_pipeline_estimates.py serves them). The children of a
Pipeline are written straight into the store, as the sweep controller writes them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway import tabling
from nodus_gateway.blobreaping import referenced
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job, JobSpec, Source
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.pipelines import PIPELINE_LABEL, STAGE_LABEL, Pipeline, PipelineStatus, StageStatus
from nodus_schema.sweeps import Sweep, SweepSpec
from nodus_schema.volumes import Volume, VolumeRevision, VolumeStatus

API = "/apis/nodus.dev/v1"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}


def pipelines(namespace: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/pipelines", *rest])


def job(**extra: Any) -> dict[str, Any]:
    return {
        "image": "ghcr.io/acme/train:1.0",
        "command": ["python", "train.py"],
        "resources": {"gpu": "H100:1"},
        "outputs": [{"name": "model", "path": "/nodus/outputs/model"}],
        **extra,
    }


def from_stage(stage: str, output: str = "model", name: str = "prev") -> dict[str, Any]:
    return {"name": name, "fromStage": {"stage": stage, "output": output}}


def stages() -> list[dict[str, Any]]:
    """prepare (Job) -> grid (a 6-cell Sweep) -> train (Job, the best cell) -> evaluate (Job)."""
    return [
        {"name": "prepare", "template": {"job": job()}},
        {
            "name": "grid",
            "dependsOn": ["prepare"],
            "template": {
                "sweep": {
                    "maxParallel": 2,
                    "matrix": {"params": {"LR": ["0.1", "0.03", "0.01", "0.003", "0.001", "0.0003"]}},
                    "template": {"spec": job(inputs=[from_stage("prepare")])},
                }
            },
        },
        {
            "name": "train",
            "dependsOn": ["grid"],
            "fromBest": {"stage": "grid", "by": "Cost"},
            "template": {"job": job(inputs=[from_stage("grid")])},
        },
        {"name": "evaluate", "dependsOn": ["train"], "template": {"job": job(inputs=[from_stage("train")])}},
    ]


def body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {"stages": stages(), **spec},
    }


def failure(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    out: dict[str, Any] = resp.json()
    assert (out["kind"], out["code"], out["reason"]) == ("Status", code, reason)
    assert out["fix"] and out["docs"].endswith(f"/errors/{reason}")
    return out


def causes(resp: httpx.Response) -> dict[str, dict[str, Any]]:
    """A 422 Invalid's causes by field."""
    out = failure(resp, 422, "Invalid")
    assert out["details"]["kind"] == "Pipeline"
    return {c["field"]: c for c in out["details"]["causes"]}


async def created(api: httpx.AsyncClient, namespace: str, data: dict[str, Any]) -> dict[str, Any]:
    resp = await api.post(pipelines(namespace), json=data)
    assert resp.status_code == 201, resp.text
    out: dict[str, Any] = resp.json()
    return out


@pytest.fixture
def stores(nc: NATS) -> dict[str, ObjectStore[Any]]:
    return stores_for(nc)


# -- create, read, list, watch -------------------------------------------------------------------------------


async def test_create_stores_the_pipeline_as_sent_with_status_reset(
    api: httpx.AsyncClient, unique: str
) -> None:
    sent = body("tune", maxCostUSD="50")
    sent["status"] = {"phase": "Succeeded"}  # users never write status: dropped
    resp = await api.post(pipelines(unique), json=sent)
    assert resp.status_code == 201, resp.text
    # No estimate service answers in this module: admitted without one, and told so.
    assert "no estimate" in resp.headers["warning"]
    obj = resp.json()
    assert (obj["kind"], obj["metadata"]["generation"], obj["metadata"]["namespace"]) == (
        "Pipeline",
        1,
        unique,
    )
    assert obj["metadata"]["uid"] and obj["metadata"]["creationTimestamp"]
    assert obj.get("status", {}) == {}
    # Stored as sent: the sweep controller defaults each child when it creates it.
    assert obj["spec"]["stages"] == stages()
    assert "backoffLimit" not in obj["spec"]["stages"][0]["template"]["job"]
    got = await api.get(pipelines(unique, "tune"))
    assert got.status_code == 200 and got.json() == obj
    assert (await api.get(pipelines(unique, "tune", "status"))).json() == obj


async def test_list_all_namespaces_and_label_selector(api: httpx.AsyncClient, unique: str) -> None:
    await created(api, unique, body("a"))
    labelled = body("b")
    labelled["metadata"]["labels"] = {"team": "vision"}
    await created(api, unique, labelled)
    listed = await api.get(pipelines(unique))
    assert listed.json()["kind"] == "PipelineList"
    assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["a", "b"]
    selected = await api.get(pipelines(unique), params={"labelSelector": "team=vision"})
    assert [i["metadata"]["name"] for i in selected.json()["items"]] == ["b"]
    everywhere = await api.get(f"{API}/pipelines")
    assert {"a", "b"} <= {
        i["metadata"]["name"] for i in everywhere.json()["items"] if i["metadata"]["namespace"] == unique
    }


async def test_generate_name_and_already_exists(api: httpx.AsyncClient, unique: str) -> None:
    data = body("x")
    data["metadata"] = {"generateName": "run-"}
    obj = await created(api, unique, data)
    assert obj["metadata"]["name"].startswith("run-")
    await created(api, unique, body("same"))
    failure(await api.post(pipelines(unique), json=body("same")), 409, "AlreadyExists")


@pytest_asyncio.fixture
async def served(app: FastAPI, api: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """The app on a real HTTP server: a watch is a stream, which the in-process transport buffers whole."""
    server = ApiServer(app, "127.0.0.1", 0)
    await server.start()
    try:
        headers = {"Authorization": api.headers["Authorization"]}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=10) as client:
            yield client
    finally:
        await server.stop()


async def test_watch_streams_added_and_modified(
    served: httpx.AsyncClient, api: httpx.AsyncClient, unique: str
) -> None:
    await created(api, unique, body("w"))
    async with served.stream("GET", pipelines(unique), params={"watch": "true"}) as resp:
        assert resp.status_code == 200
        lines = resp.aiter_lines()

        async def event() -> dict[str, Any]:
            async with asyncio.timeout(10):
                while not (line := await anext(lines)).strip():
                    pass
            out: dict[str, Any] = json.loads(line)
            return out

        first = await event()
        assert (first["type"], first["object"]["kind"], first["object"]["metadata"]["name"]) == (
            "ADDED",
            "Pipeline",
            "w",
        )
        patched = await api.patch(
            pipelines(unique, "w"), json={"spec": {"state": "Suspended"}}, headers=MERGE
        )
        assert patched.status_code == 200, patched.text
        second = await event()
        assert (second["type"], second["object"]["spec"]["state"]) == ("MODIFIED", "Suspended")


# -- update and patch ----------------------------------------------------------------------------------------


async def test_cap_and_state_may_change_and_status_is_kept(
    api: httpx.AsyncClient, unique: str, stores: dict[str, ObjectStore[Any]]
) -> None:
    await created(api, unique, body("p", maxCostUSD="10"))
    # The sweep controller's status, written straight into the store.
    status = PipelineStatus(phase="Running", stages=[StageStatus(name="prepare", phase="Succeeded")])
    await stores["pipelines"].mutate(
        unique, "p", lambda p: Pipeline(metadata=p.metadata, spec=p.spec, status=status)
    )
    current = (await api.get(pipelines(unique, "p"))).json()
    current["spec"]["maxCostUSD"] = "25"  # raising the cap resumes what the cap suspended
    current["status"] = {"phase": "Failed"}  # ignored: the stored status stays
    resp = await api.put(pipelines(unique, "p"), json=current)
    assert resp.status_code == 200, resp.text
    updated = resp.json()
    assert (updated["spec"]["maxCostUSD"], updated["metadata"]["generation"]) == ("25", 2)
    assert updated["status"]["phase"] == "Running" and updated["status"]["stages"][0]["phase"] == "Succeeded"
    for state in ("Suspended", "Running", "Cancelled"):
        patched = await api.patch(pipelines(unique, "p"), json={"spec": {"state": state}}, headers=MERGE)
        assert patched.status_code == 200, patched.text
    # Cancelled is final; a cap is raised, never lowered.
    found = causes(
        await api.patch(pipelines(unique, "p"), json={"spec": {"state": "Running"}}, headers=MERGE)
    )
    assert "Cancelled is final" in found["spec.state"]["message"]
    found = causes(await api.patch(pipelines(unique, "p"), json={"spec": {"maxCostUSD": "5"}}, headers=MERGE))
    assert "can only be raised" in found["spec.maxCostUSD"]["message"]


async def test_the_stages_are_immutable(api: httpx.AsyncClient, unique: str) -> None:
    await created(api, unique, body("p"))
    current = (await api.get(pipelines(unique, "p"))).json()
    current["spec"]["stages"][1]["template"]["sweep"]["maxParallel"] = 3
    found = causes(await api.put(pipelines(unique, "p"), json=current))
    cause = found["spec.stages[1].template.sweep.maxParallel"]
    assert cause["reason"] == "FieldValueForbidden"
    assert cause["message"].endswith("after create only spec.maxCostUSD, spec.state may change")
    patch = [{"op": "add", "path": "/spec/stages/-", "value": {"name": "extra", "template": {"job": job()}}}]
    found = causes(await api.patch(pipelines(unique, "p"), json=patch, headers=JSON_PATCH))
    assert "spec.stages" in found
    # The same stages in another form (the GPU as an object) are no change.
    current = (await api.get(pipelines(unique, "p"))).json()
    current["spec"]["stages"][0]["template"]["job"]["resources"]["gpu"] = {"type": ["H100"], "count": 1}
    current["metadata"]["labels"] = {"kept": "yes"}
    resp = await api.put(pipelines(unique, "p"), json=current)
    assert resp.status_code == 200, resp.text


async def test_server_side_apply_creates_then_merges(api: httpx.AsyncClient, unique: str) -> None:
    manifest = json.dumps(body("applied"))
    params = {"fieldManager": "kubectl", "force": "true"}
    first = await api.patch(pipelines(unique, "applied"), content=manifest, headers=APPLY, params=params)
    assert first.status_code == 201, first.text
    assert first.json()["metadata"]["managedFields"][0]["manager"] == "kubectl"
    again = json.loads(manifest)
    again["spec"]["maxCostUSD"] = "100"
    second = await api.patch(
        pipelines(unique, "applied"), content=json.dumps(again), headers=APPLY, params=params
    )
    assert second.status_code == 200, second.text
    assert second.json()["spec"]["maxCostUSD"] == "100"
    # kubectl apply without --server-side: a merge patch of what changed.
    third = await api.patch(
        pipelines(unique, "applied"), json={"metadata": {"labels": {"a": "b"}}}, headers=MERGE
    )
    assert third.status_code == 200 and third.json()["metadata"]["generation"] == 2


async def test_status_is_not_written_by_users(api: httpx.AsyncClient, unique: str) -> None:
    await created(api, unique, body("p"))
    failure(await api.put(pipelines(unique, "p", "status"), json=body("p")), 405, "MethodNotAllowed")


# -- 422s ----------------------------------------------------------------------------------------------------


async def test_a_cycle_is_named(api: httpx.AsyncClient, unique: str) -> None:
    data = body("loop")
    data["spec"]["stages"][0]["dependsOn"] = ["evaluate"]
    found = causes(await api.post(pipelines(unique), json=data))
    assert "prepare -> evaluate -> train -> grid -> prepare" in found["spec.stages[0].dependsOn"]["message"]
    failure(await api.get(pipelines(unique, "loop")), 404, "NotFound")


async def test_unknown_stages_and_undeclared_outputs(api: httpx.AsyncClient, unique: str) -> None:
    data = body("bad")
    data["spec"]["stages"][3]["dependsOn"] = ["train", "report"]
    data["spec"]["stages"][2]["template"]["job"]["inputs"] = [from_stage("nope")]
    data["spec"]["stages"][3]["template"]["job"]["inputs"] = [from_stage("train", output="weights")]
    found = causes(await api.post(pipelines(unique), json=data))
    assert found["spec.stages[3].dependsOn[1]"]["reason"] == "FieldValueNotFound"
    assert "'report': no stage of that name" in found["spec.stages[3].dependsOn[1]"]["message"]
    stage = found["spec.stages[2].template.job.inputs[0].fromStage.stage"]
    assert (stage["reason"], "'nope'" in stage["message"]) == ("FieldValueNotFound", True)
    output = found["spec.stages[3].template.job.inputs[0].fromStage.output"]
    assert output["reason"] == "FieldValueNotFound"
    assert "stage 'train' declares no such output (it has: 'model')" in output["message"]


async def test_from_stage_in_a_plain_job_is_refused(api: httpx.AsyncClient, unique: str) -> None:
    plain = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": job(inputs=[from_stage("a")]),
    }
    resp = await api.post(f"{API}/namespaces/{unique}/jobs", json=plain)
    out = failure(resp, 422, "Invalid")
    (cause,) = [c for c in out["details"]["causes"] if c["field"] == "spec.inputs[0].fromStage"]
    assert cause["reason"] == "FieldValueForbidden" and "Pipeline" in cause["message"]


async def test_stage_templates_are_held_to_the_job_and_sweep_rules(
    api: httpx.AsyncClient, unique: str
) -> None:
    data = body("rules")
    data["spec"]["stages"][0]["template"]["job"]["completions"] = 0
    data["spec"]["stages"][1]["template"]["sweep"]["maxParallel"] = 0
    data["spec"]["stages"][2]["template"] = {
        "job": job(),
        "sweep": data["spec"]["stages"][1]["template"]["sweep"],
    }
    found = causes(await api.post(pipelines(unique), json=data))
    assert {
        "spec.stages[0].template.job.completions",
        "spec.stages[1].template.sweep.maxParallel",
        "spec.stages[2].template",
    } <= set(found)


# -- reference checks on every stage -------------------------------------------------------------------------


async def test_stage_references_are_checked_at_their_stage(
    api: httpx.AsyncClient, unique: str, stores: dict[str, ObjectStore[Any]]
) -> None:
    data = body("refs")
    data["spec"]["stages"][0]["template"]["job"]["volumes"] = [
        {"volume": "missing", "mountPath": "/data", "readOnly": True}
    ]
    sweep_spec = data["spec"]["stages"][1]["template"]["sweep"]["template"]["spec"]
    sweep_spec["source"] = {"blob": "sha256:" + "cd" * 32}
    sweep_spec["serviceAccountName"] = "trainer"
    found = causes(await api.post(pipelines(unique), json=data))
    assert found["spec.stages[0].template.job.volumes[0].volume"]["reason"] == "FieldValueNotFound"
    assert found["spec.stages[1].template.sweep.template.spec.source.blob"]["reason"] == "FieldValueNotFound"
    # This gateway has no URL to give runs, so any ServiceAccount is refused (test_service_accounts.py).
    assert "spec.stages[1].template.sweep.template.spec.serviceAccountName" in found
    failure(await api.get(pipelines(unique, "refs")), 404, "NotFound")


async def test_read_only_volumes_are_pinned_per_stage_and_kept_on_update(
    api: httpx.AsyncClient, unique: str, stores: dict[str, ObjectStore[Any]]
) -> None:
    revs = [
        VolumeRevision(i, f"sha256:{i:064x}", 10, "a@example.com", "2026-01-01T00:00:00Z") for i in (1, 2)
    ]
    volume = Volume(
        metadata=ObjectMeta(name="data", namespace=unique), status=VolumeStatus(revisions=revs, latest=2)
    )
    await stores["volumes"].create(volume)
    data = body("pins")
    mount = {"volume": "data", "mountPath": "/data", "readOnly": True}
    data["spec"]["stages"][3]["template"]["job"]["volumes"] = [mount]
    obj = await created(api, unique, data)
    assert obj["spec"]["stages"][3]["template"]["job"]["volumes"][0]["revision"] == 2
    # Re-applying the manifest (no revision) keeps the pin: no change to the immutable stages.
    data["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
    data["spec"]["maxCostUSD"] = "9"
    resp = await api.put(pipelines(unique, "pins"), json=data)
    assert resp.status_code == 200, resp.text
    assert resp.json()["spec"]["stages"][3]["template"]["job"]["volumes"][0]["revision"] == 2


async def test_a_volume_a_stage_mounts_is_in_use_and_its_blob_referenced(
    api: httpx.AsyncClient, unique: str, stores: dict[str, ObjectStore[Any]]
) -> None:
    revs = [VolumeRevision(1, f"sha256:{1:064x}", 10, "a@example.com", "2026-01-01T00:00:00Z")]
    volume = Volume(
        metadata=ObjectMeta(name="data", namespace=unique), status=VolumeStatus(revisions=revs, latest=1)
    )
    await stores["volumes"].create(volume)
    data = body("user")
    data["spec"]["stages"][3]["template"]["job"]["volumes"] = [
        {"volume": "data", "mountPath": "/data", "readOnly": True}
    ]
    await created(api, unique, data)
    # The stage has not run (nothing has): the Volume is in use all the same, as for an unfinished Job.
    out = failure(await api.delete(f"{API}/namespaces/{unique}/volumes/data"), 409, "Conflict")
    assert "pipeline/user" in out["message"]
    # A blob only a stage names is referenced: the reaper keeps it.
    stored: Pipeline = await stores["pipelines"].get(unique, "user")
    digest = "sha256:" + "ef" * 32
    spec = stored.spec.stages[1].template.sweep
    assert spec is not None
    spec.template.spec.source = Source(blob=digest)
    assert referenced([], [], [], [stored]) == {digest}


# -- deletion cascade ----------------------------------------------------------------------------------------


def owned_by(kind: str, name: str, uid: str | None) -> list[OwnerReference]:
    return [OwnerReference(api_version="nodus.dev/v1", kind=kind, name=name, uid=uid or "", controller=True)]


async def children(
    stores: dict[str, ObjectStore[Any]], namespace: str, pipeline: dict[str, Any]
) -> tuple[str, str, str]:
    """A Job stage, a Sweep stage and one cell of it, as the sweep controller creates them; returns their
    names (the Job, the Sweep, the cell)."""
    name = pipeline["metadata"]["name"]
    labels = {PIPELINE_LABEL: name}
    spec = JobSpec(image="x", command=["true"])
    prepare = Job(
        metadata=ObjectMeta(
            name=f"{name}-prepare",
            namespace=namespace,
            labels={**labels, STAGE_LABEL: "prepare"},
            owner_references=owned_by("Pipeline", name, pipeline["metadata"]["uid"]),
        ),
        spec=spec,
    )
    await stores["jobs"].create(prepare)
    grid: Sweep = await stores["sweeps"].create(
        Sweep(
            metadata=ObjectMeta(
                name=f"{name}-grid",
                namespace=namespace,
                labels={**labels, STAGE_LABEL: "grid"},
                owner_references=owned_by("Pipeline", name, pipeline["metadata"]["uid"]),
            ),
            spec=SweepSpec(),
        )
    )
    cell = Job(
        metadata=ObjectMeta(
            name=f"{name}-grid-0",
            namespace=namespace,
            owner_references=owned_by("Sweep", grid.metadata.name or "", grid.metadata.uid),
        ),
        spec=spec,
    )
    await stores["jobs"].create(cell)
    return f"{name}-prepare", f"{name}-grid", f"{name}-grid-0"


async def names(store: ObjectStore[Any], namespace: str) -> set[str]:
    return {o.metadata.name for o in (await store.list(namespace)).items}


async def test_foreground_delete_removes_children_and_cells(
    api: httpx.AsyncClient, unique: str, stores: dict[str, ObjectStore[Any]]
) -> None:
    pipeline = await created(api, unique, body("gone"))
    assert await children(stores, unique, pipeline) == ("gone-prepare", "gone-grid", "gone-grid-0")
    await stores["jobs"].create(
        Job(metadata=ObjectMeta(name="unrelated", namespace=unique), spec=JobSpec(image="x"))
    )
    resp = await api.delete(pipelines(unique, "gone"), params={"propagationPolicy": "Foreground"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["metadata"]["uid"] == pipeline["metadata"]["uid"]
    assert await names(stores["jobs"], unique) == {"unrelated"}
    assert await names(stores["sweeps"], unique) == set()
    failure(await api.get(pipelines(unique, "gone")), 404, "NotFound")


async def test_orphan_delete_keeps_children_without_the_reference(
    api: httpx.AsyncClient, unique: str, stores: dict[str, ObjectStore[Any]]
) -> None:
    pipeline = await created(api, unique, body("left"))
    job_child, sweep_child, cell = await children(stores, unique, pipeline)
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"}
    resp = await api.request("DELETE", pipelines(unique, "left"), json=options)
    assert resp.status_code == 200, resp.text
    assert (await stores["jobs"].get(unique, job_child)).metadata.owner_references == []
    assert (await stores["sweeps"].get(unique, sweep_child)).metadata.owner_references == []
    # The Sweep still owns its cell: only the Pipeline's references go.
    assert (await stores["jobs"].get(unique, cell)).metadata.owner_references[0].kind == "Sweep"


async def test_background_delete_leaves_collection_to_the_controller(
    api: httpx.AsyncClient, unique: str, stores: dict[str, ObjectStore[Any]]
) -> None:
    pipeline = await created(api, unique, body("bg"))
    job_child, _, _ = await children(stores, unique, pipeline)
    assert (await api.delete(pipelines(unique, "bg"))).status_code == 200
    # Still owned by the deleted Pipeline's uid: the sweep controller collects it (not the gateway).
    ref = (await stores["jobs"].get(unique, job_child)).metadata.owner_references[0]
    assert (ref.kind, ref.uid) == ("Pipeline", pipeline["metadata"]["uid"])


async def test_deletecollection_cascades_too(
    api: httpx.AsyncClient, unique: str, stores: dict[str, ObjectStore[Any]]
) -> None:
    for name in ("one", "two"):
        await children(stores, unique, await created(api, unique, body(name)))
    resp = await api.delete(pipelines(unique), params={"propagationPolicy": "Foreground"})
    assert resp.status_code == 200, resp.text
    assert sorted(i["metadata"]["name"] for i in resp.json()["items"]) == ["one", "two"]
    assert await names(stores["jobs"], unique) == set()
    assert await names(stores["sweeps"], unique) == set()


# -- discovery, OpenAPI, Tables ------------------------------------------------------------------------------


async def test_discovery_lists_pipelines_with_short_name_pl(api: httpx.AsyncClient) -> None:
    resources = {r["name"]: r for r in (await api.get(API)).json()["resources"]}
    pl = resources["pipelines"]
    assert (pl["singularName"], pl["kind"], pl["namespaced"], pl["shortNames"]) == (
        "pipeline",
        "Pipeline",
        True,
        ["pl"],
    )
    assert pl["categories"] == resources["sweeps"]["categories"] == ["all", "nodus"]
    assert pl["verbs"] == resources["sweeps"]["verbs"]
    assert resources["pipelines/status"]["verbs"] == resources["sweeps/status"]["verbs"]


async def test_openapi_documents_the_kind(api: httpx.AsyncClient) -> None:
    v3 = (await api.get("/openapi/v3/apis/nodus.dev/v1")).json()
    schemas = v3["components"]["schemas"]
    assert schemas["Pipeline"]["x-kubernetes-group-version-kind"] == [
        {"group": "nodus.dev", "kind": "Pipeline", "version": "v1"}
    ]
    assert {"dependsOn", "template", "fromBest", "onFailure"} <= set(schemas["Stage"]["properties"])
    item = v3["paths"]["/apis/nodus.dev/v1/namespaces/{namespace}/pipelines/{name}"]
    assert {"get", "put", "patch", "delete"} <= set(item)
    v2 = (await api.get("/openapi/v2")).json()
    assert "/apis/nodus.dev/v1/namespaces/{namespace}/pipelines" in v2["paths"]
    assert v2["definitions"]["PipelineList"]["x-kubernetes-group-version-kind"][0]["kind"] == "PipelineList"


def test_table_columns() -> None:
    obj = {
        "metadata": {"name": "tune", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"stages": [{"name": s} for s in ("a", "b", "c", "d")]},
        "status": {
            "phase": "Running",
            "cost": {"totalUSD": "12.50"},
            "stages": [
                {"name": "a", "phase": "Succeeded"},
                {"name": "b", "phase": "Succeeded"},
                {"name": "c", "phase": "Running"},
            ],
        },
    }
    table = tabling.to_table("Pipeline", [obj, {"metadata": {"name": "new"}, "spec": {"stages": [{}]}}])
    columns = [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]
    assert columns == ["Name", "Stages", "Phase", "Cost", "Age"]
    assert table["rows"][0]["cells"][:4] == ["tune", "2/4", "Running", "$12.50"]
    assert table["rows"][1]["cells"][:4] == ["new", "0/1", "Pending", "-"]


async def test_kubectl_get_gets_a_table(api: httpx.AsyncClient, unique: str) -> None:
    await created(api, unique, body("tabled"))
    resp = await api.get(pipelines(unique), headers=TABLE)
    assert resp.status_code == 200, resp.text
    table = resp.json()
    assert table["kind"] == "Table"
    assert table["rows"][0]["cells"][:4] == ["tabled", "0/4", "Pending", "-"]
    one = await api.get(pipelines(unique, "tabled"), headers=TABLE)
    assert one.json()["rows"][0]["object"]["metadata"]["name"] == "tabled"
