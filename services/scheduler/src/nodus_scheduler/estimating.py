"""The scheduler's half of an estimate (ADR-031): which capacity a create would use, at what rate, how long.

Served on ``nodus.rpc.scheduler.estimate`` (queue group ``scheduler``, so replicas share the load). For
each slot of the request (a Job, or each distinct GPU × region of a Sweep) it answers the offering, its
rate, the run and startup bands, and two different kinds of "no":

* nothing in the price book can ever match (GPU, regions, offerings, rate cap) -> a *blocking* reason,
  CapacityUnavailable, with a fix: no amount of waiting helps;
* something matches but no node is free now -> a *warning*, Queued: the create is admitted and waits.

Money is billing's: this side fills no amount but the rate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit import errors, messaging
from nodus_kit.storing import ObjectStore
from nodus_scheduler.placing import Placement, place
from nodus_schema.attempts import ATTEMPT_TERMINAL, Attempt
from nodus_schema.catalog import Catalog, Offering, offering_matches
from nodus_schema.costs import BlockingReason, DurationBand, Estimate, EstimateWarning, PlacementPreview
from nodus_schema.estimating import (
    DEFAULT_ASSEMBLY_RETRIES,
    DEFAULT_ASSEMBLY_TIMEOUT,
    DEFAULT_EXPECTED_DURATION,
    ESTIMATE_SUBJECT,
    EstimateReply,
    EstimateRequest,
    SlotPlan,
    duration_band,
    startup_of,
    valid_until,
)
from nodus_schema.expanding import cell_job, expand
from nodus_schema.gpus import GPURequest, as_gpu_request, format_gpu, format_topology, has_string_form
from nodus_schema.jobs import JobSpec
from nodus_schema.nodes import Node
from nodus_schema.quantities import format_duration, micros_to_usd, usd_to_micros
from nodus_schema.sweeps import Sweep, SweepSpec

QUEUE = "scheduler"
_DEFAULT_RUN = format_duration(DEFAULT_EXPECTED_DURATION)


# ---------------------------------------------------------------------------------------------------------
# Which offering: the price book first (can anything ever match?), then the live nodes (is one free now?)
# ---------------------------------------------------------------------------------------------------------


def _request(spec: JobSpec) -> GPURequest | None:
    gpu = spec.resources.gpu if spec.resources else None
    return as_gpu_request(gpu) if gpu is not None else None


def _refusal(spec: JobSpec, offering: Offering, catalog: Catalog) -> str | None:
    """Why the price book's offering can never serve this spec, or None. The rules place() applies, plus
    the two it leaves to admission: maxRateUSDPerHour and interruptible: Never."""
    request = _request(spec)
    if request is not None and (why := offering_matches(request, offering, catalog)):
        return why
    p = spec.placement
    if p is None:
        return None
    if p.regions and offering.region_class not in p.regions:
        return "other region"
    if p.offerings and offering.id not in p.offerings:
        return "offering not allowed"
    if p.max_rate_usd_per_hour and offering.rate_micros_per_hour > usd_to_micros(p.max_rate_usd_per_hour):
        return "above maxRateUSDPerHour"
    if offering.interruptible and (p.interruptible or "Never") == "Never":
        return "interruptible"
    return None


def candidates(spec: JobSpec, catalog: Catalog) -> tuple[list[Offering], Counter[str]]:
    """The offerings that could ever serve the spec, best first, and why the others cannot."""
    fits: list[Offering] = []
    refused: Counter[str] = Counter()
    for offering in catalog.offerings:
        why = _refusal(spec, offering, catalog)
        if why:
            refused[why] += 1
        else:
            fits.append(offering)
    prefer_interruptible = spec.placement is not None and spec.placement.interruptible == "Prefer"
    # Cheapest first (as place() prefers); Prefer puts interruptible capacity ahead of any price.
    fits.sort(key=lambda o: (prefer_interruptible and not o.interruptible, o.rate_micros_per_hour, o.id))
    return fits, refused


@dataclass(frozen=True, slots=True)
class Choice:
    """The capacity a create would use now, or why none can serve it."""

    offering: Offering | None
    explain: str
    queued: str | None = None
    """Set when matching capacity exists in the price book but no node is free now."""


def choose(spec: JobSpec, catalog: Catalog, nodes: list[Node], busy: set[str], now: datetime) -> Choice:
    """A free node's offering if place() finds one within the price book's candidates, else the cheapest
    candidate (the create queues for it), else no offering with the price book's reasons."""
    fits, refused = candidates(spec, catalog)
    total = len(catalog.offerings)
    if not fits:
        detail = ", ".join(f"{n} {why}" for why, n in refused.most_common())
        return Choice(None, f"0/{total} offerings in price book {catalog.pricebook_version}: {detail}")
    placed = place(spec, nodes, busy, catalog, now)
    if isinstance(placed, Placement) and placed.offering in fits:
        node = placed.node.metadata.name or ""
        return Choice(
            placed.offering,
            f"{len(fits)}/{total} offerings match; node {node} ({placed.offering.id}) is free now",
        )
    why = placed.message if not isinstance(placed, Placement) else "the free nodes are outside the rate cap"
    cheapest = fits[0]
    return Choice(
        cheapest,
        f"{len(fits)}/{total} offerings match; {cheapest.id} is the cheapest; no node is free now ({why})",
        queued=why,
    )


# ---------------------------------------------------------------------------------------------------------
# Slots
# ---------------------------------------------------------------------------------------------------------


def _gang(spec: JobSpec) -> tuple[int, int | None]:
    """(nodes, gpus per node if known) of a spec; nodes is 1 for a plain Job."""
    d = spec.distributed
    request = _request(spec)
    per_node = (d.gpus_per_node if d else None) or (request.count if request else None)
    if d and d.nodes:
        return d.nodes, per_node
    if d and d.total_gpus and per_node:
        return max(1, d.total_gpus // per_node), per_node
    res_nodes = spec.resources.nodes if spec.resources else None
    return max(1, res_nodes or 1), per_node


def _gpu_label(spec: JobSpec) -> str:
    request = _request(spec)
    if request is None:
        return "no GPU"
    return format_gpu(request) if has_string_form(request) else ",".join(request.type)


@dataclass(frozen=True, slots=True)
class SlotEstimate:
    plan: SlotPlan
    choice: Choice
    assumed_duration: bool


def estimate_slot(
    spec: JobSpec, catalog: Catalog, nodes: list[Node], busy: set[str], now: datetime, *, label: str
) -> SlotEstimate:
    """One slot: its choice of capacity, its bands, and the plan billing prices."""
    p50, p90, assumed = duration_band(spec.expected_duration, spec.timeout)
    choice = choose(spec, catalog, nodes, busy, now)
    startup = startup_of(choice.offering)
    gang, _ = _gang(spec)
    d = spec.distributed
    completions = spec.completions or 1
    plan = SlotPlan(
        label=label,
        offering=choice.offering.id if choice.offering else None,
        rate_micros_per_hour=choice.offering.rate_micros_per_hour if choice.offering else None,
        nodes=gang,
        completions=completions,
        parallelism=min(spec.parallelism or 1, completions),
        run=DurationBand(p50=format_duration(p50), p90=format_duration(p90)),
        boot=startup.cold or DurationBand(),
        max_cost_usd=spec.max_cost_usd,
    )
    if gang > 1:
        retries = d.max_assembly_retries if d and d.max_assembly_retries is not None else None
        plan = msgspec.structs.replace(
            plan,
            assembly_timeout=(d.startup_timeout if d else None) or format_duration(DEFAULT_ASSEMBLY_TIMEOUT),
            assembly_tries=1 + (DEFAULT_ASSEMBLY_RETRIES if retries is None else retries),
        )
    return SlotEstimate(plan, choice, assumed)


def _cell_slots(
    sweep: SweepSpec, catalog: Catalog, nodes: list[Node], busy: set[str], now: datetime
) -> list[SlotEstimate]:
    """One slot per distinct gpu × region of the matrix; params and repetitions only multiply cells."""
    cells = expand(Sweep(spec=sweep))
    groups: dict[tuple[bytes, str | None], list[int]] = {}
    for cell in cells:
        key = (msgspec.json.encode(cell.gpu), cell.region)
        groups.setdefault(key, []).append(cell.index)
    out: list[SlotEstimate] = []
    for indexes in groups.values():
        first = cells[indexes[0]]
        spec = cell_job(Sweep(spec=sweep), first).spec
        label = _gpu_label(spec) + (f"/{first.region}" if first.region else "")
        slot = estimate_slot(spec, catalog, nodes, busy, now, label=label)
        plan = msgspec.structs.replace(slot.plan, cells=len(indexes), first_cell=first.index)
        out.append(SlotEstimate(plan, slot.choice, slot.assumed_duration))
    return out


# ---------------------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------------------


def _blocking(slot: SlotEstimate, kind: str) -> BlockingReason:
    where = "the Job" if kind == "Job" else f"cells {slot.plan.label} (from cell {slot.plan.first_cell})"
    return BlockingReason(
        code="CapacityUnavailable",
        message=f"nothing in the price book can run {where}: {slot.choice.explain}",
        fix=(
            "Widen placement: another GPU type or family in resources.gpu (or the Sweep's matrix.gpu), "
            "more placement.regions or placement.offerings, a higher placement.maxRateUSDPerHour, or "
            "placement.interruptible: Allow."
        ),
    )


def _warnings(slots: list[SlotEstimate], kind: str) -> list[EstimateWarning]:
    out: list[EstimateWarning] = []
    queued = [s for s in slots if s.choice.offering is not None and s.choice.queued]
    if queued:
        names = ", ".join(s.plan.label for s in queued) if kind == "Sweep" else "the Job"
        out.append(
            EstimateWarning(
                code="Queued",
                message=f"no node is free now for {names} ({queued[0].choice.queued}); "
                "the create is admitted and waits for capacity up to placement.queueTimeout",
            )
        )
    if any(s.assumed_duration for s in slots):
        out.append(
            EstimateWarning(
                code="ExpectedDurationAssumed",
                message=f"spec.expectedDuration is unset; costs assume {_DEFAULT_RUN} per index "
                "(p90 1.5x); set it for a tighter estimate",
            )
        )
    if any(s.choice.offering is not None and s.choice.offering.interruptible for s in slots):
        out.append(
            EstimateWarning(
                code="InterruptibleSelected",
                message="interruptible capacity was chosen: it can be reclaimed, and recovery resumes from "
                "the latest checkpoint",
            )
        )
    return out


def assemble(kind: str, slots: list[SlotEstimate], catalog: Catalog, now: datetime) -> EstimateReply:
    """The scheduler's reply: preview of the first slot that has capacity, rate, startup, notes, plan."""
    placed = [s for s in slots if s.choice.offering is not None]
    first = placed[0] if placed else None
    explain = "; ".join(f"{s.plan.label}: {s.choice.explain}" for s in slots) if kind == "Sweep" else None
    preview = None
    if first is not None and first.choice.offering is not None:
        offering = first.choice.offering
        preview = PlacementPreview(
            offering=offering.id,
            region_class=offering.region_class,
            interruptible=offering.interruptible,
            warm_reuse=False,  # no warm pool is kept yet: every start is a cold start
            explain=explain or first.choice.explain,
        )
    # A Sweep binds one rate: its most expensive cell's, so the +10 % ceiling holds for every cell.
    rates = [s.plan.rate_micros_per_hour for s in placed if s.plan.rate_micros_per_hour is not None]
    topology = None
    if kind == "Job" and first is not None and first.choice.offering and first.plan.nodes > 1:
        topology = format_topology(first.plan.nodes, first.choice.offering.gpus_per_node)
    estimate = Estimate(
        placement_preview=preview,
        pricebook_version=catalog.pricebook_version,
        rate_usd_per_hour=micros_to_usd(max(rates)) if rates else None,
        startup=startup_of(first.choice.offering if first else None),
        topology=topology,
        valid_until=valid_until(now),
        warnings=_warnings(slots, kind),
        blocking_reasons=[_blocking(s, kind) for s in slots if s.choice.offering is None],
    )
    return EstimateReply(estimate=estimate, slots=[s.plan for s in slots])


def estimate(
    request: EstimateRequest, catalog: Catalog, nodes: list[Node], busy: set[str], now: datetime
) -> EstimateReply:
    """The whole scheduler estimate for a request, pure given the nodes and the busy set."""
    if request.kind == "Job" and request.job_spec is not None:
        slot = estimate_slot(request.job_spec, catalog, nodes, busy, now, label="job")
        return assemble("Job", [slot], catalog, now)
    if request.kind == "Sweep" and request.sweep_spec is not None:
        return assemble("Sweep", _cell_slots(request.sweep_spec, catalog, nodes, busy, now), catalog, now)
    raise ValueError(f"kind {request.kind!r} needs its spec: Job with jobSpec, or Sweep with sweepSpec")


class Estimator:
    """The endpoint: reads the live nodes and busy set, then answers :func:`estimate`."""

    def __init__(self, nc: NATS, catalog: Catalog) -> None:
        self.catalog = catalog
        self.nodes = ObjectStore(nc, "nodes", Node)
        self.attempts = ObjectStore(nc, "attempts", Attempt)

    async def handle(self, request: EstimateRequest) -> EstimateReply:
        nodes = (await self.nodes.list()).items
        attempts = (await self.attempts.list()).items
        busy = {a.spec.node for a in attempts if a.status.phase not in ATTEMPT_TERMINAL}
        try:
            return estimate(request, self.catalog, nodes, busy, datetime.now(UTC))
        except ValueError as e:  # a spec the gateway should have refused: say so, do not crash
            raise errors.Invalid(str(e)) from None


async def serve_estimates(nc: NATS, catalog: Catalog, *, subject: str = ESTIMATE_SUBJECT) -> Any:
    """Serve ``nodus.rpc.scheduler.estimate`` in queue group ``scheduler``; returns the subscription."""
    return await messaging.serve(nc, subject, EstimateRequest, Estimator(nc, catalog).handle, queue=QUEUE)
