"""The scheduler service: what it watches, what it owns, what it runs.

Informers (every replica, :mod:`nodus_scheduler.viewing`): Jobs, Attempts (by Job, by node), Nodes,
billing's funding records. Controllers (the leader only), one concern each, as Kubernetes runs them:

* ``scheduler``, the Job lifecycle (:mod:`nodus_scheduler.lifecycle`): for Jobs; owns Attempts (their Job
  by the ``nodus.dev/job`` label); watches funding records (billing's block or its clearing). It feeds
  the binder, which places runs (:mod:`nodus_scheduler.binding`).
* the node monitor (:mod:`nodus_scheduler.monitoring`): NotReady on missed heartbeats, and the Jobs of
  their runs queued to be marked Lost; one timer at the next heartbeat deadline.
* ``scheduler-ttl``, TTL after finished (:mod:`nodus_scheduler.expiring`): for Jobs.
* the retirer (:mod:`nodus_scheduler.retiring`): deletes Nodes gone for longer than the delete period.

And on every replica: the agent-report consumer (:mod:`nodus_scheduler.reporting`), the estimate endpoint
(:mod:`nodus_scheduler.estimating`) and the catalog it publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nodus_kit.cancelling import cancel_and_wait
from nodus_kit.configuring import read_settings
from nodus_kit.controlling import Controller, owns, watches
from nodus_kit.informing import key_of
from nodus_kit.leasing import Lease, run_as_leader
from nodus_kit.messaging import Consumer
from nodus_kit.servicing import Service
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.expiring import Expirer
from nodus_scheduler.expiring import settled as nothing_to_expire
from nodus_scheduler.lifecycle import Lifecycle
from nodus_scheduler.monitoring import NodeMonitor
from nodus_scheduler.publishing import publish_catalog
from nodus_scheduler.reporting import Reports
from nodus_scheduler.retiring import NodeTimes, Retirer
from nodus_scheduler.settings import SchedulerSettings
from nodus_scheduler.viewing import World
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_LABEL, Attempt
from nodus_schema.messages import Report

log = logging.getLogger(__name__)
COALESCE_S = 0.05
"""Changes of Attempts come in bursts (a report per run start and finish, a placement per index): each
queues its Job at most once per COALESCE_S, so a Job of 1,000 indexes is reconciled a few times a second,
not once per change. A Job's own changes are not delayed."""


class SchedulerService(Service):
    name = "nodus-scheduler"

    async def start(self) -> None:
        config = read_settings(SchedulerSettings, self.settings.env)
        catalog = load_catalog(config.catalog)
        await publish_catalog(self.bus, catalog)
        # NotReady nodes: out of placement after the grace, their records deleted later (retiring.py).
        times = NodeTimes.of(config)
        # NODUS_FUNDING=off: a fleet nobody pays for runs without billing's holds (funding.py).
        self.world = world = World(self.bus, funding=config.funding)
        self.lifecycle = life = Lifecycle(
            self.bus, catalog, world, requeue=self._requeue, gone_after=times.unreachable_grace
        )
        self.controller = Controller(
            "scheduler",
            life.reconcile,
            for_=world.jobs,
            owns=[owns(world.attempts, label=JOB_LABEL, delay_s=COALESCE_S, settled=_finished)],
            watches=[watches(world.funding, lambda e: [key_of(e.object)])] if world.funding else [],
            settled=life.settled,
            resync_s=config.resync_s,
        )
        # The node monitor: one timer at the next heartbeat deadline, not a controller pass per beat.
        self.monitor = NodeMonitor(world, world.nodes.store, lost=lambda key: self._requeue(key, 0.0))
        self.expirer = Expirer(self.bus, world, life.jobs, life.attempts)
        self.ttl = Controller(
            "scheduler-ttl",
            self.expirer.reconcile,
            for_=world.jobs,
            settled=nothing_to_expire,
            workers=1,
            resync_s=config.resync_s,
        )
        self.retirer = Retirer(
            self.bus,
            world.nodes.store,
            world.nodes,
            delete_after=times.delete_after,
            judge=world.liveness.may_judge,
        )
        await world.start()
        self.reports = Consumer(
            self.bus.jetstream(),
            stream="NODUS_REPORTS",
            durable="scheduler",
            subject="nodus.report.>",
            typ=Report,  # type: ignore[arg-type]
            handler=Reports(life.attempts, world.attempts, window_of=life.warm.window_of).handle,
            batch=128,
            concurrent=True,  # reports are idempotent, their writes compare-and-set (reporting.py)
        )
        await self.reports.start()
        # nodus.rpc.scheduler.estimate (ADR-031)
        self.estimates = await serve_estimates(
            self.bus, catalog, gone_after=times.unreachable_grace, world=world
        )
        lease = Lease(self.bus, "scheduler", self.settings.replica, ttl_s=config.lease_ttl_s)
        self._leader = asyncio.create_task(run_as_leader(lease, self._lead, stop=self.stopping))
        log.info(
            "scheduler up",
            extra={"pricebook": catalog.pricebook_version, "offerings": len(catalog.offerings)},
        )

    def _requeue(self, key: tuple[str, str], delay_s: float) -> None:
        self.controller.enqueue(key, delay_s)

    async def _lead(self) -> None:
        """What only the leader runs: the controllers, the binder (two binders would place the same
        capacity twice) and the retirer. The informers and the report consumer run on every replica."""
        await self.lifecycle.start()
        retiring = [asyncio.create_task(self.retirer.run(), name="scheduler:retiring")]
        try:
            await asyncio.gather(self.controller.run(), self.monitor.run(), self.ttl.run())
        finally:
            await cancel_and_wait(retiring)
            await self.lifecycle.stop_leading()

    async def stop(self) -> None:
        for controller in (self.controller, self.ttl):
            await controller.stop()
        await self.reports.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
        await self.world.stop()


def _finished(attempt: Attempt) -> bool:
    """An Attempt that has ended: one whose Job is gone has nothing left to stop."""
    return attempt.status.phase in ATTEMPT_TERMINAL
