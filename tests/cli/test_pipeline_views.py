"""How the CLI shows Pipelines (issue #22), without a gateway: the list's columns, the DAG as a tree in
``describe``, the spend against the cap, the best cell in words, stage transitions and the progress line of
``apply --wait``, and the rule for when following a Pipeline is over."""

from __future__ import annotations

import io
from typing import Any

import msgspec
import pytest

from nodus_cli import exiting, printing, waiting, watching
from nodus_cli.describing import describe_pipeline
from nodus_cli.kinds import COMPUTE_KINDS, PIPELINE, by_manifest_kind, resolve
from nodus_cli.pipelines import (
    best_text,
    dag_lines,
    spend_text,
    stage_phases,
    stages_done,
    transitions,
)
from nodus_schema.pipelines import BestCell, BestChoice, Pipeline


def job(image: str = "ghcr.io/acme/x:1") -> dict[str, Any]:
    return {"job": {"image": image, "resources": {"gpu": "L4:1"}}}


def sweep() -> dict[str, Any]:
    return {"sweep": {"matrix": {"params": {"LR": ["0.1", "0.01"]}}, "template": {"spec": {"image": "x"}}}}


def flow(status: dict[str, Any] | None = None, *, cap: str | None = "5.00") -> Pipeline:
    """prepare -> grid -> train -> evaluate, and report after prepare; evaluate also waits for report."""
    raw: dict[str, Any] = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Pipeline",
        "metadata": {"name": "flow", "namespace": "team-a", "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {
            "stages": [
                {"name": "prepare", "template": job()},
                {"name": "grid", "dependsOn": ["prepare"], "template": sweep()},
                {"name": "report", "dependsOn": ["prepare"], "template": job()},
                {
                    "name": "train",
                    "dependsOn": ["grid"],
                    "fromBest": {"stage": "grid", "by": "Throughput"},
                    "template": job(),
                },
                {"name": "evaluate", "dependsOn": ["train", "report"], "template": job()},
            ]
        },
        "status": status or {},
    }
    if cap is not None:
        raw["spec"]["maxCostUSD"] = cap
    return msgspec.convert(raw, Pipeline)


def stage(name: str, kind: str, phase: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "phase": phase, **more}


RUNNING: dict[str, Any] = {
    "phase": "Running",
    "cost": {"totalUSD": "1.234", "rateUSDPerHour": "0.80"},
    "estimate": {
        "costUSD": {"p50": "2.10", "p90": "3.40"},
        "warnings": [{"code": "CriticalPath", "message": "prepare -> grid -> train -> evaluate"}],
    },
    "estimatedDuration": {"p50": "1h10m", "p90": "1h45m"},
    "stages": [
        stage("prepare", "Job", "Succeeded", object="flow-prepare", costUSD="0.10", wallSeconds=60),
        stage("grid", "Sweep", "Succeeded", object="flow-grid", costUSD="0.80", wallSeconds=720),
        stage("report", "Job", "Running", object="flow-report", costUSD="0.004", wallSeconds=30),
        stage(
            "train",
            "Job",
            "Running",
            object="flow-train",
            costUSD="0.33",
            wallSeconds=300,
            fromBest={
                "stage": "grid",
                "by": "Throughput",
                "cell": 3,
                "object": "flow-grid-3",
                "params": {"LR": "0.01"},
                "gpu": "L4:1",
            },
        ),
        stage("evaluate", "Job", "Waiting"),
    ],
    "conditions": [
        {
            "type": "Ready",
            "status": "False",
            "reason": "StagesRunning",
            "message": "2 of 5 stages running",
            "lastTransitionTime": "2026-12-01T10:05:00Z",
        }
    ],
}


def test_the_kind_answers_to_its_names_and_is_waited_for() -> None:
    for typed in ("pipeline", "pipelines", "pl", "Pipeline", "pipelines.nodus.dev"):
        assert resolve(typed) is PIPELINE
    assert by_manifest_kind("Pipeline") is PIPELINE
    assert PIPELINE in COMPUTE_KINDS and PIPELINE.writable and PIPELINE.watchable
    assert PIPELINE.ref("flow") == "pipeline.nodus.dev/flow"


def test_the_list_shows_stages_succeeded_of_all_phase_cost_and_age() -> None:
    table = printing.list_table(PIPELINE, [flow(RUNNING)]).splitlines()
    assert table[0].split() == ["NAME", "STAGES", "PHASE", "COST", "AGE"]
    assert table[1].split()[:4] == ["flow", "2/5", "Running", "$1.234"]
    wide = printing.list_table(PIPELINE, [flow(RUNNING)], wide=True).splitlines()
    assert wide[0].split() == ["NAME", "STAGES", "PHASE", "COST", "AGE", "RATE", "ESTIMATE", "MAX-COST"]
    assert wide[1].split()[-3:] == ["$0.80/h", "$2.10", "$5.00"]
    # Before the controller has written a status: every stage of the spec counts, none succeeded.
    fresh = printing.list_table(PIPELINE, [flow()]).splitlines()[1].split()
    assert fresh[:4] == ["flow", "0/5", "Pending", "-"]
    failed = flow({"phase": "Failed", "reason": "StageFailed"})
    assert "Failed (StageFailed)" in printing.list_table(PIPELINE, [failed])


def test_the_dag_is_a_tree_under_first_dependencies() -> None:
    assert dag_lines(flow(RUNNING)) == [
        "STAGE                                   KIND   PHASE      COST    WALL    OBJECT",
        "prepare                                 Job    Succeeded  $0.10   1m00s   flow-prepare",
        "├─ grid                                 Sweep  Succeeded  $0.80   12m00s  flow-grid",
        "│  └─ train                             Job    Running    $0.33   5m00s   flow-train",
        "│     │  best of grid by Throughput: cell 3 (LR=0.01, L4:1)",
        "│     └─ evaluate (also after: report)  Job    Waiting    -       -       -",
        "└─ report                               Job    Running    $0.004  30s     flow-report",
    ]


def test_the_dag_before_any_status_and_with_messages() -> None:
    lines = dag_lines(flow())
    assert [line.split()[0] for line in lines[1:] if not line.startswith("│     │")] == [
        "prepare",
        "├─",
        "│",
        "│",
        "└─",
    ]
    assert "│     │  best of grid by Throughput: not chosen yet" in lines
    assert all("Pending" in line for line in lines[1:] if "─ " in line or line.startswith("prepare"))
    skipped = flow(
        {
            "stages": [
                stage("prepare", "Job", "Failed", object="flow-prepare", message="exit code 2"),
                stage("grid", "Sweep", "Skipped", message="prepare failed"),
            ]
        }
    )
    lines = dag_lines(skipped)
    assert lines[2] == "│  exit code 2"  # under prepare, which has stages below it
    assert "│  │  prepare failed" in lines


def test_a_stage_on_a_cycle_is_still_shown() -> None:
    looped = msgspec.convert(
        {
            "metadata": {"name": "loop"},
            "spec": {
                "stages": [
                    {"name": "a", "dependsOn": ["b"], "template": job()},
                    {"name": "b", "dependsOn": ["a"], "template": job()},
                ]
            },
        },
        Pipeline,
    )
    names = [line.split()[-6] for line in dag_lines(looped)[1:]]
    assert names == ["a", "b"]


def test_best_cell_in_words() -> None:
    params = {"B": "2", "A": "1"}
    chosen = BestChoice(stage="grid", by="Cost", cell=0, params=params, gpu="H100:1", region="eu")
    assert best_text(None, chosen) == "best of grid by Cost: cell 0 (A=1, B=2, H100:1, eu)"
    assert best_text(BestCell(stage="grid"), None) == "best of grid by Cost: not chosen yet"
    assert best_text(None, None) is None
    assert best_text(None, BestChoice(stage="g", by="Throughput", object="g-4")) == (
        "best of g by Throughput: cell g-4"
    )


@pytest.mark.parametrize(
    ("cap", "total", "text"),
    [
        ("5.00", "1.234", "$1.234 of the $5.00 cap (24.6%)"),
        ("2", "2.000001", "$2.000001 of the $2 cap (100.0%)"),
        ("0.30", "0.1", "$0.1 of the $0.30 cap (33.3%)"),
        (None, "0.5", "$0.5, no cap (spec.maxCostUSD is not set)"),
        ("5.00", None, "$0 of the $5.00 cap (0.0%)"),
    ],
)
def test_spend_against_the_cap_is_exact(cap: str | None, total: str | None, text: str) -> None:
    status = {"cost": {"totalUSD": total}} if total else {}
    assert spend_text(flow(status, cap=cap)) == text


def test_describe_shows_cap_spend_estimate_tree_and_conditions() -> None:
    out = describe_pipeline(flow(RUNNING))
    sections = [line.split(":")[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert sections[:3] == ["Name", "Namespace", "Kind"]
    assert sections[-5:] == ["Spec", "Status", "Estimate", "Stages", "Conditions"]
    lines = out.splitlines()
    assert "  Max Cost: $5.00" in lines
    assert "  Spend:       $1.234 of the $5.00 cap (24.6%)" in lines
    assert "  Stages Done: 2/5 succeeded" in lines
    assert "  Cost:     p50 $2.10  p90 $3.40" in lines
    assert "  Duration: p50 1h10m  p90 1h45m" in lines
    assert "  Warning:  CriticalPath: prepare -> grid -> train -> evaluate" in lines
    assert "  │     │  best of grid by Throughput: cell 3 (LR=0.01, L4:1)" in lines
    assert any(line.startswith("  Ready  False   StagesRunning") for line in lines)
    bare = describe_pipeline(flow(cap=None))
    assert "  Max Cost: none (no shared cap)" in bare.splitlines()
    assert "Estimate:  -" in bare and "Conditions:  none yet" in bare


def test_transitions_name_each_stage_that_moved() -> None:
    before = stage_phases(flow({"stages": [stage("prepare", "Job", "Running", object="flow-prepare")]}))
    after = flow(
        {
            "stages": [
                stage("prepare", "Job", "Succeeded", object="flow-prepare", costUSD="0.10", wallSeconds=61),
                stage("grid", "Sweep", "Running", object="flow-grid"),
                stage("report", "Job", "Failed", object="flow-report", message="exit code 1"),
            ]
        }
    )
    assert transitions(before, after) == [
        "stage prepare: Running -> Succeeded (job flow-prepare, 1m01s, $0.10)",
        "stage grid: Running (sweep flow-grid)",
        "stage report: Failed (job flow-report): exit code 1",
    ]
    assert transitions(stage_phases(after), after) == []


def test_progress_and_the_end_of_a_failed_pipeline() -> None:
    line = waiting.progress(PIPELINE, flow(RUNNING))
    assert line == "pipeline.nodus.dev/flow  Running  stages 2/5 succeeded  spent $1.234  rate $0.80/h"
    failed = flow(
        {
            "phase": "Failed",
            "reason": "StageFailed",
            "message": "stage report failed: exit code 1",
            "cost": {"totalUSD": "0.50", "final": True},
        }
    )
    assert waiting.ended_text(PIPELINE, failed) == (
        "pipeline.nodus.dev/flow Failed (StageFailed): stage report failed: exit code 1"
    )
    assert waiting.ended_text(PIPELINE, flow({"phase": "Succeeded", "message": "done"})) is None


def test_following_a_pipeline_ends_when_it_ends_with_its_final_cost() -> None:
    ending = waiting.Ending(PIPELINE)
    running = msgspec.to_builtins(flow(RUNNING))
    assert ending.update(watching.Change("ADDED", running)) is None
    done = {**running, "status": {**running["status"], "phase": "Succeeded", "cost": {"final": True}}}
    assert ending.update(watching.Change("MODIFIED", done)) == exiting.OK
    ending = waiting.Ending(PIPELINE)
    failed = {**running, "status": {"phase": "Failed", "cost": {"final": True}}}
    assert ending.update(watching.Change("MODIFIED", failed)) == exiting.FAILED


def test_stage_log_prints_transitions_above_the_progress_line() -> None:
    err = io.StringIO()
    line = waiting.ProgressLine(err)
    log = waiting.StageLog(line)
    log.show(flow({"stages": [stage("prepare", "Job", "Running", object="flow-prepare")]}))
    line.show("progress 1")
    log.show(flow({"stages": [stage("prepare", "Job", "Running", object="flow-prepare")]}))
    log.show(flow({"stages": [stage("prepare", "Job", "Succeeded", object="flow-prepare")]}))
    assert err.getvalue().splitlines() == [
        "stage prepare: Running (job flow-prepare)",
        "progress 1",
        "stage prepare: Running -> Succeeded (job flow-prepare)",
    ]
    assert stages_done(flow({"stages": [stage("prepare", "Job", "Succeeded")]})) == (1, 5)
