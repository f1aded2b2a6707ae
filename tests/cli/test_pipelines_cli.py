"""``nodus`` and Pipelines (issue #22) against a real gateway on the session's nats-server
(tests/cli/conftest.py): apply (and again: unchanged), get (also as ``pl``, ``-o json|yaml|name``), describe
with the DAG, patch, delete, and ``apply --wait`` following a Pipeline's stages to its end.

The status is written into the ``pipelines`` bucket as the controller writes it; the CLI reads it through
the API and its watch."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import yaml
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_cli import main
from nodus_kit.storing import ObjectStore
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_schema.pipelines import Pipeline, PipelineStatus
from nodus_testing.waiting import eventually

TOKEN = "cli-test-token-0123456789"  # the gateway_url fixture's admin token (tests/cli/conftest.py)

PIPELINE_YAML = """\
apiVersion: nodus.dev/v1
kind: Pipeline
metadata:
  name: flow
spec:
  maxCostUSD: "5.00"
  stages:
  - name: prepare
    template:
      job:
        image: ghcr.io/acme/prep:1
        command: [python, prep.py]
        resources: {gpu: "L4:1"}
  - name: grid
    dependsOn: [prepare]
    template:
      sweep:
        matrix: {params: {LR: ["0.1", "0.01"]}}
        template:
          spec:
            image: ghcr.io/acme/train:1
            command: [python, train.py]
            resources: {gpu: "L4:1"}
  - name: train
    dependsOn: [grid]
    fromBest: {stage: grid, by: Throughput}
    template:
      job:
        image: ghcr.io/acme/train:1
        command: [python, train.py]
        resources: {gpu: "L4:1"}
"""


class Cli:
    """Runs ``nodus`` in a thread against the test gateway, in one namespace; collects what it printed."""

    def __init__(self, url: str, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url, self.namespace, self.capsys = url, namespace, capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        args = ["--server", self.url, "--token", TOKEN, "-n", self.namespace, *argv]
        code = await asyncio.to_thread(main, args)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture(autouse=True)
def no_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An absent config file of its own: a developer's ~/.config/nodus never leaks in."""
    monkeypatch.setenv("NODUS_CONFIG", str(tmp_path / "nodus-config" / "config.yaml"))


@pytest.fixture
def nodus(gateway_url: str, unique: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(gateway_url, unique, capsys)


@pytest.fixture
def manifest(tmp_path: Path) -> str:
    path = tmp_path / "flow.yaml"
    path.write_text(PIPELINE_YAML)
    return str(path)


def stage(name: str, kind: str, phase: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "phase": phase, "object": f"flow-{name}", **more}


def status(**fields: Any) -> PipelineStatus:
    return msgspec.convert(fields, PipelineStatus)


async def set_status(nc: NATS, namespace: str, value: PipelineStatus) -> None:
    store = ObjectStore(nc, "pipelines", Pipeline)
    await store.mutate(namespace, "flow", lambda p: msgspec.structs.replace(p, status=value))


RUNNING = status(
    phase="Running",
    cost={"totalUSD": "0.90", "rateUSDPerHour": "0.80"},
    estimate={"costUSD": {"p50": "1.50", "p90": "2.25"}},
    estimatedDuration={"p50": "40m", "p90": "1h5m"},
    stages=[
        stage("prepare", "Job", "Succeeded", costUSD="0.10", wallSeconds=60),
        stage("grid", "Sweep", "Succeeded", costUSD="0.80", wallSeconds=720),
        stage(
            "train",
            "Job",
            "Running",
            fromBest={
                "stage": "grid",
                "by": "Throughput",
                "cell": 1,
                "params": {"LR": "0.01"},
                "gpu": "L4:1",
            },
        ),
    ],
)


async def test_apply_get_describe_patch_delete_a_pipeline(
    nodus: Cli, nc: NATS, manifest: str, unique: str
) -> None:
    code, out, err = await nodus("apply", "-f", manifest)
    assert (code, out.strip()) == (0, "pipeline.nodus.dev/flow created"), err
    code, out, err = await nodus("apply", "-f", manifest)
    assert (code, out.strip()) == (0, "pipeline.nodus.dev/flow unchanged"), err

    code, out, _ = await nodus("get", "pipelines")
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split() == ["NAME", "STAGES", "PHASE", "COST", "AGE"]
    assert row.split()[:4] == ["flow", "0/3", "Pending", "-"]

    await set_status(nc, unique, RUNNING)
    code, out, _ = await nodus("get", "pl")
    assert code == 0 and out.strip().splitlines()[1].split()[:4] == ["flow", "2/3", "Running", "$0.90"]
    code, out, _ = await nodus("get", "pl", "flow", "-o", "wide")
    assert code == 0 and out.strip().splitlines()[1].split()[-3:] == ["$0.80/h", "$1.50", "$5.00"]
    code, out, _ = await nodus("get", "pipeline", "flow", "-o", "json")
    assert code == 0 and json.loads(out)["status"]["stages"][2]["fromBest"]["cell"] == 1
    code, out, _ = await nodus("get", "pipelines", "-o", "yaml")
    assert code == 0 and yaml.safe_load(out)["items"][0]["spec"]["maxCostUSD"] == "5.00"
    code, out, _ = await nodus("get", "pipelines", "-o", "name")
    assert (code, out.strip()) == (0, "pipeline.nodus.dev/flow")

    code, out, _ = await nodus("describe", "pipeline", "flow")
    assert code == 0
    lines = out.splitlines()
    assert "Kind:             Pipeline" in lines
    assert "  Spend:       $0.90 of the $5.00 cap (18.0%)" in lines
    assert "  Cost:     p50 $1.50  p90 $2.25" in lines
    assert "  Duration: p50 40m  p90 1h5m" in lines
    tree = lines[lines.index("Stages:") + 1 : lines.index("Conditions:  none yet")]
    assert tree == [
        "  STAGE        KIND   PHASE      COST   WALL    OBJECT",
        "  prepare      Job    Succeeded  $0.10  1m00s   flow-prepare",
        "  └─ grid      Sweep  Succeeded  $0.80  12m00s  flow-grid",
        "     └─ train  Job    Running    -      -       flow-train",
        "           best of grid by Throughput: cell 1 (LR=0.01, L4:1)",
    ]

    code, out, err = await nodus("patch", "pl", "flow", "-p", '{"spec": {"maxCostUSD": "6.00"}}')
    assert (code, out.strip()) == (0, "pipeline.nodus.dev/flow patched"), err
    code, out, _ = await nodus("describe", "pl", "flow")
    assert "  Spend:       $0.90 of the $6.00 cap (15.0%)" in out.splitlines()

    code, out, _ = await nodus("delete", "pipeline", "flow")
    assert (code, out.strip()) == (0, "pipeline.nodus.dev/flow deleted")
    code, out, err = await nodus("get", "pipeline", "flow")
    assert code == 1 and out == "" and 'pipelines.nodus.dev "flow" not found' in err


async def test_apply_wait_prints_stage_transitions_until_the_pipeline_succeeds(
    nodus: Cli, nc: NATS, manifest: str, unique: str
) -> None:
    # The bucket keeps an object's latest state only, so a watch shows the last of several quick writes:
    # each state is written once the CLI has printed the one before.
    outs: list[str] = []
    errs: list[str] = []

    async def printed(text: str) -> None:
        def seen() -> bool:
            out, err = nodus.capsys.readouterr()
            outs.append(out)
            errs.append(err)
            return text in "".join(outs) + "".join(errs)

        await eventually(seen, message=f"the CLI never printed {text!r}")

    waiting = asyncio.create_task(nodus("apply", "-f", manifest, "--wait"))
    await printed("pipeline.nodus.dev/flow  Pending  stages 0/3 succeeded  spent -")
    first = status(phase="Running", stages=[stage("prepare", "Job", "Running"), {"name": "grid"}])
    await set_status(nc, unique, first)
    await printed("stage prepare: Running (job flow-prepare)")
    await set_status(nc, unique, RUNNING)
    await printed("stage train: Running (job flow-train)")
    done = [
        stage("prepare", "Job", "Succeeded", costUSD="0.10", wallSeconds=60),
        stage("grid", "Sweep", "Succeeded", costUSD="0.80", wallSeconds=720),
        stage("train", "Job", "Succeeded", costUSD="0.35", wallSeconds=300),
    ]
    await set_status(
        nc, unique, status(phase="Succeeded", cost={"totalUSD": "1.25", "final": True}, stages=done)
    )
    code, out, err = await asyncio.wait_for(waiting, 20)
    out, err = "".join(outs) + out, "".join(errs) + err
    assert code == 0, err
    assert out.splitlines() == [
        "pipeline.nodus.dev/flow created",
        "pipeline.nodus.dev/flow  Succeeded  stages 3/3 succeeded  spent $1.25 (final)",
    ]
    transitions = [line for line in err.splitlines() if line.startswith("stage ")]
    assert transitions == [
        "stage prepare: Running (job flow-prepare)",
        "stage prepare: Running -> Succeeded (job flow-prepare, 1m00s, $0.10)",
        "stage grid: Succeeded (sweep flow-grid, 12m00s, $0.80)",
        "stage train: Running (job flow-train)",
        "stage train: Running -> Succeeded (job flow-train, 5m00s, $0.35)",
    ]
    # Into a pipe (not a terminal) each state is a line of its own on stderr.
    assert "pipeline.nodus.dev/flow  Running  stages 2/3 succeeded  spent $0.90  rate $0.80/h" in err


async def test_apply_wait_exits_1_with_the_reason_when_a_stage_fails(
    nodus: Cli, nc: NATS, manifest: str, unique: str
) -> None:
    assert (await nodus("apply", "-f", manifest))[0] == 0
    await set_status(
        nc,
        unique,
        status(
            phase="Failed",
            reason="StageFailed",
            message="stage prepare failed: BackoffLimitExceeded",
            cost={"totalUSD": "0.02", "final": True},
            stages=[
                stage("prepare", "Job", "Failed", message="BackoffLimitExceeded"),
                {"name": "grid", "kind": "Sweep", "phase": "Skipped", "message": "prepare failed"},
                {"name": "train", "kind": "Job", "phase": "Skipped", "message": "prepare failed"},
            ],
        ),
    )
    # Applied again, it is unchanged and already over: --wait reports its end at once.
    code, out, err = await nodus("apply", "-f", manifest, "--wait")
    assert code == 1
    assert out.splitlines() == [
        "pipeline.nodus.dev/flow unchanged",
        "pipeline.nodus.dev/flow  Failed (StageFailed)  stages 0/3 succeeded  spent $0.02 (final)",
    ]
    lines = err.splitlines()
    assert "stage prepare: Failed (job flow-prepare): BackoffLimitExceeded" in lines
    assert "stage grid: Skipped (sweep): prepare failed" in lines
    assert lines[-1] == (
        "pipeline.nodus.dev/flow Failed (StageFailed): stage prepare failed: BackoffLimitExceeded"
    )


@pytest_asyncio.fixture
async def estimates(nc: NATS) -> AsyncIterator[None]:
    """The scheduler's and billing's estimate endpoints on the real subjects the gateway asks."""
    subs = [await serve_estimates(nc, load_catalog()), await serve_quotes(nc)]
    yield
    for sub in subs:
        await sub.unsubscribe()


async def test_estimate_of_a_pipeline_has_the_dags_cost_and_critical_path(
    nodus: Cli, manifest: str, estimates: None
) -> None:
    code, out, err = await nodus("estimate", "-f", manifest)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "pipeline.nodus.dev/flow: could run"
    fields = {
        k.strip(): v.strip()
        for k, _, v in (line.partition(":") for line in lines[1:] if line[:2] == "  " and line[2] != " ")
    }
    assert re.fullmatch(r"p50 \$[0-9.]+  p90 \$[0-9.]+", fields["cost"]), out
    assert re.fullmatch(r"p50 \S+  p90 \S+  \(the critical path\)", fields["duration"]), out
    assert any(line.startswith("    CriticalPath: prepare -> grid -> train: p50 ") for line in lines), out
    code, out, _ = await nodus("estimate", "-f", manifest, "-o", "json")
    (entry,) = json.loads(out)
    assert (entry["kind"], entry["name"], entry["blocked"]) == ("Pipeline", "flow", False)
    assert set(entry["estimatedDuration"]) == {"p50", "p90"}
    # Nothing was created.
    assert (await nodus("get", "pipeline", "flow"))[0] == 1
