"""A Sweep's results through the gateway (issue #8): ``GET .../sweeps/{name}/results`` as JSON and CSV.

The Sweep is created through the API; its status is then written straight into the ``sweeps`` bucket
with ``ObjectStore(nc, "sweeps", Sweep)``, as the sweep controller writes it (cells, best, cost, phase),
and the results are read back: every cell in index order with ``costPerMillionUnits``, the best cells,
CSV by ``format=csv`` and by ``Accept: text/csv``, who may read them, and the errors as metav1.Status.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for
from nodus_kit.storing import ObjectStore
from nodus_schema import Sweep
from nodus_schema.costs import Cost
from nodus_schema.results import results_csv, results_of
from nodus_schema.sweeps import SweepBest, SweepCell, SweepStatus

ADMIN_TOKEN = "results-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
RESULTS_PATH = "/apis/nodus.dev/v1/namespaces/{namespace}/sweeps/{name}/results"


def sweep_body(name: str) -> dict[str, Any]:
    """Two GPUs × two learning rates × one batch size: four cells."""
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name},
        "spec": {
            "matrix": {"gpu": ["H100:1", "A100:1"], "params": {"LR": ["0.1", "0.01"], "BATCH": ["32"]}},
            "template": {"spec": {"image": "busybox", "command": ["true"], "resources": {"gpu": "H100:1"}}},
        },
    }


def cell(index: int, gpu: str, lr: str, phase: str, **measured: Any) -> SweepCell:
    return SweepCell(
        index=index,
        repetition=0,
        gpu=gpu,
        params={"BATCH": "32", "LR": lr},
        object=f"lr-{index}",
        phase=phase,
        **measured,
    )


STATUS = SweepStatus(
    phase="Failed",
    reason="CellsFailed",
    best=SweepBest(by_cost=2, by_throughput=0),
    cost=Cost(total_usd="1.150000"),
    cells=[
        cell(0, "H100:1", "0.1", "Succeeded", wall_seconds=60, units_per_second="812.5", cost_usd="0.42"),
        cell(1, "H100:1", "0.01", "Failed", wall_seconds=5, cost_usd="0.03"),
        cell(2, "A100:1", "0.1", "Succeeded", wall_seconds=120, units_per_second="300", cost_usd="0.31"),
        cell(3, "A100:1", "0.01", "Running", cost_usd="0.39"),
    ],
)


async def write_status(nc: NATS, namespace: str, name: str, status: SweepStatus) -> Sweep:
    """What the sweep controller does: replace the Sweep's status, compare-and-set."""
    store: ObjectStore[Sweep] = ObjectStore(nc, "sweeps", Sweep)
    return await store.mutate(namespace, name, lambda s: msgspec.structs.replace(s, status=status))


async def create(api: httpx.AsyncClient, namespace: str, name: str = "lr") -> None:
    resp = await api.post(f"{V1}/namespaces/{namespace}/sweeps", json=sweep_body(name))
    assert resp.status_code == 201, resp.text


def path(namespace: str, name: str = "lr") -> str:
    return RESULTS_PATH.format(namespace=namespace, name=name)


def assert_status(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["code"], body["reason"]) == ("Status", code, reason)
    assert body["fix"] and body["docs"].endswith(f"/errors/{reason}")
    return body


# ---------------------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------------------


async def test_results_as_json(api: httpx.AsyncClient, nc: NATS, unique: str) -> None:
    await create(api, unique)
    stored = await write_status(nc, unique, "lr", STATUS)
    resp = await api.get(path(unique))
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert body["apiVersion"] == "nodus.dev/v1" and body["kind"] == "SweepResults"
    assert body["metadata"] == {"name": "lr", "namespace": unique, "uid": stored.metadata.uid}
    assert (body["phase"], body["reason"], body["totalUSD"]) == ("Failed", "CellsFailed", "1.150000")
    assert body["params"] == ["BATCH", "LR"]
    assert body["best"] == {"byCost": 2, "byThroughput": 0}
    assert [c["index"] for c in body["cells"]] == [0, 1, 2, 3]
    assert body["cells"][0] == {
        "index": 0,
        "repetition": 0,
        "object": "lr-0",
        "gpu": "H100:1",
        "region": None,
        "params": {"BATCH": "32", "LR": "0.1"},
        "phase": "Succeeded",
        "wallSeconds": 60,
        "unitsPerSecond": "812.5",
        "costUSD": "0.42",
        # 0.42 / (812.5 × 60) × 1e6 = 8.6153846…, half up to the micro-dollar.
        "costPerMillionUnits": "8.615385",
        "best": ["byThroughput"],
    }
    # 0.31 / (300 × 120) × 1e6 = 8.6111…
    assert body["cells"][2]["costPerMillionUnits"] == "8.611111"
    assert body["cells"][2]["best"] == ["byCost"]
    # Not defined without a throughput: every key is still there, null.
    assert body["cells"][1]["costPerMillionUnits"] is None and body["cells"][1]["unitsPerSecond"] is None
    assert body["cells"][3]["wallSeconds"] is None and body["cells"][3]["best"] == []
    # Exactly what the pure function makes of the stored Sweep.
    assert body == msgspec.to_builtins(results_of(stored))


async def test_results_before_the_controller_wrote_any_cell(api: httpx.AsyncClient, unique: str) -> None:
    await create(api, unique)
    body = (await api.get(path(unique))).json()
    assert body["cells"] == [] and body["best"] == {"byCost": None, "byThroughput": None}
    # The matrix's parameter names are columns already.
    assert body["params"] == ["BATCH", "LR"]
    resp = await api.get(path(unique), params={"format": "csv"})
    assert resp.text == (
        "index,repetition,object,gpu,region,BATCH,LR,phase,wallSeconds,unitsPerSecond,costUSD,"
        "costPerMillionUnits,best\r\n"
    )


# ---------------------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------------------


EXPECTED_CSV = [
    [
        "index",
        "repetition",
        "object",
        "gpu",
        "region",
        "BATCH",
        "LR",
        "phase",
        "wallSeconds",
        "unitsPerSecond",
        "costUSD",
        "costPerMillionUnits",
        "best",
    ],
    [
        "0",
        "0",
        "lr-0",
        "H100:1",
        "",
        "32",
        "0.1",
        "Succeeded",
        "60",
        "812.5",
        "0.42",
        "8.615385",
        "byThroughput",
    ],
    ["1", "0", "lr-1", "H100:1", "", "32", "0.01", "Failed", "5", "", "0.03", "", ""],
    ["2", "0", "lr-2", "A100:1", "", "32", "0.1", "Succeeded", "120", "300", "0.31", "8.611111", "byCost"],
    ["3", "0", "lr-3", "A100:1", "", "32", "0.01", "Running", "", "", "0.39", "", ""],
]


async def test_results_as_csv_by_format_and_by_accept(api: httpx.AsyncClient, nc: NATS, unique: str) -> None:
    await create(api, unique)
    stored = await write_status(nc, unique, "lr", STATUS)
    by_format = await api.get(path(unique), params={"format": "csv"})
    assert by_format.status_code == 200, by_format.text
    assert by_format.headers["content-type"].startswith("text/csv")
    assert by_format.headers["content-disposition"] == 'attachment; filename="lr-results.csv"'
    assert list(csv.reader(io.StringIO(by_format.text))) == EXPECTED_CSV
    assert by_format.text.endswith("\r\n") and by_format.text == results_csv(results_of(stored))

    by_accept = await api.get(path(unique), headers={"Accept": "text/csv, application/json"})
    assert by_accept.headers["content-type"].startswith("text/csv") and by_accept.text == by_format.text
    # JSON listed first wins; format=json wins over any Accept.
    json_first = await api.get(path(unique), headers={"Accept": "application/json, text/csv"})
    assert json_first.json()["kind"] == "SweepResults"
    forced = await api.get(path(unique), params={"format": "json"}, headers={"Accept": "text/csv"})
    assert forced.json()["kind"] == "SweepResults"


# ---------------------------------------------------------------------------------------------------------
# Errors and who may read
# ---------------------------------------------------------------------------------------------------------


async def test_a_missing_sweep_is_a_not_found_status(api: httpx.AsyncClient, unique: str) -> None:
    body = assert_status(await api.get(path(unique, "nope")), 404, "NotFound")
    assert body["message"] == 'sweeps.nodus.dev "nope" not found'
    assert body["details"]["name"] == "nope" and body["details"]["kind"] == "sweeps"
    assert f"nodus get sweeps -n {unique}" in body["fix"]
    # A name no Sweep could ever have is missing too (not a 400 that tells names apart).
    assert_status(await api.get(path(unique, "Not_A_Name")), 404, "NotFound")


async def test_a_format_nobody_serves_is_a_bad_request(api: httpx.AsyncClient, unique: str) -> None:
    await create(api, unique)
    body = assert_status(await api.get(path(unique), params={"format": "xlsx"}), 400, "BadRequest")
    assert "format=csv" in body["fix"]


@dataclass
class Project:
    name: str
    viewer: httpx.AsyncClient
    stranger: httpx.AsyncClient
    admin: httpx.AsyncClient


def client(app: FastAPI, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {token}"},
    )


async def mint(admin: httpx.AsyncClient, principal: str, roles: dict[str, str]) -> str:
    resp = await admin.post(f"{V1}/tokens", json={"spec": {"principal": principal, "roles": roles}})
    assert resp.status_code == 201, resp.text
    secret: str = resp.json()["secret"]
    return secret


@pytest_asyncio.fixture
async def project(nc: NATS, unique: str) -> AsyncIterator[Project]:
    """A gateway with projects and tokens: the project ``unique`` with a viewer, and a stranger (an editor
    of another project)."""
    principals = Principals(nc, pepper=b"results-pepper", cache_ttl_s=0.2)
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals)
    other = f"o-{unique}"
    async with client(app, ADMIN_TOKEN) as admin:
        for name in (unique, other):
            resp = await admin.post(f"{V1}/projects", json={"metadata": {"name": name}})
            assert resp.status_code == 201, resp.text
        viewer_token = await mint(admin, "vera", {unique: "viewer"})
        stranger_token = await mint(admin, "sam", {other: "editor"})
        async with client(app, viewer_token) as viewer, client(app, stranger_token) as stranger:
            yield Project(unique, viewer, stranger, admin)


async def test_a_viewer_reads_the_results_and_a_stranger_sees_nothing(project: Project, nc: NATS) -> None:
    await create(project.admin, project.name)
    await write_status(nc, project.name, "lr", STATUS)
    read = await project.viewer.get(path(project.name))
    assert read.status_code == 200 and read.json()["best"]["byCost"] == 2
    as_csv = await project.viewer.get(path(project.name), params={"format": "csv"})
    assert as_csv.status_code == 200 and as_csv.text.startswith("index,")
    # Without a role in the project the Sweep is hidden: the same 404 as a Sweep that does not exist.
    hidden = assert_status(await project.stranger.get(path(project.name)), 404, "NotFound")
    missing = assert_status(await project.viewer.get(path(project.name, "nope")), 404, "NotFound")
    assert hidden["message"] == missing["message"].replace("nope", "lr")


# ---------------------------------------------------------------------------------------------------------
# Documented
# ---------------------------------------------------------------------------------------------------------


async def nodus_document(api: httpx.AsyncClient) -> dict[str, Any]:
    index = (await api.get("/openapi/v3")).json()
    url = index["paths"]["apis/nodus.dev/v1"]["serverRelativeURL"]
    doc: dict[str, Any] = (await api.get(url)).json()
    return doc


def unknown_keys(value: Any, schema: dict[str, Any], schemas: dict[str, Any]) -> list[str]:
    """Keys of ``value`` its schema does not declare, and required keys it lacks, all the way down."""
    if "$ref" in schema:
        return unknown_keys(value, schemas[schema["$ref"].rsplit("/", 1)[-1]], schemas)
    found: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        found += [f"missing {k}" for k in schema.get("required", []) if k not in value]
        for k, v in value.items():
            found += [f"unknown {k}"] if k not in props else unknown_keys(v, props[k], schemas)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            found += unknown_keys(item, schema["items"], schemas)
    return found


async def test_the_route_is_documented_as_sweep_results_or_csv(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    doc = await nodus_document(api)
    op = doc["paths"][RESULTS_PATH]["get"]
    assert op["operationId"] == "readNodusDevV1NamespacedSweepResults"
    assert op["x-nodus-response-kind"] == "SweepResults"
    content = op["responses"]["200"]["content"]
    assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/SweepResults"}
    assert content["text/csv"]["schema"] == {"type": "string"}
    assert "format" in {p["name"] for p in op["parameters"]}
    schemas = doc["components"]["schemas"]
    assert schemas["SweepResults"]["x-kubernetes-group-version-kind"] == [
        {"group": "nodus.dev", "kind": "SweepResults", "version": "v1"}
    ]
    # Field docs come from the source, as for every other kind.
    assert "micro-dollar" in schemas["ResultCell"]["properties"]["costPerMillionUnits"]["description"]
    await create(api, unique)
    await write_status(nc, unique, "lr", STATUS)
    body = (await api.get(path(unique))).json()
    assert unknown_keys(body, {"$ref": "#/components/schemas/SweepResults"}, schemas) == []
