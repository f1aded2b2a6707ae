"""The scheduler's half of an estimate (ADR-031): which capacity a create would use, at what rate, how long.

Served on ``nodus.rpc.scheduler.estimate`` (queue group ``scheduler``, so replicas share the load). For
each slot of the request (a Job, or each distinct GPU × region of a Sweep) it answers the capacity, its
rate, the run and startup bands, and two different kinds of "no":

* nothing in the price book can ever match (GPU, regions, offerings, rate cap, interruptible policy) -> a
  *blocking* reason, CapacityUnavailable, with a fix: no amount of waiting helps;
* something matches but no node is free now -> a *warning*, Queued: the create is admitted and waits.

And one "no" that is not about capacity: a spec that names a GPU type, a region class or an offering the
catalog does not know (``NOSUCHGPU``, ``mars``) gets no estimate but field errors (``EstimateReply.invalid``,
:func:`unknown_names`), which the gateway answers as a 422 Invalid on the field, with the closest known
names: no wait makes an unknown name placeable, so a 503 would have a client retry for ever.

**Which capacity.** :func:`nodus_scheduler.placing.price_book_candidates` orders the price book as
:func:`~nodus_scheduler.placing.place` orders nodes (ADR-0014: Prefer first, then the profile, Balanced by
default; interruptible Allow by expected rate), at the request's price book version (the newest for a new
create). A free node that :func:`~nodus_scheduler.placing.place` picks wins; else the best candidate of the
price book is previewed and the create would queue for it.

**How long.** The run band of one index is ``spec.expectedDuration`` (p90 1.5 ×) when set, else the run
history of similar finished Jobs (``recalling.RunHistory``: same namespace, image, GPU request and gang
size; nearest-rank p50 and p90 of the most recent runs), else one hour (p90 1.5 ×), with warnings that say
which.

Money is billing's: this side fills no amount but the rate.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import msgspec

from nodus_scheduler.capacityfix import capacity_fix
from nodus_scheduler.cataloging import catalog_for
from nodus_scheduler.deadlining import with_deadline_warnings
from nodus_scheduler.estimateview import Capacity, candidates
from nodus_scheduler.placing import REASONS, Placement, demand_of, place, request_of
from nodus_scheduler.recalling import (
    DEFAULT,
    HISTORY,
    HistoryKey,
    RunBand,
    RunHistory,
    gang_of,
    history_key,
    run_band,
)
from nodus_scheduler.warmplanning import plan_warm, warm_note
from nodus_schema.catalog import Catalog, Offering
from nodus_schema.costs import BlockingReason, DurationBand, Estimate, EstimateWarning, PlacementPreview
from nodus_schema.errors import StatusCause
from nodus_schema.estimating import (
    DEFAULT_ASSEMBLY_RETRIES,
    DEFAULT_ASSEMBLY_TIMEOUT,
    DEFAULT_EXPECTED_DURATION,
    DEFAULT_MAX_PARALLEL,
    EstimateReply,
    EstimateRequest,
    SlotPlan,
    p90_of,
    startup_of,
    valid_until,
)
from nodus_schema.expanding import cell_job, expand
from nodus_schema.fielding import FieldError
from nodus_schema.gpus import format_gpu, format_topology, has_string_form
from nodus_schema.jobs import Job, JobSpec, JobStatus
from nodus_schema.meta import ObjectMeta
from nodus_schema.naming import KnownNames, known_names, unknown_job_names, unknown_sweep_names
from nodus_schema.nodes import Node
from nodus_schema.quantities import (
    duration_micros,
    format_duration,
    micros_to_usd,
    parse_duration,
)
from nodus_schema.sweeps import Sweep, SweepSpec

log = logging.getLogger(__name__)


COLD_START_SHARE_PERCENT: Final = 10
"""ColdStart is warned when the cold start's p90 is at least this share of the run's p50: then the start
is a visible part of the cost. Below it, the start is noise next to the run and warning every estimate
(every start is cold today) would teach people to ignore warnings."""


def _d(td: timedelta) -> str:
    return format_duration(td)


# ---------------------------------------------------------------------------------------------------------
# Which capacity: the price book first (can anything ever match?), then the live nodes (is one free now?)
# ---------------------------------------------------------------------------------------------------------


def _reason_rank(reason: str) -> int:
    if reason.startswith("not ") and reason.endswith(" GPUs per node"):
        return REASONS.index("not N GPUs per node")
    return REASONS.index(reason) if reason in REASONS else len(REASONS)


def refusals(refused: Counter[str]) -> str:
    """``32 other accelerator, 6 above maxRateUSDPerHour``: by count, then in the order of the rules."""
    ordered = sorted(refused.items(), key=lambda rn: (-rn[1], _reason_rank(rn[0]), rn[0]))
    return ", ".join(f"{n} {why}" for why, n in ordered)


@dataclass(frozen=True, slots=True)
class Choice:
    """The capacity a create would use now, or why none can serve it."""

    offering: Offering | None
    explain: str
    rate_micros_per_hour: int | None = None
    """The rate of one node of this capacity (the interruptible rate on interruptible capacity)."""
    interruptible: bool = False
    queued: str | None = None
    """Set when matching capacity exists in the price book but no node is free now: place()'s reasons."""


def choose(
    spec: JobSpec,
    catalog: Catalog,
    nodes: list[Node],
    busy: set[str],
    now: datetime,
    capacity: Capacity | None = None,
) -> Choice:
    """The free node :func:`place` picks (at ``catalog``'s price book version), else the best capacity of
    the price book in the same order (the create queues for it), else no capacity, with the price book's
    reasons. ``capacity``: the same nodes and busy set, indexed once for many estimates (the endpoint's)."""
    fits, refused = candidates(spec, catalog)
    total, version = len(catalog.offerings), catalog.pricebook_version
    if not fits:
        return Choice(None, f"0/{total} offerings in price book {version}: {refusals(refused)}")
    placed = (
        capacity.place(spec, catalog, now) if capacity is not None else place(spec, nodes, busy, catalog, now)
    )
    if isinstance(placed, Placement):
        return Choice(placed.offering, placed.explain, placed.rate_micros_per_hour, placed.interruptible)
    best, d = fits[0], demand_of(spec)
    matching = len({c.offering.id for c in fits})
    form = "interruptible" if best.interruptible else "on-demand"
    explain = (
        f"{best.offering.id} ({best.offering.region_class}, {form}) at "
        f"{micros_to_usd(best.rate_micros_per_hour)} USD/h: profile {d.profile}, interruptible "
        f"{d.interruptible}; {matching}/{total} offerings in price book {version} fit; "
        f"no node is free now ({placed.message})"
    )
    return Choice(
        best.offering, explain, best.rate_micros_per_hour, best.interruptible, queued=placed.message
    )


# ---------------------------------------------------------------------------------------------------------
# Slots
# ---------------------------------------------------------------------------------------------------------


def _gpu_label(spec: JobSpec) -> str:
    request = request_of(spec)
    if request is None:
        return "no GPU"
    return format_gpu(request) if has_string_form(request) else ",".join(request.type)


@dataclass(frozen=True, slots=True)
class SlotEstimate:
    plan: SlotPlan
    choice: Choice
    band: RunBand
    spec: JobSpec
    key: HistoryKey | None
    history: RunHistory | None = None

    @property
    def assumed_duration(self) -> bool:
        """No spec.expectedDuration and no history: the default hour was assumed."""
        return self.band.source == DEFAULT


def estimate_slot(
    spec: JobSpec,
    catalog: Catalog,
    nodes: list[Node],
    busy: set[str],
    now: datetime,
    *,
    label: str,
    namespace: str = "",
    history: RunHistory | None = None,
    warm: dict[str, str] | None = None,
    cells: int = 1,
    max_parallel: int | None = None,
    capacity: Capacity | None = None,
) -> SlotEstimate:
    """One slot: its choice of capacity, its bands, and the plan billing prices. ``warm``: the nodes kept
    warm now, with their project (warmplanning.kept_warm); ``cells`` and ``max_parallel``: a Sweep's;
    ``capacity``: ``nodes``, ``busy`` and ``warm`` indexed once for many estimates (the endpoint's)."""
    key = history_key(namespace, spec)
    band = run_band(spec, key, history)
    gang, _ = gang_of(spec)
    d = spec.distributed
    completions = spec.completions or 1
    runs = completions * cells
    limit = min(max_parallel, runs) if max_parallel else min(spec.parallelism or 1, completions)
    kept = warm or {}
    open_index = capacity.open_to(namespace, now) if capacity is not None else None
    wp = plan_warm(
        spec, catalog, nodes, kept, namespace, now, runs=runs, limit=limit, gang=gang, open_index=open_index
    )
    if wp.reuse_now is not None:
        p = wp.reuse_now
        explain = p.explain + "; warm: kept for this project"
        choice = Choice(p.offering, explain, p.rate_micros_per_hour, p.interruptible)
    else:
        choice = choose(spec, catalog, nodes, busy | set(kept), now, capacity)
    startup = startup_of(choice.offering)
    plan = SlotPlan(
        label=label,
        offering=choice.offering.id if choice.offering else None,
        rate_micros_per_hour=choice.rate_micros_per_hour if choice.offering else None,
        interruptible=choice.interruptible,
        nodes=gang,
        completions=completions,
        parallelism=min(spec.parallelism or 1, completions),
        run=DurationBand(p50=_d(band.p50), p90=_d(band.p90)),
        boot=startup.cold or DurationBand(),
        warm_boot=startup.warm,
        warm_starts=wp.warm_starts * gang,
        warm_window=spec.scaledown_window if wp.tails else None,
        warm_tails=wp.tails,
        max_cost_usd=spec.max_cost_usd,
    )
    if gang > 1:
        retries = d.max_assembly_retries if d and d.max_assembly_retries is not None else None
        plan = msgspec.structs.replace(
            plan,
            assembly_timeout=(d.startup_timeout if d else None) or _d(DEFAULT_ASSEMBLY_TIMEOUT),
            assembly_tries=1 + (DEFAULT_ASSEMBLY_RETRIES if retries is None else retries),
        )
    return SlotEstimate(plan, choice, band, spec, key, history)


def _cell_slots(
    sweep: SweepSpec,
    catalog: Catalog,
    nodes: list[Node],
    busy: set[str],
    now: datetime,
    *,
    namespace: str = "",
    history: RunHistory | None = None,
    warm: dict[str, str] | None = None,
    capacity: Capacity | None = None,
) -> list[SlotEstimate]:
    """One slot per distinct gpu × region of the matrix; params and repetitions only multiply cells."""
    whole = Sweep(metadata=ObjectMeta(namespace=namespace), spec=sweep)
    cells = expand(whole)
    groups: dict[tuple[bytes, str | None], list[int]] = {}
    for cell in cells:
        key = (msgspec.json.encode(cell.gpu), cell.region)
        groups.setdefault(key, []).append(cell.index)
    out: list[SlotEstimate] = []
    for indexes in groups.values():
        first = cells[indexes[0]]
        spec = cell_job(whole, first).spec
        label = _gpu_label(spec) + (f"/{first.region}" if first.region else "")
        slot = estimate_slot(
            spec,
            catalog,
            nodes,
            busy,
            now,
            label=label,
            namespace=namespace,
            history=history,
            warm=warm,
            cells=len(indexes),
            max_parallel=sweep.max_parallel or DEFAULT_MAX_PARALLEL,
            capacity=capacity,
        )
        plan = msgspec.structs.replace(slot.plan, cells=len(indexes), first_cell=first.index)
        out.append(SlotEstimate(plan, slot.choice, slot.band, spec, slot.key, history))
    return out


# ---------------------------------------------------------------------------------------------------------
# Blocking reasons and their fix
# ---------------------------------------------------------------------------------------------------------


def _blocking(slot: SlotEstimate, kind: str, catalog: Catalog) -> BlockingReason:
    where = "the Job" if kind == "Job" else f"cells {slot.plan.label} (from cell {slot.plan.first_cell})"
    return BlockingReason(
        code="CapacityUnavailable",
        message=f"nothing in the price book can run {where}: {slot.choice.explain}",
        fix=capacity_fix(slot.spec, catalog, kind),
    )


# ---------------------------------------------------------------------------------------------------------
# Warnings
# ---------------------------------------------------------------------------------------------------------


def _which(slots: list[SlotEstimate], kind: str) -> str:
    return "the Job" if kind == "Job" else "cells " + ", ".join(s.plan.label for s in slots)


def _key_text(key: HistoryKey) -> str:
    gpu = "no GPU" if key.gpu == "-" else f"GPU {key.gpu}"
    gang = f", {key.nodes} nodes" if key.nodes > 1 else ""
    return f"image {key.image} and {gpu}{gang} in namespace {key.namespace}"


def _duration_warnings(slots: list[SlotEstimate], kind: str) -> list[EstimateWarning]:
    out: list[EstimateWarning] = []
    learned = [s for s in slots if s.band.source == HISTORY]
    if learned:
        s = learned[0]
        key = f" ({_key_text(s.key)})" if s.key is not None and kind == "Job" else ""
        out.append(
            EstimateWarning(
                code="DurationFromHistory",
                message=f"spec.expectedDuration is unset: the run band of {_which(learned, kind)} is the "
                f"p50 {_d(s.band.p50)} and p90 {_d(s.band.p90)} of the last {s.band.runs} succeeded "
                f"similar Jobs{key}",
            )
        )
    assumed = [s for s in slots if s.band.source == DEFAULT]
    if assumed:
        s = assumed[0]
        why = s.history.why_none(s.key) if s.history is not None else "no run history is kept"
        out.append(
            EstimateWarning(
                code="NoHistory",
                message=f"no run history for {_which(assumed, kind)}: {why}",
            )
        )
        out.append(
            EstimateWarning(
                code="DefaultDuration",
                message=f"spec.expectedDuration is unset and there is no run history: costs assume the "
                f"default {_d(DEFAULT_EXPECTED_DURATION)} per index "
                f"(p90 {_d(p90_of(DEFAULT_EXPECTED_DURATION))}); set spec.expectedDuration for a tighter "
                "estimate",
            )
        )
    capped = [s for s in slots if s.band.uncapped is not None]
    if capped:
        s = capped[0]
        p50, p90 = s.band.uncapped or (s.band.p50, s.band.p90)
        likely = (
            f"even the median run ({_d(p50)}) is longer, so the Job will likely fail"
            if p50 > s.band.p90
            else "a run that long fails"
        )
        out.append(
            EstimateWarning(
                code="TimeoutBelowDuration",
                message=f"spec.timeout {_d(s.band.p90)} is below the run band's p90 {_d(p90)} for "
                f"{_which(capped, kind)}: {likely} with DeadlineExceeded; costs are capped at the timeout",
            )
        )
    return out


def _cold_start(slots: list[SlotEstimate], kind: str) -> EstimateWarning | None:
    """ColdStart: every start is cold (no warm capacity is kept), and for these slots it is a visible part
    of the run (cold p90 ≥ COLD_START_SHARE_PERCENT % of the run's p50)."""
    cold: list[tuple[SlotEstimate, timedelta, timedelta]] = []
    for s in slots:
        if s.choice.offering is None or s.plan.warm_starts:
            continue  # (a slot that reuses warm capacity says so in WarmWindow)
        band = startup_of(s.choice.offering).cold
        if band is None or band.p50 is None or band.p90 is None:
            continue
        p50, p90 = parse_duration(band.p50), parse_duration(band.p90)
        if duration_micros(p90) * 100 >= duration_micros(s.band.p50) * COLD_START_SHARE_PERCENT:
            cold.append((s, p50, p90))
    if not cold:
        return None
    s, p50, p90 = cold[0]
    run = duration_micros(s.band.p50)
    share = f"{duration_micros(p90) * 100 // run} % of" if run else "longer than"
    offering = s.choice.offering.id if s.choice.offering else ""
    return EstimateWarning(
        code="ColdStart",
        message=f"no warm capacity would be reused for {_which([c[0] for c in cold], kind)}: each node "
        f"starts cold in {_d(p50)} (p50) to {_d(p90)} (p90) on {offering}, billed as Boot; its p90 is "
        f"{share} the run's p50 {_d(s.band.p50)}",
    )


def _interruptible(slots: list[SlotEstimate], kind: str) -> EstimateWarning | None:
    chosen = [s for s in slots if s.choice.offering is not None and s.choice.interruptible]
    if not chosen:
        return None
    s = chosen[0]
    offering = s.choice.offering
    assert offering is not None
    on_demand = (
        f" (on-demand {micros_to_usd(offering.rate_micros_per_hour)} USD/h)"
        if not offering.interruptible
        else ""
    )
    recovery = s.spec.recovery
    restart = (
        "starts over from the beginning (recovery.continuity: Ephemeral)"
        if recovery is not None and recovery.continuity == "Ephemeral"
        else "resumes from its latest checkpoint on new capacity"
    )
    return EstimateWarning(
        code="InterruptibleSelected",
        message=f"interruptible capacity was chosen for {_which(chosen, kind)}: {offering.id} at "
        f"{micros_to_usd(s.choice.rate_micros_per_hour or 0)} USD/h{on_demand}; the provider can reclaim "
        f"it, and a reclaimed run {restart}",
    )


def _warnings(slots: list[SlotEstimate], kind: str) -> list[EstimateWarning]:
    out: list[EstimateWarning] = []
    queued = [s for s in slots if s.choice.offering is not None and s.choice.queued]
    if queued:
        out.append(
            EstimateWarning(
                code="Queued",
                message=f"no node is free now for {_which(queued, kind)} ({queued[0].choice.queued}); "
                "the create is admitted and waits for capacity up to placement.queueTimeout",
            )
        )
    out += _duration_warnings(slots, kind)
    notes = (_cold_start(slots, kind), warm_window_note(slots, kind), _interruptible(slots, kind))
    out += [w for w in notes if w is not None]
    return out


def warm_window_note(slots: list[SlotEstimate], kind: str) -> EstimateWarning | None:
    """WarmWindow: how many starts reuse warm capacity, what the windows after the last runs cost."""
    warm = [s for s in slots if s.choice.offering is not None and (s.plan.warm_starts or s.plan.warm_tails)]
    return warm_note([s.plan for s in warm], _which(warm, kind)) if warm else None


# ---------------------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------------------


def book_for(request: EstimateRequest, catalog: Catalog) -> tuple[Catalog, EstimateWarning | None]:
    """The price book version to estimate at: the request's (an existing object's recorded version, through
    :func:`~nodus_scheduler.cataloging.catalog_for`), else the newest (a new create). A version this
    scheduler does not ship is priced at the newest, with a PricebookUnknown warning."""
    asked = request.pricebook_version
    if not asked:
        return catalog.latest(), None
    probe = Job(
        metadata=ObjectMeta(namespace=request.namespace),
        status=JobStatus(estimate=Estimate(pricebook_version=asked)),
    )
    book = catalog_for(probe, catalog)
    if book.pricebook_version == asked:
        return book, None
    return book, EstimateWarning(
        code="PricebookUnknown",
        message=f"price book {asked} is not one this scheduler ships ({', '.join(catalog.versions())}); "
        f"priced at the newest, {book.pricebook_version}",
    )


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
            interruptible=first.choice.interruptible,
            warm_reuse=any(s.plan.warm_starts > 0 for s in placed),
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
        blocking_reasons=[_blocking(s, kind, catalog) for s in slots if s.choice.offering is None],
    )
    return EstimateReply(estimate=estimate, slots=[s.plan for s in slots])


# Per catalog object (one per price book version, kept alive by the Estimator): its names, built once.
_catalog_names: dict[int, tuple[Catalog, KnownNames]] = {}


def _names_of(catalog: Catalog) -> KnownNames:
    held = _catalog_names.get(id(catalog))
    if held is None or held[0] is not catalog:
        if len(_catalog_names) > 16:
            _catalog_names.clear()
        held = _catalog_names[id(catalog)] = (catalog, known_names(catalog))
    return held[1]


def unknown_names(request: EstimateRequest, catalog: Catalog, nodes: list[Node]) -> list[StatusCause]:
    """The names of the request's spec that neither the catalog nor a registered node knows (GPU types and
    families, region classes, offerings), as causes for a 422: the spec's mistake, which no capacity and no
    wait can fix, unlike a known name nothing sells (a blocking CapacityUnavailable)."""

    def unknown(names: KnownNames) -> list[FieldError]:
        if request.kind == "Sweep" and request.sweep_spec is not None:
            return unknown_sweep_names(request.sweep_spec, names)
        if request.job_spec is not None:
            return unknown_job_names(request.job_spec, names)
        return []

    found = unknown(_names_of(catalog))
    if found and nodes:  # the nodes' region classes and offerings count too (looked at only when needed)
        found = unknown(known_names(catalog, nodes))
    return [StatusCause(field=e.field, message=e.message, reason=str(e.reason)) for e in found]


def estimate(
    request: EstimateRequest,
    catalog: Catalog,
    nodes: list[Node],
    busy: set[str],
    now: datetime,
    *,
    history: RunHistory | None = None,
    warm: dict[str, str] | None = None,
    capacity: Capacity | None = None,
) -> EstimateReply:
    """The whole scheduler estimate for a request, pure given the nodes, the busy set, the nodes kept warm
    (``warm``: node -> project) and the history; or, for a spec that names what the catalog does not know,
    only those names (``invalid``). ``capacity``: the same three indexed once (:class:`Capacity`), which
    answers the same as the lists, faster."""
    invalid = unknown_names(request, catalog, nodes)
    if invalid:
        return EstimateReply(invalid=invalid)
    book, note = book_for(request, catalog)
    ns = request.namespace
    if request.kind == "Job" and request.job_spec is not None:
        slot = estimate_slot(
            request.job_spec,
            book,
            nodes,
            busy,
            now,
            label="job",
            namespace=ns,
            history=history,
            warm=warm,
            capacity=capacity,
        )
        reply = assemble("Job", [slot], book, now)
    elif request.kind == "Sweep" and request.sweep_spec is not None:
        slots = _cell_slots(
            request.sweep_spec,
            book,
            nodes,
            busy,
            now,
            namespace=ns,
            history=history,
            warm=warm,
            capacity=capacity,
        )
        reply = assemble("Sweep", slots, book, now)
    else:
        raise ValueError(f"kind {request.kind!r} needs its spec: Job with jobSpec, or Sweep with sweepSpec")
    if note is not None:
        warnings = [note, *reply.estimate.warnings]
        reply = msgspec.structs.replace(
            reply, estimate=msgspec.structs.replace(reply.estimate, warnings=warnings)
        )
    return with_deadline_warnings(request, reply, now)  # DeadlinePassed, DeadlineAtRisk (issue #21)
