"""Placement: a free, ready node whose offering matches a Job's request, or the reasons why none does.

Every unplaced Job says why, Kubernetes-style: ``0/5 nodes: 3 other accelerator, 1 busy, 1 not ready``.
Among the nodes that fit, the cheapest offering wins (then the name, so placement is deterministic).

A Job created bound to a dry-run's estimate (ADR-031) carries the annotation
``nodus.dev/rate-ceiling-micros-per-hour``: offerings above it are skipped ("above the bound rate").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from nodus_schema.catalog import Catalog, Offering, offering_matches
from nodus_schema.estimating import RATE_CEILING_ANNOTATION
from nodus_schema.gpus import GPURequest, as_gpu_request
from nodus_schema.jobs import JobSpec
from nodus_schema.meta import ObjectMeta, parse_time
from nodus_schema.nodes import Node

# A node whose last heartbeat is older than this is not offered work (its agent may be gone).
HEARTBEAT_GRACE = timedelta(seconds=15)


@dataclass(frozen=True, slots=True)
class Placement:
    node: Node
    offering: Offering


@dataclass(frozen=True, slots=True)
class NoPlacement:
    message: str


def request_of(spec: JobSpec) -> GPURequest | None:
    gpu = spec.resources.gpu if spec.resources else None
    return as_gpu_request(gpu) if gpu is not None else None


def rate_ceiling_of(meta: ObjectMeta) -> int | None:
    """The highest node rate (micro-dollars per hour) the object may be placed at, from its
    :data:`RATE_CEILING_ANNOTATION` (set by the gateway on a create bound by If-Match), or None.

    A value that is not a whole number is ignored: the gateway writes the annotation, users cannot."""
    text = meta.annotations.get(RATE_CEILING_ANNOTATION, "").strip()
    return int(text) if text.isdigit() else None


def place(
    spec: JobSpec,
    nodes: list[Node],
    busy: set[str],
    catalog: Catalog,
    now: datetime | None = None,
    *,
    ceiling_micros: int | None = None,
) -> Placement | NoPlacement:
    """The cheapest free node that fits ``spec``; ``ceiling_micros`` (see :func:`rate_ceiling_of`) skips
    offerings whose rate is above it."""
    now = now or datetime.now(UTC)
    request = request_of(spec)
    regions = set(spec.placement.regions) if spec.placement and spec.placement.regions else None
    allowed = set(spec.placement.offerings) if spec.placement and spec.placement.offerings else None
    reasons: Counter[str] = Counter()
    fits: list[Placement] = []
    for node in nodes:
        why, offering = _why_not(node, request, regions, allowed, busy, catalog, now, ceiling_micros)
        if why:
            reasons[why] += 1
        elif offering is not None:
            fits.append(Placement(node, offering))
    if fits:
        return min(fits, key=lambda p: (p.offering.rate_micros_per_hour, p.node.metadata.name or ""))
    detail = ", ".join(f"{n} {why}" for why, n in reasons.most_common())
    return NoPlacement(
        f"0/{len(nodes)} nodes: {detail}" if nodes else "0/0 nodes: no node agent is registered"
    )


def _why_not(
    node: Node,
    request: GPURequest | None,
    regions: set[str] | None,
    allowed: set[str] | None,
    busy: set[str],
    catalog: Catalog,
    now: datetime,
    ceiling_micros: int | None = None,
) -> tuple[str | None, Offering | None]:
    offering = catalog.offering(node.spec.offering)
    if offering is None:
        return "unknown offering", None
    if request is not None and (why := offering_matches(request, offering, catalog)):
        return why, None
    if regions is not None and node.spec.region_class not in regions:
        return "other region", None
    if allowed is not None and offering.id not in allowed:
        return "offering not allowed", None
    if ceiling_micros is not None and offering.rate_micros_per_hour > ceiling_micros:
        return "above the bound rate", None
    if not _ready(node, now):
        return "not ready", None
    if node.metadata.name in busy:
        return "busy", None
    return None, offering


def _ready(node: Node, now: datetime) -> bool:
    if node.status.phase != "Ready" or node.spec.unschedulable:
        return False
    beat = node.status.last_heartbeat_time
    return beat is not None and now - parse_time(beat) <= HEARTBEAT_GRACE
