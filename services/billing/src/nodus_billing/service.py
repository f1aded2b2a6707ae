"""The billing service: books per project, holds for the scheduler, metering of every Job, accounts.

- ``nodus.rpc.billing.hold`` (serving.Holds): fund an Attempt before it is created.
- ``nodus.rpc.billing.{account,grant,usage}`` (serving.Accounts): the gateway's account API.
- ``nodus.rpc.billing.quote`` (quoting): billing's half of an estimate, with the project's balances.
- the metering controller (leader only): one reconcile per Job, fed by Jobs, Attempts, Sweeps and Budgets
  and by AttemptFinished reports (metering.py); it captures, charges, extends, blocks and writes
  ``status.cost``. Every replica serves the endpoints; the books' compare-and-set keeps them consistent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from nodus_billing.books import Book, Books
from nodus_billing.budgeting import Budgets
from nodus_billing.holding import Expire
from nodus_billing.metering import Metering, Terms, now_ms
from nodus_billing.quoting import serve_quotes
from nodus_billing.serving import Holds, serve_accounts, serve_holds
from nodus_kit.controlling import Controller, Key, Source
from nodus_kit.leasing import Lease, run_as_leader, ttl_from
from nodus_kit.messaging import Consumer, Delivery
from nodus_kit.servicing import Service
from nodus_kit.storing import Event
from nodus_kit.vouching import REPORT_PREFIX, Forgeries, sender
from nodus_schema.attempts import JOB_LABEL
from nodus_schema.messages import AttemptFinished, Report
from nodus_schema.quantities import usd_to_micros
from nodus_schema.sweeps import SWEEP_LABEL

log = logging.getLogger(__name__)


def _job_of_attempt(event: Event[Any]) -> Iterable[Key]:
    meta = event.object.metadata
    return [(meta.namespace or "", meta.labels.get(JOB_LABEL) or event.object.spec.job)]


class BillingService(Service):
    name = "nodus-billing"

    async def start(self) -> None:
        env = self.settings.env
        self.forgeries = Forgeries("billing", "report")
        self.terms = Terms.from_env(env)
        self.books = Books(
            self.bus, starting_micros=usd_to_micros(env.get("NODUS_STARTING_CREDITS_USD", "0"))
        )
        self.metering = Metering(self.bus, self.books, self.terms)
        self.budgets = Budgets(self.bus, self.books)
        self.meter = Controller(
            "billing-meter",
            self.metering.reconcile,
            [
                Source(self.metering.jobs),
                Source(self.metering.attempts, _job_of_attempt),
                Source(self.metering.sweeps, self._cells_of),
            ],
            workers=4,
            resync_s=float(env.get("NODUS_RESYNC_S", "30")),
        )
        self.metering.requeue = self.meter.queue.add
        self.budgeter = Controller(
            "billing-budgets",
            self.budgets.reconcile,
            [Source(self.budgets.store)],
            workers=1,
            resync_s=float(env.get("NODUS_RESYNC_S", "30")),
        )
        self.budgets.requeue_project = self._requeue_project
        # Reports only speed things up (the Attempt's phase is what counts): every replica shares the one
        # durable consumer, and a report that arrives twice enqueues the same key twice, harmlessly.
        self.reports = Consumer(
            self.bus.jetstream(),
            stream="NODUS_REPORTS",
            durable="billing",
            subject="nodus.report.>",
            typ=Report,  # type: ignore[arg-type]
            handler=self._on_report,
        )
        await self.reports.start()
        self.endpoints = [
            await serve_quotes(self.bus, books=self.books, window_ms=self.metering.terms.window_ms),
            await serve_holds(self.bus, Holds(self.books, self.metering)),
            *(await serve_accounts(self.bus, self.books, self._requeue_project)),
        ]
        lease = Lease(self.bus, "billing", self.settings.replica, ttl_s=ttl_from(self.settings.env))
        self._leader = asyncio.create_task(run_as_leader(lease, self._lead, stop=self.stopping))

    async def _lead(self) -> None:
        await asyncio.gather(self.meter.run(), self.budgeter.run(), self._expire())

    async def _expire(self) -> None:
        """The safety net under the meter: a hold nobody extended for an hour past its funding (its Job and
        Attempt gone from every view the meter has) expires, and what it still reserves goes back.

        Before that, the Job of every open hold whose funding has run out is looked at by the meter: one
        whose Job was deleted while billing was down (or while its book could not be written) is released
        there as soon as its Attempt is gone, not an hour later."""
        grace_ms = int(float(self.settings.env.get("NODUS_HOLD_EXPIRY_S", "3600")) * 1000)
        while True:
            await asyncio.sleep(max(1.0, self.terms.tick_ms / 1000))
            books: list[Book] = []
            with contextlib.suppress(Exception):
                books = (await self.books.store.list(None)).items
            for book in books:
                project = book.metadata.name or ""
                now = now_ms()
                cutoff = now - grace_ms
                holds = [h for h in book.state.holds.values() if h.status == "Open"]
                for job in sorted({h.job.rsplit("@", 1)[0] for h in holds if h.funded_until_ms <= now}):
                    self.meter.queue.add((project, job))
                if any(h.funded_until_ms <= cutoff for h in holds):
                    # Whole seconds: one expiry op per project per second at most (its id is the time).
                    with contextlib.suppress(Exception):
                        await self.books.apply(project, [Expire(now_ms=cutoff // 1000 * 1000)])

    async def _on_report(self, delivery: Delivery[Report]) -> None:
        """A finished run's Job is metered now. Only a report from the Attempt's own node counts (a
        forged one is dropped and counted, nodus_kit.vouching); what is charged is read from the
        Attempt the scheduler wrote, never from the report."""
        report = delivery.data
        if not isinstance(report, AttemptFinished):
            return
        try:
            attempt = await self.metering.attempts.get(report.namespace, report.attempt)
        except Exception:
            return  # gone (or the bus away): the meter's resync looks at the Job anyway
        node = sender(delivery.subject, REPORT_PREFIX)
        about = f"AttemptFinished of {report.namespace}/{report.attempt}"
        if self.forgeries.genuine(node, report.node, attempt.spec.node, about):
            self.meter.queue.add((report.namespace, attempt.spec.job))

    def _cells_of(self, event: Event[Any]) -> Iterable[Key]:
        """A Sweep changed (its cap raised): every cell of it is looked at, blocked ones first of all."""
        meta = event.object.metadata
        ns, name = meta.namespace or "", meta.name
        asyncio.get_running_loop().create_task(self._enqueue_cells(ns, name))
        return []

    async def _enqueue_cells(self, ns: str, sweep: str) -> None:
        from nodus_kit.selecting import Selector

        with contextlib.suppress(Exception):
            page = await self.metering.jobs.list(ns, selector=Selector.equals({SWEEP_LABEL: sweep}))
            for job in page.items:
                self.meter.queue.add((ns, job.metadata.name or ""))

    def _requeue_project(self, project: str) -> None:
        """Credits granted or a Budget changed: the project's blocked Jobs are looked at now."""

        async def requeue() -> None:
            with contextlib.suppress(Exception):
                for record in (await self.metering.funding.list(project)).items:
                    if record.blocked is not None:
                        self.meter.queue.add((project, record.metadata.name or ""))

        asyncio.get_running_loop().create_task(requeue())

    async def stop(self) -> None:
        await self.meter.stop()
        await self.budgeter.stop()
        await self.reports.stop()
        for sub in self.endpoints:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
