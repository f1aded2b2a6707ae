"""Placement: the best free, ready node whose capacity fits a Job, or why none does (ADR-0009, ADR-0014).

Two entry points, one rule:

* :func:`place_in` (and :func:`place_demand`) place against a long-lived :class:`CapacityIndex`. The request
  is judged once per *group* of nodes (offering × region class × pool × interruptible: tens, not
  thousands), and the judgement is cached per distinct request and price book version, so a placement
  costs a walk down the ranked groups to the first one with a free node. The caller marks the chosen node
  busy (``index.mark_busy``) once it has claimed it.
* :func:`place` keeps the original signature (``place(spec, nodes, busy, catalog, now, ceiling_micros=)``):
  it builds an index of ``nodes`` and places in it. O(nodes) per call; fine for estimates and small pools.

**Matching** (the reference; :mod:`nodus_schema.catalog`): a family matches any of its variants and never
another family; ``exact`` pins the variant; ``count`` equals the offering's GPUs per node;
``interconnect: NVLink`` and ``minMemory`` are floors; resources ``cpu``, ``memory`` and ``disk`` are floors
on the offering's host shape; ``placement.regions`` (the node's region class), ``placement.offerings`` and
``placement.pool`` restrict; ``interruptible: Never`` excludes interruptible capacity;
``maxRateUSDPerHour`` and the bound rate of an estimate (ADR-031, the annotation read by
:func:`rate_ceiling_of`) cap the rate the node would be charged at (the interruptible rate on interruptible
capacity).

**Order** (ADR-0014): ``Prefer`` puts interruptible capacity first; then the profile (Cost: the lowest
expected rate; Speed: the most TFLOPS per node, then the shortest cold start; Balanced: the lowest expected
rate per TFLOPS), with the node name last, so placement is deterministic. The expected rate of interruptible
capacity is its rate plus :data:`INTERRUPTIBLE_RISK_PERCENT`, which is how ``Allow`` decides by expected
cost.

**Reasons**: every unplaced Job says why, Kubernetes-style, each node counted once under its first failing
reason in the order of :data:`REASONS`, the reasons listed by count (then that order):
``0/40 nodes: 24 other accelerator, 10 busy, 6 above maxRateUSDPerHour``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from typing import Final

from nodus_scheduler.capacity import HEARTBEAT_GRACE, CapacityIndex, Group
from nodus_schema.catalog import Catalog, Offering, variant_refusal
from nodus_schema.defaulting import DEFAULT_INTERRUPTIBLE, DEFAULT_PROFILE
from nodus_schema.estimating import RATE_CEILING_ANNOTATION
from nodus_schema.gpus import GPURequest, as_gpu_request
from nodus_schema.jobs import JobSpec
from nodus_schema.meta import ObjectMeta
from nodus_schema.nodes import Node
from nodus_schema.quantities import micros_to_usd, parse_bytes, parse_cpu_millis, usd_to_micros

__all__ = [
    "HEARTBEAT_GRACE",
    "INTERRUPTIBLE_RISK_PERCENT",
    "PROFILES",
    "REASONS",
    "Candidate",
    "Demand",
    "NoPlacement",
    "Placement",
    "demand_of",
    "place",
    "place_demand",
    "place_in",
    "price_book_candidates",
    "rate_ceiling_of",
    "request_of",
]

REASONS: Final = (
    "not in price book",
    "other accelerator",
    "not NVLink",
    "below minMemory",
    "not N GPUs per node",
    "too few CPUs",
    "too little memory",
    "too little disk",
    "other region",
    "offering not allowed",
    "other pool",
    "interruptible",
    "above maxRateUSDPerHour",
    "above the bound rate",
    "drained",
    "not ready",
    "busy",
)
"""Why a node cannot take a Job, in the order checked: what the capacity is, where it is, what it costs,
then its state. A node counts once, under the first that applies. ``not N GPUs per node`` is written with
the count asked for (``not 8 GPUs per node``). ``drained`` is a node its agent took out of placement (phase
Draining: a GPU fault, ADR-0022), apart from ``not ready`` (down, cordoned or silent)."""
_RANK: Final = {r: i for i, r in enumerate(REASONS)}
_COUNT_RANK: Final = _RANK["not N GPUs per node"]

PROFILES: Final = ("Balanced", "Cost", "Speed")
INTERRUPTIBLE_RISK_PERCENT: Final = 25
"""What interruptible capacity is expected to cost on top of its rate: reclaims, the restores after them and
the work since the last checkpoint. ``Allow`` takes interruptible capacity when its rate plus this much still
ranks first (under Cost: when it is below 80 % of the on-demand rate)."""
DEFAULT_COLD_HIGH_S: Final = 300
"""The cold startup high band assumed for an offering without startup bands (ADR-031's default p90)."""


# ---------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """The node chosen, its offering, and what the Attempt is charged and recorded at."""

    node: Node
    offering: Offering
    rate_micros_per_hour: int
    """The rate of this node: the offering's interruptible rate on interruptible capacity, else on-demand."""
    interruptible: bool
    pricebook_version: str
    explain: str = ""
    warm_from: str | None = None
    """The finished Attempt whose warm window this placement reuses (the node was kept for the project)."""


@dataclass(frozen=True, slots=True)
class NoPlacement:
    message: str


# ---------------------------------------------------------------------------------------------------------
# The request, compiled once
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Demand:
    """What a Job asks of one node, normalised and hashable (judgements are cached per distinct Demand)."""

    gpu_types: tuple[str, ...] | None = None
    """None: no GPU request (any offering's GPUs will do)."""
    exact: bool = False
    count: int = 1
    interconnect: str | None = None
    min_memory: str | None = None
    cpu_millis: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    regions: frozenset[str] = frozenset()
    offerings: frozenset[str] = frozenset()
    pool: str | None = None
    interruptible: str = DEFAULT_INTERRUPTIBLE
    max_rate_micros: int | None = None
    ceiling_micros: int | None = None
    profile: str = DEFAULT_PROFILE

    def gpu_request(self) -> GPURequest | None:
        if self.gpu_types is None:
            return None
        return GPURequest(
            type=list(self.gpu_types),
            exact=self.exact,
            count=self.count,
            interconnect=self.interconnect,
            min_memory=self.min_memory,
        )


def request_of(spec: JobSpec) -> GPURequest | None:
    gpu = spec.resources.gpu if spec.resources else None
    return as_gpu_request(gpu) if gpu is not None else None


def demand_of(spec: JobSpec, ceiling_micros: int | None = None) -> Demand:
    """The Demand of a Job spec; unset fields mean what defaulting would write (Never, Balanced)."""
    request = request_of(spec)
    res = spec.resources
    p = spec.placement
    interruptible = (p.interruptible if p else None) or DEFAULT_INTERRUPTIBLE
    profile = (p.profile if p else None) or DEFAULT_PROFILE
    return Demand(
        gpu_types=tuple(request.type) if request is not None else None,
        exact=bool(request.exact) if request is not None else False,
        count=(request.count or 1) if request is not None else 1,
        interconnect=request.interconnect if request is not None else None,
        min_memory=request.min_memory if request is not None else None,
        cpu_millis=parse_cpu_millis(res.cpu) if res and res.cpu else 0,
        memory_bytes=parse_bytes(res.memory) if res and res.memory else 0,
        disk_bytes=parse_bytes(res.disk) if res and res.disk else 0,
        regions=frozenset(p.regions) if p and p.regions else frozenset(),
        offerings=frozenset(p.offerings) if p and p.offerings else frozenset(),
        pool=(p.pool or None) if p else None,
        interruptible=interruptible
        if interruptible in ("Never", "Allow", "Prefer")
        else DEFAULT_INTERRUPTIBLE,
        max_rate_micros=usd_to_micros(p.max_rate_usd_per_hour) if p and p.max_rate_usd_per_hour else None,
        ceiling_micros=ceiling_micros,
        profile=profile if profile in PROFILES else DEFAULT_PROFILE,
    )


def rate_ceiling_of(meta: ObjectMeta) -> int | None:
    """The highest node rate (micro-dollars per hour) the object may be placed at, from its
    :data:`RATE_CEILING_ANNOTATION` (set by the gateway on a create bound by If-Match), or None.

    A value that is not a whole number is ignored: the gateway writes the annotation, users cannot."""
    text = meta.annotations.get(RATE_CEILING_ANNOTATION, "").strip()
    return int(text) if text.isdigit() else None


# ---------------------------------------------------------------------------------------------------------
# Judging one group of nodes (or one offering of the price book)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """Capacity that fits a Demand, with its place in the order (lower ``order`` is better)."""

    order: tuple[object, ...]
    offering: Offering
    rate_micros_per_hour: int
    interruptible: bool


def _judge(
    d: Demand,
    request: GPURequest | None,
    book: Catalog,
    offering_id: str,
    region_class: str,
    pool: str | None,
    interruptible: bool,
) -> Candidate | tuple[int, str]:
    """A Candidate, or (rank, reason) of the first rule the capacity fails."""
    offering = book.offering(offering_id)
    if offering is None:
        return _RANK["not in price book"], "not in price book"
    interruptible = interruptible or offering.interruptible
    rate = offering.rate_for(interruptible)
    variant = book.variant(offering.variant)
    if rate is None or variant is None:
        return _RANK["not in price book"], "not in price book"  # capacity this book does not sell
    if request is not None:
        why = variant_refusal(request, variant)
        if why:
            return _RANK[why], why
        if d.count != offering.gpus_per_node:
            return _COUNT_RANK, f"not {d.count} GPUs per node"
    host = offering.host
    if d.cpu_millis and parse_cpu_millis(host.cpu) < d.cpu_millis:
        return _RANK["too few CPUs"], "too few CPUs"
    if d.memory_bytes and parse_bytes(host.memory) < d.memory_bytes:
        return _RANK["too little memory"], "too little memory"
    if d.disk_bytes and parse_bytes(host.disk) < d.disk_bytes:
        return _RANK["too little disk"], "too little disk"
    if d.regions and region_class not in d.regions:
        return _RANK["other region"], "other region"
    if d.offerings and offering.id not in d.offerings:
        return _RANK["offering not allowed"], "offering not allowed"
    if pool != d.pool:
        return _RANK["other pool"], "other pool"
    if interruptible and d.interruptible == "Never":
        return _RANK["interruptible"], "interruptible"
    if d.max_rate_micros is not None and rate > d.max_rate_micros:
        return _RANK["above maxRateUSDPerHour"], "above maxRateUSDPerHour"
    if d.ceiling_micros is not None and rate > d.ceiling_micros:
        return _RANK["above the bound rate"], "above the bound rate"
    tflops = variant.tflops * offering.gpus_per_node
    return Candidate(_order(d, offering, tflops, rate, interruptible), offering, rate, interruptible)


def expected_rate(rate: int, interruptible: bool) -> int:
    """The rate the order compares: interruptible capacity costs its rate plus the risk allowance (up)."""
    return rate if not interruptible else -(-rate * (100 + INTERRUPTIBLE_RISK_PERCENT) // 100)


def _order(d: Demand, offering: Offering, tflops: int, rate: int, interruptible: bool) -> tuple[object, ...]:
    """The sort key of fitting capacity under the Demand's profile and interruptible policy (ADR-0014)."""
    first = 1 if d.interruptible == "Prefer" and not interruptible else 0
    expected = expected_rate(rate, interruptible)
    cold = offering.startup.cold.high_seconds if offering.startup else DEFAULT_COLD_HIGH_S
    if d.profile == "Cost":
        return (first, expected, -tflops, cold)
    if d.profile == "Speed":
        return (first, tflops == 0, -tflops, cold, expected)
    return (first, tflops == 0, Fraction(expected, tflops or 1), cold, expected)  # Balanced


# ---------------------------------------------------------------------------------------------------------
# Placing against the index
# ---------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Plan:
    """A Demand judged against every group of an index at one price book version."""

    book: Catalog
    generation: int
    fits: list[tuple[Candidate, Group]]
    """Sorted by Candidate.order."""
    refused: list[tuple[int, str, Group]]


_MAX_PLANS: Final = 4096


def _plan(index: CapacityIndex, d: Demand, book: Catalog) -> _Plan:
    cache_key = (d, book.pricebook_version)
    plan: _Plan | None = index.plans.get(cache_key)
    if plan is not None and plan.book is book and plan.generation == index.generation:
        return plan
    request = d.gpu_request()
    fits: list[tuple[Candidate, Group]] = []
    refused: list[tuple[int, str, Group]] = []
    for g in index.groups():
        judged = _judge(d, request, book, g.offering, g.region_class, g.pool, g.interruptible)
        if isinstance(judged, Candidate):
            fits.append((judged, g))
        else:
            refused.append((judged[0], judged[1], g))
    fits.sort(key=lambda f: f[0].order)
    plan = _Plan(book, index.generation, fits, refused)
    if len(index.plans) >= _MAX_PLANS:
        index.plans.clear()
    index.plans[cache_key] = plan
    return plan


def place_demand(
    index: CapacityIndex,
    demand: Demand,
    catalog: Catalog,
    now: datetime | None = None,
    *,
    warm_for: str | None = None,
) -> Placement | NoPlacement:
    """The best free, ready node of ``index`` for ``demand`` at the price book of ``catalog`` (see the module
    docstring), or why there is none. Does not mark the node busy: the caller does, once it has claimed it.

    ``warm_for``: the project (namespace) asking. A node kept warm for it that fits goes first, before any
    free node however well ranked (issue #21: only its container starts there)."""
    index.expire(now or datetime.now(UTC))
    if not len(index):
        return NoPlacement("0/0 nodes: no node agent is registered")
    plan = _plan(index, demand, catalog)
    fits = plan.fits
    if warm_for is not None:
        warm = _warm_pick(index, plan, warm_for)
        if warm is not None:
            return _placement(index, demand, catalog, plan, *warm)
    i, n = 0, len(fits)
    while i < n:
        order = fits[i][0].order
        best: tuple[str, Candidate, Group] | None = None
        j = i
        while j < n and fits[j][0].order == order:  # equally good groups: the smallest free name wins
            candidate, group = fits[j]
            name = group.first_free()
            if name is not None and (best is None or name < best[0]):
                best = (name, candidate, group)
            j += 1
        if best is not None:
            return _placement(index, demand, catalog, plan, *best)
        i = j
    return NoPlacement(_message(index, plan))


def fitting_ready(index: CapacityIndex, demand: Demand, catalog: Catalog) -> int:
    """How many ready nodes of ``index`` fit ``demand`` (busy or not): the most runs that can go at once."""
    plan = _plan(index, demand, catalog)
    return sum(g.total - g.not_ready - g.drained for _, g in plan.fits)


def _warm_pick(index: CapacityIndex, plan: _Plan, namespace: str) -> tuple[str, Candidate, Group] | None:
    """The best-ranked fitting group's node kept warm for ``namespace`` (the smallest name among equals)."""
    for candidate, group in plan.fits:
        name = index.first_warm(group, namespace)
        if name is not None:
            return name, candidate, group
    return None


def place_in(
    index: CapacityIndex,
    spec: JobSpec,
    catalog: Catalog,
    now: datetime | None = None,
    *,
    ceiling_micros: int | None = None,
    warm_for: str | None = None,
) -> Placement | NoPlacement:
    """:func:`place_demand` for a Job spec (and the bound rate of its estimate, :func:`rate_ceiling_of`)."""
    return place_demand(index, demand_of(spec, ceiling_micros), catalog, now, warm_for=warm_for)


def _placement(
    index: CapacityIndex, d: Demand, book: Catalog, plan: _Plan, name: str, c: Candidate, group: Group
) -> Placement:
    node = index.node(name)
    assert node is not None  # a free name is always a known node
    warm = index.warm(name)
    capacity = "interruptible" if c.interruptible else "on-demand"
    pool = f", pool {group.pool}" if group.pool else ""
    fitting = sum(g.total for _, g in plan.fits)
    free = sum(g.free for _, g in plan.fits)
    usd = micros_to_usd(c.rate_micros_per_hour)
    explain = (
        f"{c.offering.id} ({group.region_class}, {capacity}{pool}) at {usd} USD/h on node {name}: "
        f"profile {d.profile}, interruptible {d.interruptible}; "
        f"{fitting}/{len(index)} nodes fit, {free} free; price book {book.pricebook_version}"
    )
    if warm is not None:
        explain += f"; warm: kept for project {warm.namespace} by {warm.keeper}"
    return Placement(
        node,
        c.offering,
        c.rate_micros_per_hour,
        c.interruptible,
        book.pricebook_version,
        explain,
        warm_from=warm.keeper if warm is not None else None,
    )


def _message(index: CapacityIndex, plan: _Plan) -> str:
    counts: dict[str, int] = {}
    ranks: dict[str, int] = {}

    def add(rank: int, reason: str, n: int) -> None:
        if n:
            counts[reason] = counts.get(reason, 0) + n
            ranks[reason] = rank

    for rank, reason, g in plan.refused:
        add(rank, reason, g.total)
    for _, g in plan.fits:
        add(_RANK["drained"], "drained", g.drained)
        add(_RANK["not ready"], "not ready", g.not_ready)
        add(_RANK["busy"], "busy", g.busy)
    detail = ", ".join(f"{n} {r}" for r, n in sorted(counts.items(), key=lambda rn: (-rn[1], ranks[rn[0]])))
    return f"0/{len(index)} nodes: {detail}"


# ---------------------------------------------------------------------------------------------------------
# The compatible entry point, and the price book alone (for estimates)
# ---------------------------------------------------------------------------------------------------------


def place(
    spec: JobSpec,
    nodes: list[Node],
    busy: set[str],
    catalog: Catalog,
    now: datetime | None = None,
    *,
    ceiling_micros: int | None = None,
) -> Placement | NoPlacement:
    """The best free node of ``nodes`` for ``spec`` (``busy`` names have an unfinished Attempt);
    ``ceiling_micros`` (see :func:`rate_ceiling_of`) skips capacity whose rate is above it. Builds a
    :class:`CapacityIndex` of the nodes on every call: a long-lived index and :func:`place_in` avoid that."""
    now = now or datetime.now(UTC)
    return place_in(CapacityIndex.of(nodes, busy, now), spec, catalog, now, ceiling_micros=ceiling_micros)


def price_book_candidates(
    spec: JobSpec, catalog: Catalog, *, ceiling_micros: int | None = None
) -> tuple[list[Candidate], Counter[str]]:
    """Capacity of the price book that could ever serve ``spec`` (each offering on-demand and, where sold,
    interruptible), best first in :func:`place`'s order, and why the other offerings cannot (each offering
    counted once, under its on-demand form's first failing reason). Regions are the offerings' own; pools
    are BYOC, so the price book is judged as if the Job's pool held any offering."""
    d = demand_of(spec, ceiling_micros)
    request = d.gpu_request()
    fits: list[Candidate] = []
    refused: Counter[str] = Counter()
    for offering in catalog.offerings:
        forms: Iterable[bool] = (True,) if offering.interruptible else (False, True)
        judged = [_judge(d, request, catalog, offering.id, offering.region_class, d.pool, i) for i in forms]
        ok = [j for j in judged if isinstance(j, Candidate)]
        if ok:
            fits.extend(ok)
        else:
            first = judged[0]
            refused[first[1] if isinstance(first, tuple) else ""] += 1
    fits.sort(key=lambda c: (c.order, c.offering.id))
    return fits, refused
