"""The gateway's side of an estimate (ADR-031): ask the scheduler and billing for ``status.estimate``.

The gateway only asks. The scheduler answers which capacity a create would use, at what rate and for how
long (``nodus.rpc.scheduler.estimate``); billing prices that plan (``nodus.rpc.billing.quote``). The
gateway makes one core-NATS request (``priced``): the scheduler passes its plan on to billing with the
gateway's reply subject, and billing answers the gateway (three messages, where asking each in turn took
four and a second reply to decode). It is made only for the compute kinds (Sweeps and Jobs): the kinds
with a spec to estimate. A Pipeline (issue #22) is estimated stage by stage, each stage as the Job
or Sweep it creates, and put together by :mod:`nodus_gateway.chaining` (:mod:`nodus_gateway.staging`);
:func:`with_estimate` writes its critical path into ``status.estimatedDuration`` beside the estimate.

"Nobody answers" is cheap to find out: NATS answers a request on a subject without subscribers with "no
responders" at once (``messaging.request`` raises :class:`~nodus_kit.errors.Unavailable`). Even so, once
the services did not answer (no responders, or a timeout) a real create does not ask again for
:data:`UNANSWERED_PAUSE_S`: while they are down, creates neither wait for them nor double the bus traffic,
and they come back into use within that pause. A dry run always asks (it exists for the estimate).

The scheduler also says when the spec names a GPU type, region class or offering its catalog does not know
(``EstimateReply.invalid``): that is the spec's mistake, answered as a 422 Invalid on the fields (dry run
and create alike, billing not asked), never as the 503 of a capacity question.

The gateway adds one thing of its own (ADR-0036): the Volume revisions a run mounts are downloaded on a
node that has not cached them, so their total size ÷ ``NODUS_ESTIMATE_DOWNLOAD_BPS`` (default 200 MB/s)
is added to the cold startup band, and above :data:`LARGE_DOWNLOAD_BYTES` a ``LargeDownload`` warning says
so. Admission pinned the revisions before the estimate is asked, so the sizes are those that will run.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

import msgspec
from nats.aio.client import Client as NATS

from nodus_gateway.chaining import PipelineEstimate
from nodus_gateway.resources import Resource, resource
from nodus_gateway.responding import ApiError, invalid
from nodus_kit import errors as kit
from nodus_kit import messaging
from nodus_kit.storing import ObjectStore
from nodus_schema import Job, Sweep
from nodus_schema.costs import DurationBand, Estimate, EstimateWarning, StartupEstimate, opening_cost
from nodus_schema.errors import StatusCause
from nodus_schema.estimating import (
    ESTIMATE_SUBJECT,
    EstimateReply,
    EstimateRequest,
    PipelineCap,
    SlotPlan,
)
from nodus_schema.fielding import CauseType, FieldError
from nodus_schema.jobs import JobSpec
from nodus_schema.quantities import format_duration, parse_duration
from nodus_schema.volumes import Volume, revision_of

log = logging.getLogger(__name__)

ESTIMATE_TIMEOUT_S: Final = 2.0
"""The request, the scheduler's plan and billing's price together; services that are up answer in
milliseconds."""
UNANSWERED_PAUSE_S: Final = 1.0
"""After the services did not answer, how long real creates go on without asking."""
COMPUTE_KINDS: Final = frozenset({"Job", "Sweep", "Pipeline"})
"""The kinds that carry ``status.estimate`` (and whose create an ``If-Match`` binds to a dry run's)."""
DEFAULT_DOWNLOAD_BPS: Final = 200_000_000
"""Bytes per second a node downloads a Volume revision at (``NODUS_ESTIMATE_DOWNLOAD_BPS``)."""
LARGE_DOWNLOAD_BYTES: Final = 10 * 1024**3
"""Above this total (10 GiB) of Volume revisions, the estimate warns ``LargeDownload``."""


def estimable(res: Resource) -> bool:
    """Whether objects of this resource are estimated (Sweeps, Jobs and Pipelines)."""
    return res.kind in COMPUTE_KINDS


def estimate_request(res: Resource, obj: Any, pipeline: PipelineCap | None = None) -> EstimateRequest:
    """The priced request for ``obj`` (admitted, so defaulted: the spec the gateway stores), as a stage of
    ``pipeline`` when given."""
    ns, sweep = obj.metadata.namespace or "", res.kind == "Sweep"
    return EstimateRequest(
        namespace=ns,
        kind="Sweep" if sweep else "Job",
        sweep_spec=obj.spec if sweep else None,
        job_spec=None if sweep else obj.spec,
        priced=True,
        pipeline=pipeline,
    )


async def ask(nc: NATS, res: Resource, obj: Any, *, timeout: float | None = None) -> Estimate:
    """The priced estimate of ``obj``: the scheduler's, then billing's, each within ``timeout`` (default
    :data:`ESTIMATE_TIMEOUT_S`); a Pipeline's from its stages' (a
    :class:`~nodus_gateway.chaining.PipelineEstimate`). Raises the kit's errors:
    :class:`~nodus_kit.errors.Unavailable` (nobody serves a subject), :class:`~nodus_kit.errors.Timeout`,
    :class:`~nodus_kit.errors.Invalid` (a spec the services cannot estimate), or what a service answered;
    and the 422 :class:`ApiError` of :func:`unknown_names` for a spec that names what the scheduler's
    catalog does not know."""
    if res.kind == "Pipeline":
        # Imported here: staging asks each stage through plan() below.
        from nodus_gateway.staging import ask_stages

        return await ask_stages(nc, obj, timeout=timeout)
    planned = await plan(nc, res, obj, timeout=timeout)
    if planned.invalid:
        raise unknown_names(res, obj, planned.invalid)
    return planned.estimate


@dataclass(frozen=True, slots=True)
class Planned:
    """One Job's or Sweep's priced estimate and the scheduler's slot plan behind it (what a Pipeline's
    critical path reads), or the causes of the names the scheduler's catalog does not know (``invalid``;
    billing is then not asked)."""

    estimate: Estimate
    slots: list[SlotPlan] = field(default_factory=list)
    download: timedelta = timedelta(0)
    """The Volume download :func:`with_downloads` added to the cold startup band."""
    invalid: list[StatusCause] = field(default_factory=list)


async def plan(
    nc: NATS,
    res: Resource,
    obj: Any,
    *,
    timeout: float | None = None,
    pipeline: PipelineCap | None = None,
) -> Planned:
    """:func:`ask` of a Job or Sweep, with the plan; unknown names are returned, not raised. ``pipeline``:
    the Pipeline it is a stage of, whose shared cap billing sizes its first holds under (#22)."""
    timeout = ESTIMATE_TIMEOUT_S if timeout is None else timeout
    request = estimate_request(res, obj, pipeline)
    # Billing's absence comes back from the scheduler as its Unavailable (nodus_scheduler.forwarding).
    priced = await messaging.request(nc, ESTIMATE_SUBJECT, request, EstimateReply, timeout=timeout)
    resume(nc)  # they answer: creates ask again at once
    if priced.invalid:  # the scheduler's own answer: its catalog does not know a name
        return Planned(priced.estimate, invalid=priced.invalid)
    size = await download_bytes(nc, obj)
    estimate = with_downloads(priced.estimate, size, res.kind)
    return Planned(estimate, priced.slots, download_time(size) if size > 0 else timedelta(0))


def with_estimate(obj: Any, estimate: Estimate) -> Any:
    """``obj`` with ``estimate`` in ``status.estimate``; a Pipeline's critical path (the band a
    :class:`~nodus_gateway.chaining.PipelineEstimate` carries) in ``status.estimatedDuration``."""
    if isinstance(estimate, PipelineEstimate):
        status = msgspec.structs.replace(
            obj.status, estimate=estimate.plain(), estimated_duration=estimate.duration
        )
    else:
        status = msgspec.structs.replace(obj.status, estimate=estimate)
    return msgspec.structs.replace(obj, status=status)


def quoted(obj: Any, estimate: Estimate) -> Any:
    """What a create stores once the scheduler and billing answered: ``obj`` with its estimate and, for a
    Job, the ``status.cost`` billing writes first for a Job nothing was held for
    (``nodus_schema.costs.opening_cost``): the create answers it at once, and billing, finding it stored,
    has nothing to write until the Job's first hold."""
    obj = with_estimate(obj, estimate)
    if not isinstance(obj, Job) or obj.status.cost is not None:
        return obj
    status = msgspec.structs.replace(obj.status, cost=opening_cost(obj.spec.max_cost_usd))
    return msgspec.structs.replace(obj, status=status)


# -- Volume downloads (ADR-0036) ---------------------------------------------------------------------------
_volume_stores: weakref.WeakKeyDictionary[NATS, ObjectStore[Volume]] = weakref.WeakKeyDictionary()


def _volumes(nc: NATS) -> ObjectStore[Volume]:
    store = _volume_stores.get(nc)
    if store is None:
        row = resource("volumes")
        store = _volume_stores[nc] = ObjectStore(nc, row.bucket, Volume)
    return store


def _spec_of(obj: Any) -> JobSpec | None:
    if isinstance(obj, Job):
        return obj.spec
    if isinstance(obj, Sweep):
        return obj.spec.template.spec
    return None


async def download_bytes(nc: NATS, obj: Any) -> int:
    """The total size of the Volume revisions a run of ``obj`` mounts: the pinned ones, and a writable
    mount's latest (what it starts from). A Volume or revision that is not there counts 0."""
    spec = _spec_of(obj)
    if spec is None:
        return 0
    uses = {(m.volume, m.revision if m.read_only else None) for m in spec.volumes if m.volume}
    uses |= {(i.volume.name, i.volume.revision) for i in spec.inputs if i.volume and i.volume.name}
    total = 0
    for name, number in sorted(uses, key=lambda u: (u[0], u[1] or 0)):
        try:
            vol = await _volumes(nc).get(obj.metadata.namespace, name)
        except kit.NotFound:
            continue
        rev = revision_of(vol, number)
        total += rev.size_bytes if rev is not None else 0
    return total


def download_bps(env: Any = None) -> int:
    """NODUS_ESTIMATE_DOWNLOAD_BPS (a whole number of bytes per second; anything else is the default)."""
    raw = (os.environ if env is None else env).get("NODUS_ESTIMATE_DOWNLOAD_BPS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_DOWNLOAD_BPS


def download_time(size: int, bps: int | None = None) -> timedelta:
    """How long ``size`` bytes take at ``bps`` (default :func:`download_bps`): whole microseconds, rounded
    up."""
    rate = bps if bps is not None else download_bps()
    return timedelta(microseconds=-(-size * 1_000_000 // rate))


def with_downloads(estimate: Estimate, size: int, kind: str, bps: int | None = None) -> Estimate:
    """``estimate`` with ``size`` bytes' download time added to the cold startup band (p50 and p90), and
    the LargeDownload warning above :data:`LARGE_DOWNLOAD_BYTES`. Exact: whole microseconds, rounded up."""
    if size <= 0:
        return estimate
    rate = bps if bps is not None else download_bps()
    extra = download_time(size, rate)
    startup = estimate.startup or StartupEstimate()
    cold = startup.cold or DurationBand()
    cold = DurationBand(p50=_plus(cold.p50, extra), p90=_plus(cold.p90, extra))
    warnings = list(estimate.warnings)
    if size > LARGE_DOWNLOAD_BYTES:
        gib = f"{size / 1024**3:.1f}"  # for reading only: the band above is exact
        message = (
            f"this {kind} mounts {gib} GiB ({size} bytes) of Volume revisions: a node that has not cached "
            f"them downloads them before the run starts, about {format_duration(extra)} at {rate} bytes/s "
            "(included in the cold startup band)"
        )
        warnings.append(EstimateWarning(code="LargeDownload", message=message))
    return msgspec.structs.replace(
        estimate, startup=msgspec.structs.replace(startup, cold=cold), warnings=warnings
    )


def _plus(band: str | None, extra: timedelta) -> str:
    try:
        base = parse_duration(band) if band else timedelta(0)
    except ValueError:
        base = timedelta(0)
    return format_duration(base + extra)


def unknown_names(res: Resource, obj: Any, named: list[StatusCause]) -> ApiError:
    """The 422 for the names the scheduler's catalog does not know (``EstimateReply.invalid``): a GPU type,
    a region class or an offering, each a cause on its field with the closest known names. A mistake in the
    spec, so never the 503 of capacity a client would retry (``nodus_schema.naming``)."""
    causes = [
        FieldError(c.field or "", _cause_type(c.reason), c.message or "Unsupported value") for c in named
    ]
    return invalid(res, obj.metadata.name or obj.metadata.generate_name, causes)


def _cause_type(reason: str | None) -> CauseType:
    try:
        return CauseType(reason) if reason else CauseType.NOT_SUPPORTED
    except ValueError:
        return CauseType.INVALID


@dataclass(frozen=True, slots=True)
class Asked:
    """An estimate, or why there is none (the services did not answer)."""

    estimate: Estimate | None
    missing: str | None = None


def _unanswered(err: kit.NodusError) -> bool:
    """The services did not give an estimate, and the spec is not to blame: a create goes on without one.
    Invalid is the spec's fault (the caller's to fix), so it is not among these."""
    return not isinstance(err, kit.Invalid)


async def estimate_for(nc: NATS, res: Resource, obj: Any) -> Asked:
    """:func:`ask`, with "nobody answered" (Unavailable, Timeout, a service's own failure) as an
    :class:`Asked` without an estimate, logged. Raises :class:`~nodus_kit.errors.Invalid`, and the 422 of
    :func:`unknown_names`."""
    if not estimable(res):
        return Asked(None)
    paused = _paused.get(nc)
    if paused is not None and time.monotonic() < paused[0]:
        return Asked(None, paused[1])
    try:
        return Asked(await ask(nc, res, obj))
    except kit.NodusError as e:
        if not _unanswered(e):
            raise
        missing = str(e) or e.reason
        _paused[nc] = (time.monotonic() + UNANSWERED_PAUSE_S, missing)
        meta = obj.metadata
        if _should_log(e.reason):
            log.warning(
                "no estimate: %s (logged at most every %ss)",
                e,
                LOG_EVERY_S,
                extra={
                    "kind": res.kind,
                    "namespace": meta.namespace,
                    "object": meta.name,
                    "reason": e.reason,
                },
            )
        return Asked(None, missing)


# Per connection (a gateway has one): until when creates do not ask, and why.
_paused: weakref.WeakKeyDictionary[NATS, tuple[float, str]] = weakref.WeakKeyDictionary()


def resume(nc: NATS) -> None:
    """Creates on ``nc`` ask for estimates again from now on (after a pause, see the module's notes)."""
    _paused.pop(nc, None)


LOG_EVERY_S = 10.0
_last_logged: dict[str, float] = {}


def _should_log(reason: str) -> bool:
    """While the estimate services are down every create says so in its Warning header; the log gets
    one line per reason per interval instead of one per request."""
    now = time.monotonic()
    if now - _last_logged.get(reason, -LOG_EVERY_S) < LOG_EVERY_S:
        return False
    _last_logged[reason] = now
    return True


async def estimate(nc: NATS, res: Resource, obj: Any) -> Estimate | None:
    """The estimate of a compute object, or None when the services do not answer (logged) or the kind
    has none."""
    return (await estimate_for(nc, res, obj)).estimate
