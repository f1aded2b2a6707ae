"""The stop-early projection of a capped Sweep (pure): what finishing should cost against what is left."""

from __future__ import annotations

import msgspec

from nodus_schema.costs import Cost
from nodus_schema.jobs import Job, JobStatus
from nodus_schema.meta import ObjectMeta
from nodus_schema.sweeps import Sweep, SweepSpec
from nodus_sweeps.reconciling import STOP_EARLY_ANNOTATION, _stopped_early, project


def sweep(cap: str | None, stop_early: bool = False) -> Sweep:
    spec = msgspec.convert({"template": {"spec": {"image": "x"}}, "maxCostUSD": cap}, SweepSpec)
    annotations = {STOP_EARLY_ANNOTATION: "true"} if stop_early else {}
    return Sweep(metadata=ObjectMeta(name="s", annotations=annotations, generation=3), spec=spec)


def cell(phase: str, total: str, final: bool = True) -> Job:
    return Job(status=JobStatus(phase=phase, cost=Cost(total_usd=total, final=final)))


def test_no_projection_without_a_cap_or_a_finished_cell() -> None:
    assert project(sweep(None), 10, {0: cell("Succeeded", "1.00")}) is None
    assert project(sweep("5.00"), 10, {0: cell("Running", "0.50", final=False)}) is None


def test_the_mean_of_finished_cells_projects_the_rest() -> None:
    owned = {0: cell("Succeeded", "1.00"), 1: cell("Failed", "2.00"), 2: cell("Running", "0.40", final=False)}
    outlook = project(sweep("10.00"), 10, owned)
    assert outlook is not None
    # mean $1.50; 8 cells left need 12.00, less the 0.40 the running one has spent
    assert (outlook.mean, outlook.left_cells, outlook.projected) == (1_500_000, 8, 11_600_000)
    assert outlook.left == 10_000_000 - 3_400_000 and outlook.over
    condition = outlook.condition(sweep("10.00"))
    assert (condition.type, condition.status, condition.reason) == (
        "ProjectedOverCap",
        "True",
        "ProjectedOverCap",
    )
    assert "8 cells left need about $11.60" in (condition.message or "")
    assert condition.observed_generation == 3


def test_within_the_cap_the_condition_says_so() -> None:
    outlook = project(sweep("100.00"), 4, {0: cell("Succeeded", "1.00")})
    assert outlook is not None and not outlook.over
    assert outlook.condition(sweep("100.00")).reason == "WithinCap"


def test_the_policy_suspends_a_sweep_with_nothing_running_and_says_what_cap_would_do() -> None:
    owned = {0: cell("Succeeded", "1.00")}
    outlook = project(sweep("2.00", stop_early=True), 5, owned)
    assert outlook is not None and outlook.over  # 4 left x $1 = $4 > $1 left
    phase, reason, message = _stopped_early(sweep("2.00", True), outlook, owned, "Running", None, "m")
    assert (phase, reason) == ("Suspended", "StoppedEarly")
    assert "raise spec.maxCostUSD to at least $5.00" in message
    # Without the policy, or with a cell still running, the phase is left alone.
    assert _stopped_early(sweep("2.00"), outlook, owned, "Running", None, "m") == ("Running", None, "m")
    running = {**owned, 1: cell("Running", "0.10", final=False)}
    assert _stopped_early(sweep("2.00", True), outlook, running, "Running", None, "m") == (
        "Running",
        None,
        "m",
    )
