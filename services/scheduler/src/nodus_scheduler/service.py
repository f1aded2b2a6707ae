"""The scheduler service: the Job lifecycle controller, the agent-report consumer, the catalog, and the
retiring of Nodes their agents left behind."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nodus_kit.controlling import Controller, Source
from nodus_kit.leasing import Lease, run_as_leader, ttl_from
from nodus_kit.messaging import Consumer
from nodus_kit.servicing import Service
from nodus_scheduler.caching import cancel_all
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.estimating import serve_estimates
from nodus_scheduler.lifecycle import Lifecycle
from nodus_scheduler.publishing import publish_catalog
from nodus_scheduler.reporting import Reports
from nodus_scheduler.retiring import NodeTimes, Retirer
from nodus_schema.messages import Report

log = logging.getLogger(__name__)
COALESCE_S = 0.05


class SchedulerService(Service):
    name = "nodus-scheduler"

    async def start(self) -> None:
        catalog = load_catalog(self.settings.env.get("NODUS_CATALOG"))
        await publish_catalog(self.bus, catalog)
        # NODUS_FUNDING=off: a fleet nobody pays for runs without billing's holds (funding.py).
        funding = self.settings.env.get("NODUS_FUNDING", "on").lower() not in ("off", "0", "false")
        # NotReady nodes: out of placement after the grace, their records deleted later (retiring.py).
        times = NodeTimes.from_env(self.settings.env)
        self.lifecycle = Lifecycle(self.bus, catalog, funding=funding, gone_after=times.unreachable_grace)
        life = self.lifecycle
        self.retirer = Retirer(self.bus, life.nodes, life.cache, delete_after=times.delete_after)
        # Jobs are watched by the controller; Attempts and Nodes by the lifecycle's cache, which puts the
        # Jobs they concern in the same queue once its view holds the change (caching.py says why).
        self.controller = Controller(
            "scheduler",
            life.reconcile,
            [Source(life.jobs)],
            workers=4,
            resync_s=float(self.settings.env.get("NODUS_RESYNC_S", "30")),
        )
        # Changes of Attempts and Nodes come in bursts (a report per run start and finish, a placement per
        # index): each puts its Job in the queue at most once per COALESCE_S, so a Job of 1,000 indexes is
        # reconciled a few times a second, not once per change. A Job's own changes are not delayed.
        life.requeue = lambda key: self.controller.queue.add_after(key, COALESCE_S)
        await life.cache.start()
        self.reports = Consumer(
            self.bus.jetstream(),
            stream="NODUS_REPORTS",
            durable="scheduler",
            subject="nodus.report.>",
            typ=Report,  # type: ignore[arg-type]
            handler=Reports(life.attempts, life.cache).handle,
            batch=128,
            concurrent=True,  # reports are idempotent, their writes compare-and-set (reporting.py)
        )
        await self.reports.start()
        # nodus.rpc.scheduler.estimate (ADR-031)
        self.estimates = await serve_estimates(self.bus, catalog, gone_after=times.unreachable_grace)
        lease = Lease(self.bus, "scheduler", self.settings.replica, ttl_s=ttl_from(self.settings.env))
        self._leader = asyncio.create_task(run_as_leader(lease, self._lead, stop=self.stopping))
        log.info(
            "scheduler up",
            extra={"pricebook": catalog.pricebook_version, "offerings": len(catalog.offerings)},
        )

    async def _lead(self) -> None:
        """What only the leader runs: the controller, the binder, the node monitor (two binders would
        place the same capacity twice) and the retirer. The cache and the report consumer run on every
        replica."""
        await self.lifecycle.start()
        retiring = [asyncio.create_task(self.retirer.run(), name="scheduler:retiring")]
        try:
            await self.controller.run()
        finally:
            await cancel_all(retiring)
            await self.lifecycle.stop_leading()

    async def stop(self) -> None:
        await self.controller.stop()
        await self.reports.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
        await self.lifecycle.cache.stop()
