"""A Pipeline's estimate from its stages' (issue #22, ADR-0031): money summed, time along the critical path.

Pure. Each stage is estimated as the object it will create, by the scheduler and billing
(:mod:`nodus_gateway.staging`): a Job stage as a Job, a Sweep stage as a Sweep, a ``fromBest`` stage as its
template (which cell is best is known only once its Sweep ran). This module puts their answers together:

* ``costUSD`` and ``overheadUSD``: p50 the sum of the stages' p50, p90 the sum of their p90 (every stage runs
  once); left out when a stage has none (a stage blocked by capacity has no price);
* ``rateUSDPerHour``: the highest stage rate (what the ETag binds, ADR-0031's +10 % rule);
  ``pricebookVersion``: the stages' (every stage is asked at the newest); ``validUntil``: the earliest;
* ``warnings`` and ``blockingReasons``: every stage's, in stage order, the message led by
  ``stage <name>: `` and each field path it names moved under the stage (a Sweep stage's
  ``spec.maxParallel`` reads ``spec.stages[1].template.sweep.maxParallel``). A blocking reason of any
  stage refuses a create, as a Job's or Sweep's does;
* ``MaxCostBelowEstimate`` when the Pipeline's ``spec.maxCostUSD`` (one cap shared by every stage) is below
  the summed p50 ("likely") or p90 ("may"), as billing words it for a Job or Sweep;
* ``estimatedDuration`` (carried by :class:`PipelineEstimate` until it is written into status): the
  **critical path**, the longest chain of stages through ``dependsOn``, a stage starting when the last of
  its dependencies ends. A stage's own time is read from its slot plan as the scheduler's DeadlineAtRisk
  reads it: each wave of indexes (⌈completions ÷ parallelism⌉) takes the startup band (cold, and the
  download of the Volume revisions it mounts) plus the run band; a Sweep's cells run ``maxParallel`` at a
  time in cell order, each starting as one before it ends (⌈cells ÷ maxParallel⌉ waves of alike cells).
  p50 with p50 and p90 with p90, so the two may follow different chains. The ``CriticalPath`` warning names
  the p90's chain: ``prepare -> grid -> train -> evaluate: p50 1h2m0s, p90 1h40m0s``. Time spent waiting
  for capacity is not known in advance and comes on top. When a stage has no plan (blocked by capacity)
  there is no estimatedDuration: the blocking reason is the answer.

Not here: holds. The Pipeline's cap is shared by its stages and billing's to enforce, so ``holdUSD``,
``concurrentHoldUSD`` and ``minimumChargeUSD`` stay in each stage's own estimate, not summed here.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from nodus_schema.costs import BlockingReason, DurationBand, Estimate, EstimateWarning, USDBand
from nodus_schema.estimating import SlotPlan
from nodus_schema.meta import parse_time
from nodus_schema.quantities import format_duration, micros_to_usd, parse_duration, usd_to_micros

__all__ = [
    "CRITICAL_PATH",
    "PipelineEstimate",
    "StageEstimate",
    "combine",
    "critical_path",
    "rerooted",
    "stage_time",
]

CRITICAL_PATH: Final = "CriticalPath"
MAX_COST_BELOW_ESTIMATE: Final = "MaxCostBelowEstimate"
# A path the stage's own estimate names (``spec.maxCostUSD``, ``spec.template.spec.completeByTime``): "spec."
# that does not continue another path or word.
_SPEC_PATH: Final = re.compile(r"(?<![\w.\[/-])spec\.")


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """One stage's answer: its estimate (billing's, priced) and the scheduler's slot plan."""

    name: str
    kind: str
    """Job or Sweep."""
    at: str
    """The stage's spec on the wire: ``spec.stages[i].template.job`` or ``spec.stages[i].template.sweep``."""
    depends_on: tuple[str, ...]
    estimate: Estimate
    slots: tuple[SlotPlan, ...] = ()
    max_parallel: int = 1
    """A Sweep stage's spec.maxParallel (defaulted); 1 for a Job."""
    download: timedelta = timedelta(0)
    """The download of the Volume revisions a run mounts, added to each start (estimating.with_downloads)."""


class PipelineEstimate(Estimate):
    """A Pipeline's Estimate as the gateway carries it to the object: also the critical path's band, which
    ``status.estimatedDuration`` holds (an Estimate has no field for it). :meth:`plain` is what is stored
    in ``status.estimate``."""

    duration: DurationBand | None = None

    def plain(self) -> Estimate:
        return Estimate(**{f: getattr(self, f) for f in Estimate.__struct_fields__})


def rerooted(text: str | None, at: str) -> str | None:
    """``text`` with the paths of a stage's own object (``spec.…``) moved under ``at``, the stage's spec."""
    return _SPEC_PATH.sub(at + ".", text) if text else text


def _staged(stage: StageEstimate, text: str | None) -> str:
    return f"stage {stage.name}: {rerooted(text, stage.at) or ''}".rstrip()


# -- time ----------------------------------------------------------------------------------------------------
def _band(band: DurationBand, which: str) -> timedelta:
    text = band.p50 if which == "p50" else band.p90
    try:
        return parse_duration(text) if text else timedelta(0)
    except ValueError:
        return timedelta(0)


def _slot_time(plan: SlotPlan, which: str, download: timedelta) -> timedelta:
    """One Job (or one cell) of this slot: each wave of indexes starts (cold, with the download) and runs."""
    waves = -(-max(plan.completions, 1) // max(plan.parallelism, 1))
    return waves * (_band(plan.boot, which) + download + _band(plan.run, which))


def stage_time(stage: StageEstimate, which: str) -> timedelta | None:
    """The stage's wall time at ``which`` (``p50`` or ``p90``) from its slot plan; None without a plan (a
    slot nothing in the price book matches: the stage is blocked)."""
    if not stage.slots or any(p.offering is None for p in stage.slots):
        return None
    if stage.kind != "Sweep":
        return _slot_time(stage.slots[0], which, stage.download)
    free = [timedelta(0)] * max(stage.max_parallel, 1)  # when each of the parallel places is free again
    end = timedelta(0)
    for plan in sorted(stage.slots, key=lambda p: p.first_cell):
        took = _slot_time(plan, which, stage.download)
        for _ in range(max(plan.cells, 0)):
            start = heapq.heappop(free)
            end = max(end, start + took)
            heapq.heappush(free, start + took)
    return end


def critical_path(
    stages: Sequence[StageEstimate], times: dict[str, timedelta]
) -> tuple[timedelta, tuple[str, ...]]:
    """The longest chain through ``dependsOn`` (its total time and its stages, first to last), a stage
    taking ``times[name]``. Dependencies on unknown stages, and a cycle's closing edge, are not followed
    (validation refuses both before anything is estimated)."""
    deps = {s.name: s.depends_on for s in stages}
    done: dict[str, tuple[timedelta, tuple[str, ...]]] = {}
    visiting: set[str] = set()

    def finish(name: str) -> tuple[timedelta, tuple[str, ...]]:
        if name in done:
            return done[name]
        visiting.add(name)
        before: tuple[timedelta, tuple[str, ...]] = (timedelta(0), ())
        for dep in deps.get(name, ()):
            if dep in deps and dep not in visiting:
                candidate = finish(dep)
                if candidate[0] > before[0] or not before[1]:
                    before = candidate
        visiting.discard(name)
        done[name] = (before[0] + times.get(name, timedelta(0)), (*before[1], name))
        return done[name]

    best: tuple[timedelta, tuple[str, ...]] = (timedelta(0), ())
    for stage in stages:
        candidate = finish(stage.name)
        if candidate[0] > best[0] or not best[1]:
            best = candidate
    return best


def _critical(stages: Sequence[StageEstimate]) -> tuple[DurationBand, EstimateWarning] | None:
    """estimatedDuration and the CriticalPath warning; None when a stage has no plan."""
    bands: dict[str, dict[str, timedelta]] = {"p50": {}, "p90": {}}
    for stage in stages:
        for which, times in bands.items():
            took = stage_time(stage, which)
            if took is None:
                return None
            times[stage.name] = took
    p50, chain50 = critical_path(stages, bands["p50"])
    p90, chain90 = critical_path(stages, bands["p90"])
    band = DurationBand(p50=format_duration(p50), p90=format_duration(p90))
    other = f" (the p50's longest chain is {' -> '.join(chain50)})" if chain50 != chain90 else ""
    message = (
        f"{' -> '.join(chain90)}: p50 {band.p50}, p90 {band.p90}{other}. The longest chain of stages through "
        "dependsOn, each stage's startup and run (a Sweep's cells maxParallel at a time); time waiting for "
        "capacity comes on top"
    )
    return band, EstimateWarning(code=CRITICAL_PATH, message=message)


# -- money ---------------------------------------------------------------------------------------------------
def _micros(text: str | None) -> int | None:
    try:
        return usd_to_micros(text) if text else None
    except ValueError:
        return None


def _sum(bands: Sequence[USDBand | None]) -> USDBand | None:
    """The sum of every stage's band, p50 with p50 and p90 with p90; None when a stage has none."""
    totals = {"p50": 0, "p90": 0}
    for band in bands:
        for which in totals:
            amount = _micros(getattr(band, which, None)) if band is not None else None
            if amount is None:
                return None
            totals[which] += amount
    return USDBand(p50=micros_to_usd(totals["p50"]), p90=micros_to_usd(totals["p90"]))


def _cap_warning(cap_text: str | None, cost: USDBand | None) -> list[EstimateWarning]:
    cap = _micros(cap_text)
    p50, p90 = (_micros(cost.p50), _micros(cost.p90)) if cost is not None else (None, None)
    if cap is None or p50 is None or p90 is None:
        return []
    if cap < p50:
        likely = f"is likely to be reached (p50 cost {micros_to_usd(p50)} of every stage together)"
    elif cap < p90:
        likely = f"may be reached (p90 cost {micros_to_usd(p90)} of every stage together)"
    else:
        return []
    message = (
        f"spec.maxCostUSD {micros_to_usd(cap)} {likely}; it is shared by every stage, and reaching it "
        "suspends what runs with MaxCostReached"
    )
    return [EstimateWarning(code=MAX_COST_BELOW_ESTIMATE, message=message)]


def _earliest(stamps: Sequence[str | None]) -> str | None:
    known = [s for s in stamps if s]
    try:
        return min(known, key=parse_time) if known else None
    except ValueError:
        return min(known)


def _highest_rate(stages: Sequence[StageEstimate]) -> str | None:
    rates = [
        (m, s.estimate.rate_usd_per_hour) for s in stages if (m := _micros(s.estimate.rate_usd_per_hour))
    ]
    return max(rates)[1] if rates else None


# -- the whole -----------------------------------------------------------------------------------------------
def combine(stages: Sequence[StageEstimate], max_cost_usd: str | None = None) -> PipelineEstimate:
    """The Pipeline's estimate from its stages' (see the module's notes)."""
    warnings: list[EstimateWarning] = []
    blocking: list[BlockingReason] = []
    for stage in stages:
        warnings += [
            EstimateWarning(code=w.code, message=_staged(stage, w.message)) for w in stage.estimate.warnings
        ]
        blocking += [
            BlockingReason(code=b.code, message=_staged(stage, b.message), fix=rerooted(b.fix, stage.at))
            for b in stage.estimate.blocking_reasons
        ]
    cost = _sum([s.estimate.cost_usd for s in stages])
    warnings += _cap_warning(max_cost_usd, cost)
    critical = _critical(stages)
    if critical is not None:
        warnings.append(critical[1])
    versions = [s.estimate.pricebook_version for s in stages if s.estimate.pricebook_version]
    return PipelineEstimate(
        cost_usd=cost,
        overhead_usd=_sum([s.estimate.overhead_usd for s in stages]),
        rate_usd_per_hour=_highest_rate(stages),
        pricebook_version=versions[0] if versions else None,
        valid_until=_earliest([s.estimate.valid_until for s in stages]),
        warnings=warnings,
        blocking_reasons=blocking,
        duration=critical[0] if critical is not None else None,
    )
