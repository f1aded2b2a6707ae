"""Deadlining: what an estimate says about ``spec.completeByTime`` (issue #21).

``completeByTime`` is a finish-by hint for placement and checkpoint cadence; it never stops a Job and is
never a reason to refuse one. The estimate warns, in two cases:

* ``DeadlinePassed``: the deadline is already past when the estimate is made.
* ``DeadlineAtRisk``: the **p90 finish** lands after it. The p90 finish is now + the p90 wall time of the
  object from the estimate's own bands (the slot plan billing prices): each wave of indexes (⌈completions ÷
  parallelism⌉ of them) takes the boot band's p90 (the startup the estimate bills: each run is started and
  billed as its own allocation) plus the run band's p90. For a Sweep, the cells run ``maxParallel`` at a
  time, in cell order, each taking the next free slot as the one before it finishes (as the sweep
  controller starts them); the p90 finish is the last cell's. Time spent waiting for capacity is not known
  in advance: when no node is free now (the ``Queued`` warning), the message says it comes on top.

The message gives the numbers (the p90 finish, the deadline, by how much it is late) and what would help.
Pure; :mod:`nodus_scheduler.estimating` adds the warnings to the scheduler's reply.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import msgspec

from nodus_schema.costs import EstimateWarning
from nodus_schema.estimating import DEFAULT_MAX_PARALLEL, EstimateReply, EstimateRequest, SlotPlan
from nodus_schema.meta import format_time, parse_time
from nodus_schema.quantities import format_duration, parse_duration

DEADLINE_PASSED: Final = "DeadlinePassed"
DEADLINE_AT_RISK: Final = "DeadlineAtRisk"

_SECOND: Final = timedelta(seconds=1)


def _band_p90(text: str | None) -> timedelta:
    return parse_duration(text) if text else timedelta(0)


def waves_of(plan: SlotPlan) -> int:
    """How many rounds of runs one Job (or cell) of this slot takes: ⌈completions ÷ parallelism⌉."""
    return -(-max(plan.completions, 1) // max(plan.parallelism, 1))


def slot_p90(plan: SlotPlan) -> timedelta:
    """The p90 wall time of one Job (or one cell) of this slot: each wave boots (p90) and runs (p90)."""
    return waves_of(plan) * (_band_p90(plan.boot.p90) + _band_p90(plan.run.p90))


def sweep_p90(slots: list[SlotPlan], max_parallel: int) -> timedelta:
    """The p90 wall time of a Sweep: its cells in index order (each slot's cells from its first cell on),
    ``max_parallel`` at a time, each starting as soon as one before it finishes; the last one's end."""
    running = [timedelta(0)] * max(max_parallel, 1)  # when each of the parallel slots is free again
    end = timedelta(0)
    for plan in sorted(slots, key=lambda p: p.first_cell):
        took = slot_p90(plan)
        for _ in range(max(plan.cells, 0)):
            start = heapq.heappop(running)
            end = max(end, start + took)
            heapq.heappush(running, start + took)
    return end


@dataclass(frozen=True, slots=True)
class Deadline:
    text: str
    at: datetime
    field: str
    """``spec.completeByTime`` or ``spec.template.spec.completeByTime``."""


def deadline_of(request: EstimateRequest) -> Deadline | None:
    """The request's completeByTime, or None (unset, or not a time: admission refuses that on its own)."""
    if request.kind == "Sweep" and request.sweep_spec is not None:
        text, field = request.sweep_spec.template.spec.complete_by_time, "spec.template.spec.completeByTime"
    elif request.job_spec is not None:
        text, field = request.job_spec.complete_by_time, "spec.completeByTime"
    else:
        return None
    if not text:
        return None
    try:
        return Deadline(text, parse_time(text), field)
    except (ValueError, OverflowError):
        return None


def _ceil_second(at: datetime) -> datetime:
    whole = at.replace(microsecond=0)
    return whole if whole == at else whole + _SECOND


def _passed(deadline: Deadline, now: datetime) -> EstimateWarning:
    ago = format_duration(_ceil_second(now) - deadline.at)
    return EstimateWarning(
        code=DEADLINE_PASSED,
        message=f"{deadline.field} {deadline.text} is already past (by {ago}): it is a hint and never stops "
        "the run, so the create is admitted; it still orders this object by that deadline among its "
        "project's waiting work of the same placement profile, and under recovery.checkpoint.interval "
        "auto its runs checkpoint at the shortest interval auto allows. Set a time in the future, or "
        "leave it unset",
    )


def _fixes(request: EstimateRequest, slots: list[SlotPlan], max_parallel: int) -> str:
    spec = request.sweep_spec.template.spec if request.sweep_spec is not None else request.job_spec
    field = "spec.template.spec." if request.kind == "Sweep" else "spec."
    hints: list[str] = []
    cells = sum(p.cells for p in slots)
    if request.kind == "Sweep" and cells > max_parallel:
        rounds = -(-cells // max(max_parallel, 1))
        hints.append(f"raise spec.maxParallel (now {max_parallel}: {cells} cells run in {rounds} rounds)")
    waved = [p for p in slots if waves_of(p) > 1]
    if waved:
        p = waved[0]
        hints.append(
            f"raise {field}parallelism (now {p.parallelism}: {p.completions} indexes run in "
            f"{waves_of(p)} waves)"
        )
    hints.append(f"choose a faster GPU ({field}placement.profile: Speed, or a faster {field}resources.gpu)")
    if spec is not None and spec.expected_duration:
        hints.append(
            f"lower {field}expectedDuration if runs are shorter than {spec.expected_duration} "
            "(its p90 is 1.5 times it)"
        )
    else:
        hints.append(f"set {field}expectedDuration if you know how long a run takes")
    hints.append(f"move {field}completeByTime later")
    return "; ".join(hints)


def _parts(plan: SlotPlan) -> str:
    """``5m0s start + 3h0m0s run``, or ``3 waves of 5m0s start + 3h0m0s run``."""
    boot, run = format_duration(_band_p90(plan.boot.p90)), format_duration(_band_p90(plan.run.p90))
    one = f"{boot} start + {run} run"
    waves = waves_of(plan)
    return f"{waves} waves of {one}" if waves > 1 else one


def _at_risk(
    request: EstimateRequest, reply: EstimateReply, deadline: Deadline, now: datetime
) -> EstimateWarning | None:
    slots = reply.slots
    if not slots or any(p.offering is None for p in slots):
        return None  # nothing can run it: the blocking reason is the answer
    if request.kind == "Sweep" and request.sweep_spec is not None:
        max_parallel = request.sweep_spec.max_parallel or DEFAULT_MAX_PARALLEL
        wall, what = sweep_p90(slots, max_parallel), "the last cell"
    else:
        max_parallel = 1
        wall, what = slot_p90(slots[0]), "the Job"
    finish = _ceil_second(now + wall)
    if finish <= deadline.at:
        return None
    if request.kind == "Sweep":
        each = "; ".join(f"cells {p.label}: {_parts(p)}" for p in sorted(slots, key=lambda p: p.first_cell))
        shape = f"{sum(p.cells for p in slots)} cells, {max_parallel} at a time; {each}"
    else:
        shape = _parts(slots[0])
    queued = any(w.code == "Queued" for w in reply.estimate.warnings)
    wait = "; no node is free now, so time waiting for capacity comes on top" if queued else ""
    return EstimateWarning(
        code=DEADLINE_AT_RISK,
        message=f"the p90 finish of {what} is {format_time(finish)} (now + {format_duration(wall)}: "
        f"{shape}, p90), {format_duration(finish - deadline.at)} after {deadline.field} {deadline.text}"
        f"{wait}. It is a hint: nothing is stopped at it. To finish in time: "
        f"{_fixes(request, slots, max_parallel)}",
    )


def deadline_warnings(request: EstimateRequest, reply: EstimateReply, now: datetime) -> list[EstimateWarning]:
    """DeadlinePassed or DeadlineAtRisk for the request's completeByTime; none without one."""
    deadline = deadline_of(request)
    if deadline is None:
        return []
    if deadline.at <= now:
        return [_passed(deadline, now)]
    risk = _at_risk(request, reply, deadline, now)
    return [risk] if risk is not None else []


def with_deadline_warnings(request: EstimateRequest, reply: EstimateReply, now: datetime) -> EstimateReply:
    """``reply`` with :func:`deadline_warnings` after the scheduler's other warnings."""
    found = deadline_warnings(request, reply, now)
    if not found:
        return reply
    warnings = [*reply.estimate.warnings, *found]
    return msgspec.structs.replace(reply, estimate=msgspec.structs.replace(reply.estimate, warnings=warnings))
