"""The estimate endpoint, ``nodus.rpc.scheduler.estimate`` (ADR-0031): what it reads (the scheduler's
informers, or the buckets), then :func:`nodus_scheduler.estimating.estimate`; with ``priced`` the plan
passed on to billing (:mod:`nodus_scheduler.forwarding`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit import errors, messaging
from nodus_kit.storing import ObjectStore
from nodus_scheduler.capacity import UNREACHABLE_GRACE, unreachable
from nodus_scheduler.estimateview import CapacityView, InformedHistory
from nodus_scheduler.estimating import estimate
from nodus_scheduler.forwarding import QuoteForwarder
from nodus_scheduler.recalling import HISTORY_FIRST_WAIT_S, RunHistory
from nodus_scheduler.viewing import World
from nodus_scheduler.warmplanning import kept_warm
from nodus_schema.attempts import ATTEMPT_TERMINAL, Attempt
from nodus_schema.catalog import Catalog
from nodus_schema.estimating import (
    ESTIMATE_SUBJECT,
    QUOTE_SUBJECT,
    EstimateReply,
    EstimateRequest,
    QuoteRequest,
)
from nodus_schema.jobs import Job
from nodus_schema.nodes import Node

QUEUE = "scheduler"


class Estimator:
    """The endpoint: reads the live nodes, the busy set, the nodes kept warm and the run history, then
    answers :func:`estimate`.

    In the scheduler (``world`` given) all of it comes from the process's informers
    (:class:`~nodus_scheduler.viewing.World`): an estimate is then pure CPU, with no request to the bus and
    nothing that grows with the Attempts ever run (the warm nodes are read from the ``warm-on`` and
    ``warm-from`` indexes, the busy set from ``active-on``). What it reads is indexed once
    (:class:`~nodus_scheduler.estimateview.Capacity`) and kept for the estimates that follow until a Node or
    an Attempt changes, or for :data:`~nodus_scheduler.estimateview.CAPACITY_MAX_AGE_S` at most: a burst of
    creates pays for one index. Before the informers' first lists are in, and without a ``world`` (tests and
    tools), it lists the ``nodes`` and ``attempts`` buckets per request, as the first version did.
    """

    def __init__(
        self,
        nc: NATS,
        catalog: Catalog,
        history: RunHistory | None = None,
        *,
        gone_after: timedelta = UNREACHABLE_GRACE,
        world: World | None = None,
        quote_subject: str = QUOTE_SUBJECT,
    ) -> None:
        self.catalog = catalog
        self.forwarder = QuoteForwarder(nc, subject=quote_subject)
        self.gone_after = gone_after
        """Nodes NotReady for longer are left out, as placement leaves them out (capacity.py)."""
        self.nodes = ObjectStore(nc, "nodes", Node)
        self.attempts = ObjectStore(nc, "attempts", Attempt)
        self.view = CapacityView(world, gone_after) if world is not None else None
        if history is None:
            history = (
                InformedHistory(world.jobs) if world is not None else RunHistory(ObjectStore(nc, "jobs", Job))
            )
        self.history = history

    async def serve(self, request: EstimateRequest) -> EstimateReply | messaging.Forward:
        """The endpoint's handler: the plan, or with ``priced`` the plan passed on to billing, whose priced
        reply answers the asker (one round trip fewer than the asker relaying it; ADR-0031). A plan that
        names what the catalog does not know is answered here: billing has nothing to price."""
        scheduled = await self.handle(request)
        if not request.priced or scheduled.invalid:
            return scheduled
        plain = msgspec.structs.replace(request, priced=False, pipeline=None)
        return await self.forwarder.price(
            QuoteRequest(request=plain, scheduled=scheduled, pipeline=request.pipeline)
        )

    async def handle(self, request: EstimateRequest) -> EstimateReply:
        self.history.maybe_refresh()
        await self.history.ready(HISTORY_FIRST_WAIT_S)
        now = datetime.now(UTC)
        capacity = self.view.now(now) if self.view is not None else None
        if capacity is not None:
            nodes, busy, warm = capacity.nodes, capacity.busy, capacity.warm
        else:
            nodes, busy, warm = await self._listed(now)
        try:
            return estimate(
                request, self.catalog, nodes, busy, now, history=self.history, warm=warm, capacity=capacity
            )
        except (ValueError, OverflowError) as e:  # a spec the gateway should have refused: say so
            raise errors.Invalid(str(e) or type(e).__name__) from None

    async def _listed(self, now: datetime) -> tuple[list[Node], set[str], dict[str, str]]:
        nodes = [n for n in (await self.nodes.list()).items if not unreachable(n, now, self.gone_after)]
        attempts = (await self.attempts.list()).items
        busy = {a.spec.node for a in attempts if a.status.phase not in ATTEMPT_TERMINAL}
        return nodes, busy, kept_warm(attempts, now)


async def serve_estimates(
    nc: NATS,
    catalog: Catalog,
    *,
    subject: str = ESTIMATE_SUBJECT,
    history: RunHistory | None = None,
    gone_after: timedelta = UNREACHABLE_GRACE,
    world: World | None = None,
    quote_subject: str = QUOTE_SUBJECT,
) -> Any:
    """Serve ``nodus.rpc.scheduler.estimate`` in queue group ``scheduler``; returns the subscription. The
    run history (of the jobs bucket, unless ``history`` is given) starts loading at once. Nodes NotReady
    for longer than ``gone_after`` are no capacity (the scheduler's NODUS_NODE_UNREACHABLE_GRACE_S).
    ``world``: the scheduler's informers, which the estimates then read instead of the buckets.
    ``quote_subject``: where a priced estimate's plan is passed on (billing's quote)."""
    estimator = Estimator(
        nc, catalog, history, gone_after=gone_after, world=world, quote_subject=quote_subject
    )
    estimator.history.maybe_refresh()
    return await messaging.serve(nc, subject, EstimateRequest, estimator.serve, queue=QUEUE)
