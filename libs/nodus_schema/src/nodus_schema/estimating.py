"""Estimates (ADR-031): the bus messages of a dry-run, and the pure arithmetic behind ``status.estimate``.

Who does what: the gateway asks the scheduler (``nodus.rpc.scheduler.estimate``) for the capacity, the
rates and the duration bands of every *slot* of the request, then hands that plan to billing
(``nodus.rpc.billing.quote``), which prices it and answers the finished :class:`Estimate`. Both replies are
:class:`EstimateReply`; each message is one struct (a workflow engine's rule that keeps old and new callers
compatible: fields are added, parameters never).

Every amount is integer micro-dollars inside and a decimal USD string on the wire; every charge goes
through :func:`nodus_schema.ledger.charge_micros` (rounded up), so an estimate is never below what the
ledger would charge for the same times. No float anywhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import msgspec

from nodus_schema.catalog import Offering, startup_estimate
from nodus_schema.costs import DurationBand, Estimate, StartupEstimate, USDBand
from nodus_schema.errors import StatusCause
from nodus_schema.holds import HOLD_WINDOW_MS, hold_micros, holds_in_turn
from nodus_schema.jobs import JobSpec
from nodus_schema.ledger import charge_micros
from nodus_schema.meta import format_time
from nodus_schema.quantities import (
    duration_micros,
    format_duration,
    micros_to_usd,
    parse_duration,
    usd_to_micros,
)
from nodus_schema.sweeps import SweepSpec
from nodus_schema.wire import Wire

__all__ = [
    "BILLING_INCREMENT",
    "DEFAULT_ASSEMBLY_RETRIES",
    "DEFAULT_ASSEMBLY_TIMEOUT",
    "DEFAULT_COLD_STARTUP",
    "DEFAULT_EXPECTED_DURATION",
    "DEFAULT_MAX_PARALLEL",
    "DEFAULT_WARM_STARTUP",
    "ESTIMATE_SUBJECT",
    "ESTIMATE_VALIDITY",
    "HISTORY_MIN_SAMPLES",
    "QUOTE_SUBJECT",
    "RATE_CEILING_ANNOTATION",
    "RATE_TOLERANCE_PERCENT",
    "EstimateBinding",
    "EstimateReply",
    "EstimateRequest",
    "Money",
    "PipelineCap",
    "QuoteRequest",
    "SlotPlan",
    "apply_money",
    "billed_millis",
    "bind_estimate",
    "capped",
    "capped_each",
    "charge_for",
    "duration_band",
    "estimate_etag",
    "history_band",
    "minimum_charge_micros",
    "p90_of",
    "parse_estimate_etag",
    "percentile",
    "price",
    "rate_ceiling_micros",
    "run_cost_micros",
    "startup_of",
    "valid_until",
    "within_rate_bound",
]

# ---------------------------------------------------------------------------------------------------------
# Subjects and the constants ADR-031 fixes
# ---------------------------------------------------------------------------------------------------------

ESTIMATE_SUBJECT: Final = "nodus.rpc.scheduler.estimate"
"""Request/reply, queue group ``scheduler``: EstimateRequest -> EstimateReply (capacity and times; with
``priced``, the scheduler passes its plan on to billing, whose priced reply answers the asker)."""
QUOTE_SUBJECT: Final = "nodus.rpc.billing.quote"
"""Request/reply, queue group ``billing``: QuoteRequest -> EstimateReply (the priced estimate)."""

DEFAULT_EXPECTED_DURATION: Final = timedelta(hours=1)
"""The run time assumed when spec.expectedDuration is unset: a round number people read as "a guess"."""
P90_NUMERATOR: Final = 3
P90_DENOMINATOR: Final = 2
"""p90 = 1.5 × p50. A declared duration is a median at best (people quote the run that went well); half
again covers the usual tail (slow data loading, a retry, a cold cache) without per-user history. When run
history exists it replaces this factor; the rule stays the fallback."""
HISTORY_MIN_SAMPLES: Final = 3
"""Run history replaces the default only with at least this many finished runs: with fewer, the median and
the 90th percentile would be one run's time each."""
DEFAULT_COLD_STARTUP: Final = (timedelta(minutes=2), timedelta(minutes=5))
"""Cold start (p50, p90) when the offering has no startup bands: image pull and container start."""
DEFAULT_WARM_STARTUP: Final = (timedelta(seconds=10), timedelta(seconds=30))
"""Warm start (p50, p90) on capacity kept warm by scaledownWindow: container start only."""
BILLING_INCREMENT: Final = timedelta(seconds=1)
"""The ledger bills whole seconds per allocation: the rounding a minimum charge stands for."""
ESTIMATE_VALIDITY: Final = timedelta(minutes=15)
"""How long the prices of an estimate are current (validUntil = now + this)."""
RATE_TOLERANCE_PERCENT: Final = 10
"""A create bound by If-Match is never placed above the estimate's rate plus this many percent."""
RATE_CEILING_ANNOTATION: Final = "nodus.dev/rate-ceiling-micros-per-hour"
"""Set by the gateway on a create bound by If-Match (rate_ceiling_micros of the binding, decimal text); the
scheduler places no node of the object (a Sweep's cells inherit it) above it. Users may not set it."""
DEFAULT_MAX_PARALLEL: Final = 4
"""A Sweep's maxParallel default (as defaulting.py sets it)."""
DEFAULT_ASSEMBLY_TIMEOUT: Final = timedelta(minutes=15)
DEFAULT_ASSEMBLY_RETRIES: Final = 2
"""distributed.startupTimeout and maxAssemblyRetries defaults (the reference's)."""

_HOUR_MS: Final = 3_600_000
_ETAG_SCHEME: Final = "e1"

# ---------------------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------------------


class EstimateRequest(Wire):
    """What to estimate: a Job spec or a Sweep spec, as the gateway would store it (defaulted)."""

    namespace: str
    kind: str
    """Job or Sweep; the matching spec field is set."""
    job_spec: JobSpec | None = None
    sweep_spec: SweepSpec | None = None
    pricebook_version: str | None = None
    """Price at this price book version: the one an existing object was admitted under
    (``status.estimate.pricebookVersion``). None, as for every new create: the newest version. A version
    the scheduler does not ship is priced at the newest, with the warning PricebookUnknown."""
    priced: bool = False
    """Priced by billing too, in one round trip: the scheduler passes its plan on to billing as a
    :class:`QuoteRequest` on :data:`QUOTE_SUBJECT` with the asker's reply subject, and billing's reply (or
    error) is the answer; a plan naming what the catalog does not know (``invalid``) is answered by the
    scheduler itself, and so is Unavailable while nobody serves the quote. False: the scheduler's unpriced
    plan."""
    pipeline: PipelineCap | None = None
    """With ``priced``: the :attr:`QuoteRequest.pipeline` billing sizes the first holds under."""


class SlotPlan(Wire):
    """One distinct kind of run: a Job, or the cells of a Sweep that share a GPU request and a region.

    A *slot* is one index of one cell (a gang's nodes together); an *allocation* is one node of one slot.
    The scheduler fills it; billing prices it without needing the catalog.
    """

    label: str
    """``job`` or the cells' ``<gpu>/<region>``, for messages."""
    cells: int = 1
    """Cells of the Sweep that share this slot (params × repetitions); 1 for a Job."""
    first_cell: int = 0
    """The index of the first such cell (cells start in index order)."""
    offering: str | None = None
    """None when nothing in the price book matches (then a blocking reason says so)."""
    rate_micros_per_hour: int | None = None
    """The rate of one node of the chosen capacity: the interruptible rate on interruptible capacity."""
    interruptible: bool = False
    """Whether the chosen capacity is interruptible (the provider may reclaim it)."""
    nodes: int = 1
    """Gang size; 1 unless distributed."""
    completions: int = 1
    parallelism: int = 1
    run: DurationBand = msgspec.field(default_factory=DurationBand)
    """Run time of one index (Go durations)."""
    boot: DurationBand = msgspec.field(default_factory=DurationBand)
    """Startup of one allocation on cold capacity, billed as the Boot segment."""
    warm_boot: DurationBand | None = None
    """Startup of one allocation on capacity kept warm for the project (scaledownWindow, issue #21)."""
    warm_starts: int = 0
    """How many of the slot's allocations are expected to start warm (the rest start cold)."""
    warm_window: str | None = None
    """The slot's scaledownWindow (a Go duration) when it keeps nodes warm after its runs."""
    warm_tails: int = 0
    """Nodes expected to stay warm, unused, for a whole window after the slot's last runs: each is billed the
    window as Teardown."""
    max_cost_usd: str | None = msgspec.field(default=None, name="maxCostUSD")
    """The cell Job's own cap (template.spec.maxCostUSD), if any."""
    assembly_timeout: str | None = None
    """Gangs only: distributed.startupTimeout, defaulted."""
    assembly_tries: int | None = None
    """Gangs only: 1 + distributed.maxAssemblyRetries, defaulted."""


class EstimateReply(Wire):
    """The answer of both endpoints: the estimate, and the scheduler's slot plan billing prices."""

    estimate: Estimate = msgspec.field(default_factory=Estimate)
    slots: list[SlotPlan] = msgspec.field(default_factory=list)
    invalid: list[StatusCause] = msgspec.field(default_factory=list)
    """Set by the scheduler instead of an estimate when the spec names what its catalog does not know (a GPU
    type, a region class, an offering; ``nodus_schema.naming``): one field error each, which the gateway
    answers as a 422 Invalid. Never a capacity question: a known name nothing sells is a blocking reason."""


class PipelineCap(Wire):
    """The Pipeline a Job or Sweep is quoted as a stage of (issue #22): its one cap, shared by every stage."""

    name: str
    max_cost_usd: str | None = msgspec.field(default=None, name="maxCostUSD")
    """The Pipeline's spec.maxCostUSD (None: no cap, and nothing to size)."""
    uid: str | None = None
    """A stored Pipeline's uid: what its stages already spent and hold is taken off the cap (billing's
    book). None for a Pipeline not created yet (a dry run): the whole cap is left."""


class QuoteRequest(Wire):
    """What billing prices: the original request (for caps) and the scheduler's reply to it."""

    request: EstimateRequest
    scheduled: EstimateReply
    pipeline: PipelineCap | None = None
    """Set when the Job or Sweep is a Pipeline's stage (optional): the first holds are then sized under
    what the Pipeline's cap leaves too, as billing sizes them, and a stage that cannot start under it is
    blocked with MaxCostReached. Left out, the stage is quoted as a Job or Sweep of its own."""


# ---------------------------------------------------------------------------------------------------------
# Durations
# ---------------------------------------------------------------------------------------------------------


def p90_of(p50: timedelta) -> timedelta:
    """p90 = 1.5 × p50, rounded up to the microsecond (exact integer arithmetic)."""
    micros = duration_micros(p50)
    return timedelta(microseconds=-(-micros * P90_NUMERATOR // P90_DENOMINATOR))


def duration_band(expected: str | None, timeout: str | None = None) -> tuple[timedelta, timedelta, bool]:
    """The run-time band of one index: (p50, p90, assumed).

    p50 is spec.expectedDuration, else :data:`DEFAULT_EXPECTED_DURATION` (``assumed`` is then True);
    p90 is 1.5 × p50. Both are capped at spec.timeout: the Job is stopped there (DeadlineExceeded), so no
    run is billed longer. Raises ValueError for a duration that does not parse.
    """
    assumed = not expected
    p50 = parse_duration(expected) if expected else DEFAULT_EXPECTED_DURATION
    p90 = p90_of(p50)
    if timeout:
        limit = parse_duration(timeout)
        if limit > timedelta(0):
            p50, p90 = min(p50, limit), min(p90, limit)
    return p50, p90, assumed


def percentile(sorted_values: Sequence[int], pct: int) -> int:
    """The nearest-rank ``pct``-th percentile of ascending integers (no interpolation, so no fraction):
    the value at rank ⌈pct × n / 100⌉. Raises ValueError for an empty sequence or pct outside 1–100."""
    if not sorted_values or not 1 <= pct <= 100:
        raise ValueError("a percentile needs values and a pct from 1 to 100")
    rank = -(-pct * len(sorted_values) // 100)
    return sorted_values[rank - 1]


def history_band(seconds: Sequence[int]) -> tuple[timedelta, timedelta] | None:
    """The run band (p50, p90) of finished runs of ``seconds`` each: their nearest-rank median and 90th
    percentile; None with fewer than :data:`HISTORY_MIN_SAMPLES` runs."""
    if len(seconds) < HISTORY_MIN_SAMPLES:
        return None
    ordered = sorted(seconds)
    return timedelta(seconds=percentile(ordered, 50)), timedelta(seconds=percentile(ordered, 90))


def _band(pair: tuple[timedelta, timedelta]) -> DurationBand:
    return DurationBand(p50=format_duration(pair[0]), p90=format_duration(pair[1]))


def startup_of(offering: Offering | None) -> StartupEstimate:
    """Startup bands of an offering: its own when the price book gives them (``low`` as p50, ``high`` as
    p90, :func:`nodus_schema.catalog.startup_estimate`), else the defaults (:data:`DEFAULT_COLD_STARTUP`,
    :data:`DEFAULT_WARM_STARTUP`): older price books and offerings without bands."""
    own = startup_estimate(offering)
    if own is not None and own.cold is not None and own.warm is not None:
        return own
    return StartupEstimate(cold=_band(DEFAULT_COLD_STARTUP), warm=_band(DEFAULT_WARM_STARTUP))


def valid_until(now: datetime) -> str:
    """validUntil: now + 15 minutes, RFC 3339."""
    return format_time(now + ESTIMATE_VALIDITY)


# ---------------------------------------------------------------------------------------------------------
# Money (integer micro-dollars)
# ---------------------------------------------------------------------------------------------------------


def billed_millis(td: timedelta) -> int:
    """The billed time of ``td``: whole billing increments (1 s), rounded up, in milliseconds."""
    inc = duration_micros(BILLING_INCREMENT)
    increments = -(-duration_micros(td) // inc)
    return max(0, increments) * (inc // 1000)


def charge_for(rate_micros_per_hour: int, td: timedelta) -> int:
    """What the ledger charges for ``td`` of one node at ``rate``: whole seconds, micro-dollars rounded up."""
    return charge_micros(rate_micros_per_hour, billed_millis(td))


def minimum_charge_micros(rate_micros_per_hour: int) -> int:
    """minimumChargeUSD: one billing increment at the rate, rounded up (charged once per allocation)."""
    return charge_for(rate_micros_per_hour, BILLING_INCREMENT)


def run_cost_micros(rate_micros_per_hour: int, td: timedelta, allocations: int) -> int:
    """``allocations`` node-runs of ``td`` each at ``rate``; each one rounded as the ledger rounds it."""
    return charge_for(rate_micros_per_hour, td) * allocations


def rate_ceiling_micros(rate_micros_per_hour: int) -> int:
    """The highest node rate a create bound to this rate may be placed at: rate + 10 %, rounded down."""
    return rate_micros_per_hour * (100 + RATE_TOLERANCE_PERCENT) // 100


def within_rate_bound(bound_rate_micros: int, offered_rate_micros: int) -> bool:
    """Whether an offering's rate respects a bound rate (+10 %), compared exactly (no rounding)."""
    return offered_rate_micros * 100 <= bound_rate_micros * (100 + RATE_TOLERANCE_PERCENT)


@dataclass(frozen=True, slots=True)
class Money:
    """The priced parts of an estimate, in micro-dollars (None: not applicable or not priceable)."""

    cost_p50: int
    cost_p90: int
    overhead_p50: int
    overhead_p90: int
    hold: int
    """The largest first hold one slot takes alone (billing's window at the rate, all its nodes)."""
    concurrent_hold: int
    gang_hold: int | None
    assembly_bound: int | None
    minimum_charge: int
    least: int = 0
    """The least a slot can start with: one billing increment on each of its nodes (the largest slot's).
    A cap, Budget or balance below it is refused; above it the first holds are sized to what is left."""
    cell_holds: tuple[int, ...] = ()
    """The first hold of every slot that starts at once, largest first (concurrentHold is their sum)."""


@dataclass(frozen=True, slots=True)
class _SlotMoney:
    cost_p50: int
    cost_p90: int
    overhead_p50: int
    overhead_p90: int
    slot_hold: int
    """One index (all its nodes)."""
    cell_hold: int
    """One cell Job: min(parallelism, completions) slots at once."""
    assembly: int | None
    minimum_charge: int


def _d(text: str | None, fallback: timedelta) -> timedelta:
    return parse_duration(text) if text else fallback


def _price_slot(slot: SlotPlan, rate: int, window_ms: int) -> _SlotMoney:
    run50 = _d(slot.run.p50, DEFAULT_EXPECTED_DURATION)
    run90 = _d(slot.run.p90, p90_of(run50))
    boot50 = _d(slot.boot.p50, DEFAULT_COLD_STARTUP[0])
    boot90 = _d(slot.boot.p90, DEFAULT_COLD_STARTUP[1])
    allocations = slot.nodes * slot.completions * slot.cells
    warm = max(0, min(slot.warm_starts, allocations))
    over50 = run_cost_micros(rate, boot50, allocations - warm)
    over90 = run_cost_micros(rate, boot90, allocations - warm)
    if warm or slot.warm_tails:
        band = slot.warm_boot or DurationBand()
        tail = charge_for(rate, _d(slot.warm_window, timedelta(0))) * max(0, slot.warm_tails)
        over50 += run_cost_micros(rate, _d(band.p50, DEFAULT_WARM_STARTUP[0]), warm) + tail
        over90 += run_cost_micros(rate, _d(band.p90, DEFAULT_WARM_STARTUP[1]), warm) + tail
    # Billing's own rule for a first hold, with no limit applied yet (capped() applies a cap).
    slot_hold = hold_micros(rate, window_ms) * slot.nodes
    at_once = max(1, min(slot.parallelism, slot.completions))
    assembly = None
    if slot.nodes > 1:
        timeout = _d(slot.assembly_timeout, DEFAULT_ASSEMBLY_TIMEOUT)
        tries = slot.assembly_tries or DEFAULT_ASSEMBLY_RETRIES + 1
        # Every gang that starts at once, in every cell, may wait out every assembly try on all its nodes.
        assembly = charge_for(rate, timeout) * slot.nodes * tries * at_once * slot.cells
    return _SlotMoney(
        cost_p50=run_cost_micros(rate, run50, allocations) + over50,
        cost_p90=run_cost_micros(rate, run90, allocations) + over90,
        overhead_p50=over50,
        overhead_p90=over90,
        slot_hold=slot_hold,
        cell_hold=slot_hold * at_once,
        assembly=assembly,
        minimum_charge=minimum_charge_micros(rate),
    )


def price(
    slots: list[SlotPlan], *, max_parallel: int | None = None, window_ms: int = HOLD_WINDOW_MS
) -> Money | None:
    """Price a slot plan; None when no slot has a rate (nothing in the price book matched).

    cost = Σ allocations × (charge(run) + charge(boot)), per band, allocations = nodes × completions ×
    cells; the boot is the warm band for the slot's ``warm_starts``, and each of its ``warm_tails`` adds a
    whole scaledownWindow (issue #21). The holds are billing's (:func:`nodus_schema.holds.hold_micros`
    over its funding window ``window_ms``). concurrentHold: for a Job, min(parallelism, completions)
    slots; for a Sweep (``max_parallel`` set), the maxParallel largest cell holds, since any cells may be
    the ones running together.
    """
    priced = [(s, _price_slot(s, s.rate_micros_per_hour, window_ms)) for s in slots if s.rate_micros_per_hour]
    if not priced:
        return None
    if max_parallel is None:
        cell_holds = sorted(
            (m.slot_hold for s, m in priced for _ in range(max(1, min(s.parallelism, s.completions)))),
            reverse=True,
        )
    else:
        cell_holds = sorted((m.cell_hold for s, m in priced for _ in range(s.cells)), reverse=True)
        cell_holds = cell_holds[: max(1, max_parallel)]
    gangs = [m.slot_hold for s, m in priced if s.nodes > 1]
    assemblies = [m.assembly for _, m in priced if m.assembly is not None]
    return Money(
        cost_p50=sum(m.cost_p50 for _, m in priced),
        cost_p90=sum(m.cost_p90 for _, m in priced),
        overhead_p50=sum(m.overhead_p50 for _, m in priced),
        overhead_p90=sum(m.overhead_p90 for _, m in priced),
        hold=max(m.slot_hold for _, m in priced),
        concurrent_hold=sum(cell_holds),
        gang_hold=max(gangs) if gangs else None,
        assembly_bound=sum(assemblies) if assemblies else None,
        minimum_charge=max(m.minimum_charge for _, m in priced),
        least=max(m.minimum_charge * s.nodes for s, m in priced),
        cell_holds=tuple(cell_holds),
    )


def capped_each(money: Money, cap: int | None) -> Money:
    """The first holds under a cap that each slot has alone (a Sweep template's maxCostUSD, every cell
    Job's own): every hold at most ``cap``."""
    if cap is None or cap < money.least:
        return money
    sized = tuple(min(h, cap) for h in money.cell_holds)
    return dataclasses.replace(
        money,
        hold=min(money.hold, cap),
        concurrent_hold=sum(sized),
        gang_hold=None if money.gang_hold is None else min(money.gang_hold, cap),
        cell_holds=sized,
    )


def capped(money: Money, cap: int | None) -> Money:
    """The first holds as billing places them under ``cap`` (a Job's or a Sweep's maxCostUSD): each slot
    that starts at once is held in turn, sized to what the ones before left (ADR-0023). A cap below
    ``money.least`` leaves them as they are: the create is refused, and the estimate says what it holds."""
    if cap is None or cap < money.least:
        return money
    # A slot left less than it can start with gets nothing, as billing refuses such a hold.
    sized = holds_in_turn(money.cell_holds, cap, [money.least] * len(money.cell_holds))
    return dataclasses.replace(
        money,
        hold=min(money.hold, cap),
        concurrent_hold=sum(sized),
        gang_hold=None if money.gang_hold is None else min(money.gang_hold, cap),
        cell_holds=tuple(sized),
    )


def _usd(micros: int | None) -> str | None:
    return None if micros is None else micros_to_usd(micros)


def apply_money(estimate: Estimate, money: Money) -> Estimate:
    """The estimate with billing's amounts written in, as canonical USD strings."""
    return msgspec.structs.replace(
        estimate,
        cost_usd=USDBand(p50=_usd(money.cost_p50), p90=_usd(money.cost_p90)),
        overhead_usd=USDBand(p50=_usd(money.overhead_p50), p90=_usd(money.overhead_p90)),
        hold_usd=_usd(money.hold),
        concurrent_hold_usd=_usd(money.concurrent_hold),
        gang_hold_usd=_usd(money.gang_hold),
        assembly_bound_usd=_usd(money.assembly_bound),
        minimum_charge_usd=_usd(money.minimum_charge),
    )


# ---------------------------------------------------------------------------------------------------------
# The ETag that binds a create to a dry-run
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EstimateBinding:
    """What an If-Match ETag binds a create to: the price book and node rate the dry-run used."""

    pricebook_version: str
    rate_micros_per_hour: int | None
    """None when the estimate had no rate (it was blocked): no ceiling can be derived."""
    digest: str


def _digest(kind: str, pricebook: str, rate: int | None, spec: JobSpec | SweepSpec) -> str:
    # Sorted keys and omitted defaults make equal specs encode to equal bytes: the canonical form.
    body = msgspec.json.encode(spec, order="sorted")
    head = f"{_ETAG_SCHEME}\n{kind}\n{pricebook}\n{'-' if rate is None else rate}\n".encode()
    return hashlib.sha256(head + body).hexdigest()[:32]


def _kind_of(spec: JobSpec | SweepSpec) -> str:
    return "Sweep" if isinstance(spec, SweepSpec) else "Job"


def estimate_etag(estimate: Estimate, spec: JobSpec | SweepSpec) -> str:
    """The ETag header value of a dry-run: ``"e1:<rateMicros>:<pricebookVersion>:<digest>"``, quoted.

    The rate and price book are in clear so the gateway can enforce the +10 % ceiling at create; the
    digest (sha256 of them, the kind and the spec's canonical JSON) ties them to this exact spec. Hash
    the spec the gateway stores (after defaulting), on dry-run and on create alike.
    """
    pricebook = estimate.pricebook_version or ""
    rate = usd_to_micros(estimate.rate_usd_per_hour) if estimate.rate_usd_per_hour else None
    digest = _digest(_kind_of(spec), pricebook, rate, spec)
    return f'"{_ETAG_SCHEME}:{"-" if rate is None else rate}:{pricebook}:{digest}"'


def parse_estimate_etag(etag: str) -> EstimateBinding | None:
    """Read an ETag made by :func:`estimate_etag` (quotes optional); None if it is not one."""
    text = etag.strip()
    if text.startswith("W/"):
        return None  # a weak validator never binds a price
    text = text.strip('"')
    scheme, _, rest = text.partition(":")
    rate_text, _, rest = rest.partition(":")
    pricebook, _, digest = rest.rpartition(":")
    if scheme != _ETAG_SCHEME or not pricebook or len(digest) != 32:
        return None
    if rate_text == "-":
        rate = None
    elif rate_text.isdigit():
        rate = int(rate_text)
    else:
        return None
    return EstimateBinding(pricebook, rate, digest)


def bind_estimate(if_match: str, spec: JobSpec | SweepSpec) -> EstimateBinding | None:
    """The binding an If-Match value gives this create, or None (answer 412 PreconditionFailed).

    None when the value is not an estimate ETag or was made for another spec (the spec changed since the
    dry-run). The price book may have moved on since: the binding still holds (the +10 % rule).
    """
    binding = parse_estimate_etag(if_match)
    if binding is None:
        return None
    expected = _digest(_kind_of(spec), binding.pricebook_version, binding.rate_micros_per_hour, spec)
    return binding if expected == binding.digest else None
