"""Pipelines end to end (issue #22): every service as its own process, https with the local CA, SeaweedFS
for outputs, two agents with the process runtime.

``flow`` is the issue's 4-stage Pipeline:

* ``prepare`` writes a dataset as its output ``data``;
* ``grid``, a Sweep of 6 cells over ``LR``, reads ``data`` (fromStage) and reports a throughput that grows
  with LR, so its best cell by throughput is LR=6;
* ``train`` takes that best cell (fromBest by Throughput): its ``NODUS_PARAM_LR`` is 6; it writes ``model``;
* ``evaluate`` reads train's ``model`` (fromStage) and prints it.

``capped`` is one stage under a Pipeline cap of 0.002 USD: billing suspends it with MaxCostReached (the
Pipeline says Suspended), raising the Pipeline's maxCostUSD resumes it, and it ends Succeeded.
"""

from __future__ import annotations

import os
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from nodus_testing.localstack import Stack, agent
from nodus_testing.waiting import eventually
from tests.e2e.test_service_accounts import wake

pytestmark = pytest.mark.slow

NS = "pl-e2e"
BASE = f"/apis/nodus.dev/v1/namespaces/{NS}"
PY = sys.executable
L4 = "L4:1"

PREPARE = """
import os
folder = os.path.join(os.environ["NODUS_OUTPUTS"], "data")
os.makedirs(folder, exist_ok=True)
open(os.path.join(folder, "rows.txt"), "w").write("1\\n2\\n3\\n")
print("prepared", flush=True)
"""
GRID = """
import json, os
rows = open(os.path.join(os.environ["NODUS_INPUTS"], "data", "rows.txt")).read().split()
lr = float(os.environ["NODUS_PARAM_LR"])
with open(os.environ["NODUS_REPORT"], "a") as report:
    report.write(json.dumps({"unitsPerSecond": lr * 10 * len(rows)}) + "\\n")
print("cell", lr, "rows", len(rows), flush=True)
"""
TRAIN = """
import os
folder = os.path.join(os.environ["NODUS_OUTPUTS"], "model")
os.makedirs(folder, exist_ok=True)
open(os.path.join(folder, "model.txt"), "w").write("lr=" + os.environ["NODUS_PARAM_LR"])
print("trained with lr", os.environ["NODUS_PARAM_LR"], flush=True)
"""
EVALUATE = """
import os
print("evaluated", open(os.path.join(os.environ["NODUS_INPUTS"], "model", "model.txt")).read(), flush=True)
"""
WAIT = """
import os
print("waiting", flush=True)
open(os.environ["GO"]).read()  # blocks until the test writes to the FIFO
print("done", flush=True)
"""


def job(text: str, **spec: Any) -> dict[str, Any]:
    return {"image": "python:3.11-slim", "command": [PY, "-c", text], "resources": {"gpu": L4}, **spec}


def flow() -> dict[str, Any]:
    data_in = [{"name": "data", "fromStage": {"stage": "prepare", "output": "data"}}]
    model_in = [{"name": "model", "fromStage": {"stage": "train", "output": "model"}}]
    data_out = [{"name": "data", "path": "/nodus/outputs/data"}]
    model_out = [{"name": "model", "path": "/nodus/outputs/model"}]
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Pipeline",
        "metadata": {"name": "flow"},
        "spec": {
            "maxCostUSD": "5",
            "stages": [
                {
                    "name": "prepare",
                    "template": {"job": job(PREPARE, outputs=data_out)},
                },
                {
                    "name": "grid",
                    "dependsOn": ["prepare"],
                    "template": {
                        "sweep": {
                            "maxParallel": 2,
                            "matrix": {"params": {"LR": ["1", "2", "3", "4", "5", "6"]}},
                            "template": {"spec": job(GRID, inputs=data_in)},
                        }
                    },
                },
                {
                    "name": "train",
                    "dependsOn": ["grid"],
                    "fromBest": {"stage": "grid", "by": "Throughput"},
                    "template": {"job": job(TRAIN, outputs=model_out)},
                },
                {
                    "name": "evaluate",
                    "dependsOn": ["train"],
                    "template": {"job": job(EVALUATE, inputs=model_in)},
                },
            ],
        },
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    s = Stack(
        tmp_path_factory.mktemp("stack"),
        agents=[agent("l4-p", "l4-x1-us", "us", "L4", "24Gi"), agent("l4-q", "l4-x1-us", "us", "L4", "24Gi")],
        # A small cap must bite within seconds: billing meters and looks ahead in seconds here.
        env={"NODUS_METER_TICK_S": "1", "NODUS_HOLD_WINDOW_S": "6", "NODUS_STOP_MARGIN_S": "1"},
    )
    try:
        yield s.start(deadline_s=120)
    finally:
        s.stop()


@pytest_asyncio.fixture
async def http(stack: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=stack["NODUS_URL"],
        headers={"Authorization": f"Bearer {stack['NODUS_TOKEN']}"},
        timeout=30,
        verify=ssl.create_default_context(cafile=stack["NODUS_CA"]),
    ) as c:
        yield c


async def pipeline(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
    r = await http.get(f"{BASE}/pipelines/{name}")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def ended(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """The Pipeline once it ended and its cost is final (written after the phase)."""

    async def done() -> dict[str, Any] | None:
        p = await pipeline(http, name)
        st = p.get("status", {})
        final = (st.get("cost") or {}).get("final") is True
        return p if st.get("phase") in ("Succeeded", "Failed", "Cancelled") and final else None

    return await eventually(done, deadline_s=240, interval_s=0.5, message=f"pipeline {name} never ended")


async def test_four_stages_run_to_succeeded_with_the_best_cell_and_outputs_flowing_on(
    http: httpx.AsyncClient,
) -> None:
    r = await http.post(f"{BASE}/pipelines", json=flow())
    assert r.status_code == 201, r.text
    done = await ended(http, "flow")
    st = done["status"]
    assert st["phase"] == "Succeeded", st
    stages = {s["name"]: s for s in st["stages"]}
    assert [s["name"] for s in st["stages"]] == ["prepare", "grid", "train", "evaluate"]
    assert all(s["phase"] == "Succeeded" for s in stages.values()), stages
    assert stages["grid"]["kind"] == "Sweep" and stages["grid"]["object"] == "flow-grid"
    best = stages["train"]["fromBest"]
    assert best["params"] == {"LR": "6"} and best["by"] == "Throughput"
    log = (await http.get(f"{BASE}/jobs/flow-evaluate/log")).text
    assert "evaluated lr=6" in log, log
    assert "trained with lr 6" in (await http.get(f"{BASE}/jobs/flow-train/log")).text
    # Each child once, owned by the Pipeline; the Sweep's six cells by the Sweep.
    jobs = (await http.get(f"{BASE}/jobs")).json()["items"]
    names = sorted(j["metadata"]["name"] for j in jobs)
    assert names == sorted(
        ["flow-prepare", "flow-train", "flow-evaluate", *(f"flow-grid-{i}" for i in range(6))]
    )
    owners = {j["metadata"]["name"]: j["metadata"]["ownerReferences"][0]["kind"] for j in jobs}
    assert owners["flow-train"] == "Pipeline" and owners["flow-grid-0"] == "Sweep"
    cost = st["cost"]
    assert cost["final"] is True and float(cost["totalUSD"]) > 0
    assert cost["limitUSD"] == "5"


async def test_the_shared_cap_suspends_the_pipeline_and_raising_it_resumes(
    http: httpx.AsyncClient, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    os.mkfifo(go)
    body = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Pipeline",
        "metadata": {"name": "capped"},
        "spec": {
            "maxCostUSD": "0.002",
            "stages": [
                {
                    "name": "long",
                    "template": {"job": job(WAIT, env=[{"name": "GO", "value": str(go)}], backoffLimit=0)},
                }
            ],
        },
    }
    r = await http.post(f"{BASE}/pipelines", json=body)
    assert r.status_code == 201, r.text

    async def suspended() -> dict[str, Any] | None:
        p = await pipeline(http, "capped")
        st = p.get("status", {})
        return p if (st.get("phase"), st.get("reason")) == ("Suspended", "MaxCostReached") else None

    await eventually(suspended, deadline_s=90, interval_s=0.5, message="the cap never suspended the pipeline")
    job_now = (await http.get(f"{BASE}/jobs/capped-long")).json()
    assert job_now["status"]["phase"] == "Suspended"

    patch = {"spec": {"maxCostUSD": "1"}}
    r = await http.patch(
        f"{BASE}/pipelines/capped", json=patch, headers={"Content-Type": "application/merge-patch+json"}
    )
    assert r.status_code == 200, r.text

    async def running_again() -> bool:
        attempts = (
            await http.get(f"{BASE}/attempts", params={"labelSelector": "nodus.dev/job=capped-long"})
        ).json()
        return any(a["status"].get("phase") == "Running" for a in attempts["items"]) and wake(go)

    await eventually(running_again, deadline_s=90, interval_s=0.5, message="raising the cap never resumed it")
    done = await ended(http, "capped")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert float(done["status"]["cost"]["totalUSD"]) <= 1
