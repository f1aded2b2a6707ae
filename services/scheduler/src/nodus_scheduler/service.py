"""The scheduler service: the Job lifecycle controller, the agent-report consumer, and the catalog."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from nodus_kit.controlling import Controller, Key, Source
from nodus_kit.leasing import Lease, run_as_leader
from nodus_kit.messaging import Consumer
from nodus_kit.servicing import Service
from nodus_kit.storing import Event
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.estimating import serve_estimates
from nodus_scheduler.lifecycle import JOB_LABEL, Lifecycle
from nodus_scheduler.publishing import publish_catalog
from nodus_scheduler.reporting import Reports
from nodus_schema.messages import Report

log = logging.getLogger(__name__)


class SchedulerService(Service):
    name = "nodus-scheduler"

    async def start(self) -> None:
        catalog = load_catalog(self.settings.env.get("NODUS_CATALOG"))
        await publish_catalog(self.bus, catalog)
        self.lifecycle = Lifecycle(self.bus, catalog)
        life = self.lifecycle

        def attempt_to_job(event: Event[Any]) -> Iterable[Key]:
            a = event.object
            return [(a.metadata.namespace or "", a.metadata.labels.get(JOB_LABEL, a.spec.job))]

        def node_to_waiting(event: Event[Any]) -> Iterable[Key]:
            # A node came, went or freed up: every Job waiting for capacity gets another look.
            return list(life.waiting)

        self.controller = Controller(
            "scheduler",
            life.reconcile,
            [Source(life.jobs), Source(life.attempts, attempt_to_job), Source(life.nodes, node_to_waiting)],
            workers=4,
            resync_s=float(self.settings.env.get("NODUS_RESYNC_S", "30")),
        )
        self.reports = Consumer(
            self.bus.jetstream(),
            stream="NODUS_REPORTS",
            durable="scheduler",
            subject="nodus.report.>",
            typ=Report,  # type: ignore[arg-type]
            handler=Reports(life.attempts).handle,
        )
        await self.reports.start()
        self.estimates = await serve_estimates(self.bus, catalog)  # nodus.rpc.scheduler.estimate (ADR-031)
        lease = Lease(self.bus, "scheduler", self.settings.replica, ttl_s=10)
        self._leader = asyncio.create_task(run_as_leader(lease, self.controller.run, stop=self.stopping))
        log.info(
            "scheduler up",
            extra={"pricebook": catalog.pricebook_version, "offerings": len(catalog.offerings)},
        )

    async def stop(self) -> None:
        await self.controller.stop()
        await self.reports.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
