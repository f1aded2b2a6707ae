"""The walking skeleton end to end: every service as its own process, as production runs them.

A Sweep of 2 GPU types x 3 speeds goes in through the gateway's HTTP API; the sweep controller fans it
out into cell Jobs, the scheduler places them on node agents (fake GPUs, real processes), the agents run
the program with the env contract and report its throughput, billing charges each run at its offering's
rate, and the Sweep reports cells, costs and the best cells. The speed 0 cells exit 1: they fail, and the
Sweep ends Failed/CellsFailed once the rest have finished.
"""

from __future__ import annotations

import ssl
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodus_testing.localstack import Stack, agent
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow

PROGRAM = """
import json, os, sys
speed = int(os.environ["NODUS_PARAM_SPEED"])
assert os.environ["NODUS_INDEX"] == os.environ["JOB_COMPLETION_INDEX"] == "0", "index contract"
assert os.environ["NODUS_JOB"].rsplit("-", 1)[1].isdigit(), "job contract: <sweep>-<index>"
if speed == 0:
    print("speed 0 cannot work", file=sys.stderr)
    sys.exit(1)
with open(os.environ["NODUS_REPORT"], "a") as f:
    f.write(json.dumps({"unitsPerSecond": speed * 100.5}) + "\\n")
"""

SWEEP: dict[str, Any] = {
    "apiVersion": "nodus.dev/v1",
    "kind": "Sweep",
    "metadata": {"name": "skeleton"},
    "spec": {
        "maxParallel": 3,
        "matrix": {"gpu": ["H100:1", "L4:1"], "params": {"SPEED": ["1", "0", "4"]}},
        "template": {
            "kind": "Job",
            "spec": {
                "image": "python:3.11-slim",
                "command": [sys.executable, "-c", PROGRAM],
                "backoffLimit": 0,
            },
        },
    },
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict[str, str]]]:
    root: Path = tmp_path_factory.mktemp("stack")
    s = Stack(
        root,
        agents=[
            agent("h100-a", "h100-sxm-80g-x1-us", "us", "H100-SXM-80G", "80Gi"),
            agent("h100-b", "h100-pcie-80g-x1-us", "us", "H100-PCIE-80G", "80Gi"),
            agent("l4-a", "l4-x1-eu", "eu", "L4", "24Gi"),
        ],
    )
    try:
        values = s.start(deadline_s=90)
        yield s, values
    finally:
        s.stop()


def client(values: dict[str, str]) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=values["NODUS_URL"],
        headers={"Authorization": f"Bearer {values['NODUS_TOKEN']}"},
        timeout=10,
        verify=ssl.create_default_context(cafile=values["NODUS_CA"]),  # the stack's own CA
    )


async def test_a_sweep_runs_end_to_end(stack: tuple[Stack, dict[str, str]]) -> None:
    _, values = stack
    base = "/apis/nodus.dev/v1/namespaces/e2e"
    async with client(values) as http:
        created = await http.post(f"{base}/sweeps", json=SWEEP)
        assert created.status_code == 201, created.text

        async def finished() -> dict[str, Any] | None:
            sweep = (await http.get(f"{base}/sweeps/skeleton")).json()
            st = sweep.get("status", {})
            cells = st.get("cells", [])
            # The cost is final once every run of every cell is charged (a cell may show "0.00" before).
            final = (st.get("cost") or {}).get("final")
            done = st.get("phase") in ("Succeeded", "Failed") and bool(final) and len(cells) == 6
            return sweep if done else None

        sweep = await eventually(finished, deadline_s=90, interval_s=0.25, message="the Sweep never finished")
        jobs = (await http.get(f"{base}/jobs", params={"labelSelector": "nodus.dev/sweep=skeleton"})).json()

    st = sweep["status"]
    cells = st["cells"]
    # 2 GPUs x 3 speeds, in the fixed order, each a Job named <sweep>-<index>.
    assert [c["index"] for c in cells] == list(range(6))
    assert [c["object"] for c in cells] == [f"skeleton-{i}" for i in range(6)]
    assert sorted(j["metadata"]["name"] for j in jobs["items"]) == sorted(c["object"] for c in cells)
    assert [(c["gpu"], c["params"]["SPEED"]) for c in cells] == [
        ("H100:1", "1"),
        ("H100:1", "0"),
        ("H100:1", "4"),
        ("L4:1", "1"),
        ("L4:1", "0"),
        ("L4:1", "4"),
    ]
    # The params reached the program: its reported throughput is speed x 100.5.
    ok = [c for c in cells if c["params"]["SPEED"] != "0"]
    assert all(c["phase"] == "Succeeded" for c in ok)
    assert {c["index"]: Decimal(c["unitsPerSecond"]) for c in ok} == {
        0: Decimal("100.5"),
        2: Decimal("402"),
        3: Decimal("100.5"),
        5: Decimal("402"),
    }
    assert all(c["wallSeconds"] >= 0 for c in ok)
    # Every cell that ran costs money, exactly, as a decimal string; the Sweep's total is their sum.
    assert all(Decimal(c["costUSD"]) > 0 for c in cells)
    assert Decimal(st["cost"]["totalUSD"]) == sum(Decimal(c["costUSD"]) for c in cells)
    # The failing cells fail, and the Sweep fails with CellsFailed after the rest have finished.
    assert [c["phase"] for c in cells if c["params"]["SPEED"] == "0"] == ["Failed", "Failed"]
    assert (st["phase"], st["reason"]) == ("Failed", "CellsFailed")
    # Best by throughput is a speed-4 cell; best by cost is the cheapest succeeded cell.
    assert st["best"]["byThroughput"] in (2, 5)
    cheapest = min(ok, key=lambda c: (Decimal(c["costUSD"]), c["index"]))
    assert st["best"]["byCost"] == cheapest["index"]


async def test_deleting_the_sweep_deletes_its_cells(stack: tuple[Stack, dict[str, str]]) -> None:
    _, values = stack
    base = "/apis/nodus.dev/v1/namespaces/e2e-delete"
    sweep = {**SWEEP, "metadata": {"name": "skeleton"}}
    async with client(values) as http:
        assert (await http.post(f"{base}/sweeps", json=sweep)).status_code == 201

        async def cells_exist() -> bool:
            r = await http.get(f"{base}/jobs", params={"labelSelector": "nodus.dev/sweep=skeleton"})
            return len(r.json()["items"]) > 0

        await eventually(cells_exist, deadline_s=30, message="no cell Job was created")
        assert (await http.delete(f"{base}/sweeps/skeleton")).status_code == 200

        async def cells_gone() -> bool:
            r = await http.get(f"{base}/jobs", params={"labelSelector": "nodus.dev/sweep=skeleton"})
            return r.json()["items"] == []

        await eventually(cells_gone, deadline_s=30, message="the cell Jobs outlived their Sweep")


async def test_a_recreated_sweep_runs_again_and_is_charged_again(stack: tuple[Stack, dict[str, str]]) -> None:
    """Runs and charges belong to the object (its uid), not to its name: a Sweep deleted and created
    again with the same name must run its program again, with the new parameters, and cost again."""
    _, values = stack
    base = "/apis/nodus.dev/v1/namespaces/e2e-again"

    def one_cell(speed: str) -> dict[str, Any]:
        spec = {**SWEEP["spec"], "matrix": {"gpu": ["L4:1"], "params": {"SPEED": [speed]}}}
        return {**SWEEP, "metadata": {"name": "again"}, "spec": spec}

    async with client(values) as http:

        async def run(speed: str) -> dict[str, Any]:
            assert (await http.post(f"{base}/sweeps", json=one_cell(speed))).status_code == 201

            async def done() -> dict[str, Any] | None:
                st = (await http.get(f"{base}/sweeps/again")).json().get("status", {})
                ok = st.get("phase") == "Succeeded" and (st.get("cost") or {}).get("final")
                return st if ok else None

            return await eventually(done, deadline_s=60, interval_s=0.25, message="the Sweep never finished")

        first = await run("1")
        assert (await http.delete(f"{base}/sweeps/again")).status_code == 200

        async def gone() -> bool:
            r = await http.get(f"{base}/jobs", params={"labelSelector": "nodus.dev/sweep=again"})
            return r.json()["items"] == [] and (await http.get(f"{base}/sweeps/again")).status_code == 404

        await eventually(gone, deadline_s=30, message="the first Sweep's cells were not collected")
        second = await run("3")
    assert Decimal(first["cells"][0]["unitsPerSecond"]) == Decimal("100.5")
    assert Decimal(second["cells"][0]["unitsPerSecond"]) == Decimal("301.5")  # it ran again, with SPEED=3
    assert Decimal(second["cost"]["totalUSD"]) > 0


async def test_the_stack_bus_refuses_strangers_and_the_operator_reads(
    stack: tuple[Stack, dict[str, str]],
) -> None:
    """The stack `make up` starts authenticates every process (#17): an anonymous client is refused (it
    could read Secrets, write Jobs and send assignments before), and the operator's seed in local.env
    taps the bus read-only."""
    import nats
    import nats.errors

    from nodus_kit.connecting import connect

    s, values = stack
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(values["NODUS_NATS_URL"], allow_reconnect=False, max_reconnect_attempts=0)
    env = (s.root / "local.env").read_text()
    assert f"NODUS_NATS_OPERATOR_SEED={values['NODUS_NATS_OPERATOR_SEED']}" in env
    operator = await connect(
        values["NODUS_NATS_URL"], "e2e-operator", nkey_seed=values["NODUS_NATS_OPERATOR_SEED"]
    )
    try:
        info = await operator.jetstream().stream_info("KV_jobs")
        assert info.config.name == "KV_jobs"
    finally:
        await operator.close()
