"""The Sweep's cost and its MaxCostReached phase, from what billing wrote on its cells (pure)."""

from __future__ import annotations

import msgspec

from nodus_schema.costs import Cost, CostSegments
from nodus_schema.jobs import Job, JobStatus
from nodus_schema.sweeps import Sweep, SweepSpec
from nodus_sweeps.reconciling import _capped, roll_up


def test_the_sweep_cost_sums_its_cells_and_ends_funding_with_the_first_cell() -> None:
    a = Cost(
        total_usd="0.10",
        held_usd="0.05",
        rate_usd_per_hour="1.50",
        funded_until_time="2026-11-30T10:05:00Z",
        by_segment=CostSegments(boot_usd="0.01", running_usd="0.09"),
    )
    b = Cost(
        total_usd="0.000001",
        held_usd="0.00",
        funded_until_time="2026-11-30T10:01:00Z",
        by_segment=CostSegments(restore_usd="0.02", covered_by_nodus=["Boot"]),
    )
    cost = roll_up([a, None, b], "1.00", final=False)
    assert cost.total_usd == "0.100001" and cost.held_usd == "0.05" and cost.rate_usd_per_hour == "1.50"
    assert cost.limit_usd == "1.00" and cost.final is False
    assert cost.funded_until_time == "2026-11-30T10:01:00Z"
    assert cost.by_segment == CostSegments(
        boot_usd="0.01", running_usd="0.09", restore_usd="0.02", covered_by_nodus=["Boot"]
    )
    assert roll_up([], None, final=True) == Cost(total_usd="0.00", final=True)


def _sweep(cap: str | None = "0.50", state: str | None = None) -> Sweep:
    spec = msgspec.convert(
        {"template": {"spec": {"image": "x"}}, "maxCostUSD": cap, "state": state}, SweepSpec
    )
    return Sweep(spec=spec)


def _cell(phase: str, reason: str | None = None) -> Job:
    return Job(status=JobStatus(phase=phase, reason=reason))


def test_a_sweep_whose_open_cells_are_all_capped_is_suspended_with_max_cost_reached() -> None:
    owned = {
        0: _cell("Succeeded", "Completed"),
        1: _cell("Suspended", "MaxCostReached"),
        2: _cell("Suspended", "MaxCostReached"),
    }
    phase, reason, message = _capped(_sweep(), owned, "Running", None, "1 of 3 cells finished")
    assert (phase, reason) == ("Suspended", "MaxCostReached")
    assert "2 cells suspended" in message and "spec.maxCostUSD (now $0.50)" in message


def test_cells_still_stopping_keep_the_sweep_running_with_the_reason() -> None:
    owned = {0: _cell("Running", "MaxCostReached"), 1: _cell("Suspended", "MaxCostReached")}
    assert _capped(_sweep(), owned, "Running", None, "")[:2] == ("Running", "MaxCostReached")


def test_nothing_capped_or_a_sweep_not_running_keeps_its_own_phase() -> None:
    owned = {0: _cell("Running")}
    assert _capped(_sweep(), owned, "Running", None, "m") == ("Running", None, "m")
    capped = {0: _cell("Suspended", "MaxCostReached")}
    assert _capped(_sweep(state="Suspended"), capped, "Suspended", "Suspended", "s") == (
        "Suspended",
        "Suspended",
        "s",
    )
    assert _capped(_sweep(), capped, "Failed", "CellsFailed", "f") == ("Failed", "CellsFailed", "f")


def test_a_cells_row_carries_its_jobs_recovery_totals() -> None:
    """#18: what lost capacity cost a cell shows in its row (lostGPUSeconds, recoveryUSD), and nothing
    is shown for a cell that lost nothing."""
    from nodus_schema.expanding import Cell
    from nodus_schema.jobs import RecoveryStatus
    from nodus_sweeps.reconciling import _cell_row

    cell = Cell(index=3, gpu=None, region=None, params=(), repetition=0)
    recovery = RecoveryStatus(lost_runs=1, lost_gpu_seconds=480, lost_usd="0.40", recovery_usd="0.45")
    lost = Job(status=JobStatus(phase="Succeeded", recovery=recovery))
    row = _cell_row(cell, lost, sweeps_gpu=False, sweeps_region=False)
    assert (row.lost_gpu_seconds, row.recovery_usd) == (480, "0.45")
    encoded = msgspec.json.decode(msgspec.json.encode(row))
    assert (encoded["lostGPUSeconds"], encoded["recoveryUSD"]) == (480, "0.45")
    clean = _cell_row(cell, Job(status=JobStatus(phase="Succeeded")), sweeps_gpu=False, sweeps_region=False)
    assert "lostGPUSeconds" not in msgspec.json.decode(msgspec.json.encode(clean))
