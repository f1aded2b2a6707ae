"""The billing service: meters finished Attempts into the ledger and writes every Job's status.cost.

Two triggers, both idempotent: an AttemptFinished report charges the run and rolls the Job's cost up;
a Job reaching a terminal phase gets its cost marked final (the report may have come first).
Holds, budgets and caps (MaxCostReached, InsufficientCredits) are not built yet: issue #7.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nodus_billing.metering import Metering
from nodus_billing.quoting import serve_quotes
from nodus_kit.controlling import Controller, Source
from nodus_kit.leasing import Lease, run_as_leader
from nodus_kit.messaging import Consumer
from nodus_kit.servicing import Service
from nodus_schema.messages import Report

log = logging.getLogger(__name__)


class BillingService(Service):
    name = "nodus-billing"

    async def start(self) -> None:
        self.metering = Metering(self.bus)
        # Every replica consumes from the one durable consumer: work is shared, each report handled once
        # (and handled again harmlessly if redelivered: the ledger entry is keyed by the attempt).
        self.reports = Consumer(
            self.bus.jetstream(),
            stream="NODUS_REPORTS",
            durable="billing",
            subject="nodus.report.>",
            typ=Report,  # type: ignore[arg-type]
            handler=self.metering.handle,
        )
        await self.reports.start()
        self.quotes = await serve_quotes(self.bus)  # nodus.rpc.billing.quote (ADR-031)
        self.finalizer = Controller(
            "billing-final",
            self.metering.finalize,
            [Source(self.metering.jobs)],
            workers=2,
            resync_s=float(self.settings.env.get("NODUS_RESYNC_S", "30")),
        )
        lease = Lease(self.bus, "billing", self.settings.replica, ttl_s=10)
        self._leader = asyncio.create_task(run_as_leader(lease, self.finalizer.run, stop=self.stopping))

    async def stop(self) -> None:
        await self.finalizer.stop()
        await self.reports.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
