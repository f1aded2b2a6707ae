"""The billing service: books per project, holds for the scheduler, metering of every Job, accounts.

- ``nodus.rpc.billing.hold`` (serving.Holds): fund an Attempt before it is created.
- ``nodus.rpc.billing.{account,grant,usage}`` (serving.Accounts): the gateway's account API.
- ``nodus.rpc.billing.quote`` (quoting): billing's half of an estimate, with the project's balances.
- the metering controller (leader only): one reconcile per Job (metering.py); it captures, charges,
  extends, blocks and writes ``status.cost``. Every replica serves the endpoints; the books'
  compare-and-set keeps them consistent.

What the leader watches and owns, each kind through one shared informer (:mod:`viewing`, issue #19):

* ``jobs``, indexed by their Sweep: the meter's ``for_``, each Job reconciled;
* ``attempts``, indexed by their Job: owned by Jobs, a run's change meters its Job;
* ``sweeps``: watched, a new cap (or a Sweep come or gone) meters its cells, found in the jobs' index;
* ``pipelines`` (issue #22): watched, a new cap (or a Pipeline come or gone) meters its stages: its Job
  stages and the cells of its Sweep stages, found in the jobs' and sweeps' indexes by their controller;
* ``funding``, its blocking records indexed by project: watched (a block the hold endpoint placed meters
  its Job) and read by the meter; a grant or a Budget looks at the project's blocked Jobs;
* ``books``, a glance of their open holds indexed by Job: watched, a hold opened meters its Job; the rest
  rule and the expiry loop read it from memory;
* ``budgets``: the budget controller's ``for_``.

Reports and RPCs (an AttemptFinished, a grant, a changed Budget) queue Jobs with ``Controller.enqueue``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from nodus_billing.books import Books
from nodus_billing.budgeting import Budgets
from nodus_billing.holding import Expire
from nodus_billing.metering import Metering, Terms, now_ms
from nodus_billing.quoting import serve_quotes
from nodus_billing.serving import Holds, serve_accounts, serve_holds
from nodus_billing.settings import BillingSettings
from nodus_billing.viewing import (
    BLOCKED,
    BOOKED,
    BY_JOB,
    BY_PIPELINE,
    BY_SWEEP,
    OPEN,
    UNFILED,
    HoldGlance,
    Views,
    blocked,
    booked,
    controlled_by,
    glances,
    labelled,
    open_holds,
    settled_holds,
)
from nodus_billing.warming import WARM_FROM, warm_from
from nodus_kit.configuring import read_settings
from nodus_kit.controlling import Controller, Key, own_key, owns, watches
from nodus_kit.informing import Informer, key_of
from nodus_kit.keying import Event
from nodus_kit.leasing import Lease, run_as_leader
from nodus_kit.messaging import Consumer, Delivery
from nodus_kit.servicing import Service
from nodus_kit.storing import ObjectStore
from nodus_kit.vouching import REPORT_PREFIX, Forgeries, sender
from nodus_schema.attempts import JOB_LABEL, Attempt
from nodus_schema.billing import FUNDING_BUCKET, Budget, Funding
from nodus_schema.jobs import Job
from nodus_schema.messages import AttemptFinished, Report
from nodus_schema.pipelines import Pipeline
from nodus_schema.sweeps import SWEEP_LABEL, Sweep

METER_WORKERS = 64
"""Jobs metered at once. The looks at many Jobs of one project that change its book (their first, at a
start over many Jobs) reach the books together and share one commit: one read and one write of the book
for up to this many (``books``), where four workers made a commit per four Jobs (issue #23)."""


class BillingService(Service):
    name = "nodus-billing"

    async def start(self) -> None:
        config = read_settings(BillingSettings, self.settings.env)
        self.forgeries = Forgeries("billing", "report")
        self.terms = Terms.of(config)
        self.expiry_ms = round(config.hold_expiry_s * 1000)  # how long past its funding a hold lives on
        self.books = Books(self.bus, starting_micros=config.starting_micros)
        bus = self.bus
        self.views = Views(
            jobs=Informer(
                ObjectStore(bus, "jobs", Job),
                indexers={BY_SWEEP: labelled(SWEEP_LABEL), BY_PIPELINE: controlled_by("Pipeline")},
            ),
            attempts=Informer(
                ObjectStore(bus, "attempts", Attempt),
                indexers={BY_JOB: labelled(JOB_LABEL), WARM_FROM: warm_from},
            ),
            sweeps=Informer(
                ObjectStore(bus, "sweeps", Sweep), indexers={BY_PIPELINE: controlled_by("Pipeline")}
            ),
            funding=Informer(ObjectStore(bus, FUNDING_BUCKET, Funding), indexers={BLOCKED: blocked}),
            books=Informer(
                glances(bus),
                indexers={OPEN: open_holds, UNFILED: settled_holds, BOOKED: booked},
                name="billing:holds",
            ),
            pipelines=Informer(ObjectStore(bus, "pipelines", Pipeline)),
        )
        budgets = Informer(ObjectStore(bus, "budgets", Budget))
        # The controllers are made below; what reaches them from outside an informer (a report, a grant)
        # goes through these, which read them when called.
        m = self.metering = Metering(
            bus,
            self.books,
            self.terms,
            self.views,
            requeue=lambda key, delay_s: self.meter.enqueue(key, delay_s),
        )
        self.budgets = Budgets(bus, self.books, view=budgets, requeue_project=self._requeue_project)
        self.informers: list[Informer[Any]] = [*self.views.all(), budgets]  # stopped by stop()
        self.meter = Controller(
            "billing-meter",
            m.reconcile,
            for_=self.views.jobs,
            owns=[owns(self.views.attempts, label=JOB_LABEL)],
            watches=[
                watches(self.views.sweeps, self._cells_of),
                watches(self.views.pipelines, self._stages_of),
                watches(self.views.books, self._placed),
                watches(self.views.funding, own_key),  # a block placed by the hold endpoint, anywhere
            ],
            settled=m.settled,
            orphans=self._gone,
            workers=METER_WORKERS,
            resync_s=config.resync_s,
        )
        self.budgeter = Controller(
            "billing-budgets", self.budgets.reconcile, for_=budgets, workers=1, resync_s=config.resync_s
        )
        self._sweep_specs: dict[Key, tuple[str | None, int | None]] = {}
        self._pipeline_specs: dict[Key, tuple[str | None, int | None]] = {}
        self._open: dict[str, set[str]] = {}  # per project, the open holds the meter was told of
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
        lease = Lease(self.bus, "billing", self.settings.replica, ttl_s=config.lease_ttl_s)
        self._leader = asyncio.create_task(run_as_leader(lease, self._lead, stop=self.stopping))

    async def _lead(self) -> None:
        self.metering.forget_rest()  # another leader may have acted meanwhile: judge every Job again
        self._sweep_specs.clear()
        self._pipeline_specs.clear()
        self._open.clear()
        await asyncio.gather(self.meter.run(), self.budgeter.run(), self._expire())

    def _gone(self) -> Iterable[Key]:
        """The deleted Jobs a book still has a record of (a pass cut short by a crash, a Job deleted while
        no leader ran, a book written before forgetting): the meter's walk queues them, at start and every
        resync, so their runs are filed and their records forgotten. The final ones whose runs a book
        still holds are queued by the walk already (``Metering.settled``)."""
        for value in self.views.books.index_values(BOOKED):
            project, _, job = value.partition("/")
            if self.views.jobs.get(project, job) is None:
                yield (project, job)

    async def _expire(self) -> None:
        """The safety net under the meter: a hold nobody extended for an hour past its funding (its Job and
        Attempt gone from every view the meter has) expires, and what it still reserves goes back.

        Before that, the Job of every open hold whose funding has run out is looked at by the meter,
        settled or not: one whose Job was deleted while billing was down (or while its book could not be
        written) is released there as soon as its Attempt is gone, not an hour later; one whose Attempt
        never came is released past the orphan grace.

        Each tick walks the books' glance in memory, and only the books with an open hold (an idle
        stack's books have none): no list of the bucket, no book decoded per tick."""
        while True:
            await asyncio.sleep(max(1.0, self.terms.tick_ms / 1000))
            projects = sorted({value.split("/", 1)[0] for value in self.views.books.index_values(OPEN)})
            for project in projects:
                book = self.views.books.get(None, project)
                if book is not None:
                    await self._expire_book(project, book.open_holds(), self.expiry_ms)

    async def _expire_book(self, project: str, holds: list[HoldGlance], grace_ms: int) -> None:
        now = now_ms()
        cutoff = now - grace_ms
        for job in sorted({h.job.rsplit("@", 1)[0] for h in holds if h.funded_until_ms <= now}):
            self.meter.enqueue((project, job))
        if any(h.funded_until_ms <= cutoff for h in holds):
            # Whole seconds: one expiry op per project per second at most (its id is the time).
            with contextlib.suppress(Exception):
                await self.books.apply(project, [Expire(now_ms=cutoff // 1000 * 1000)])

    async def _on_report(self, delivery: Delivery[Report]) -> None:
        """A finished run's Job is metered now. Only a report from the Attempt's own node counts (a
        forged one is dropped and counted, nodus_kit.vouching); what is charged is read from the
        Attempt the scheduler wrote, never from the report. The Attempt is read from the view: one the
        view lacks (not seen yet, or this replica does not lead) queues its Job when the view sees it."""
        report = delivery.data
        if not isinstance(report, AttemptFinished):
            return
        attempt = self.views.attempts.get(report.namespace, report.attempt)
        if attempt is None:
            return
        node = sender(delivery.subject, REPORT_PREFIX)
        about = f"AttemptFinished of {report.namespace}/{report.attempt}"
        if self.forgeries.genuine(node, report.node, attempt.spec.node, about):
            self.meter.enqueue((report.namespace, attempt.spec.job))

    def _cells_of(self, event: Event[Any]) -> Iterable[Key]:
        """A Sweep's cap changed, or the Sweep came or went: its cells not settled are looked at, blocked
        ones first of all. Its status, which the sweep controller writes several times a second while it
        runs, changes nothing billing reads (the cap by generation, and the uid): those events map to
        nothing."""
        key = key_of(event.object)
        if not _new_spec(self._sweep_specs, event):
            return []
        cells = self.views.cells(*key)
        return [key_of(job) for job in cells if not self.metering.settled(job)]

    def _stages_of(self, event: Event[Any]) -> Iterable[Key]:
        """A Pipeline's cap changed, or the Pipeline came or went: every Job under it not settled is looked
        at (its Job stages, its Sweep stages' cells), blocked ones first of all; each puts the Pipeline's
        new generation into the book and is unblocked once it fits again. Its status, which the sweep
        controller writes as the stages run, maps to nothing."""
        key = key_of(event.object)
        if not _new_spec(self._pipeline_specs, event):
            return []
        return [key_of(job) for job in self.views.stages(*key) if not self.metering.settled(job)]

    def _placed(self, event: Event[Any]) -> Iterable[Key]:
        """A book changed: the Job of each hold opened or settled since is looked at, wherever the hold
        was placed (any replica's hold endpoint). The rest rule relies on it: a Job at rest wakes for a new
        hold even when its Attempt never comes; and a Job whose final cost was written before this view
        showed its runs settled files them now, not at the next resync. Charges and extensions of holds
        still open map to nothing."""
        project = event.object.metadata.name or ""
        if event.type == "DELETED":
            self._open.pop(project, None)
            return []
        holds = event.object.state.holds
        now = {h for h, hold in holds.items() if hold.status == "Open"}
        before = self._open.get(project, set())
        self._open[project] = now
        changed = (now - before) | {h for h in before - now if h in holds}  # a filed one is done with
        return sorted({(project, holds[h].job.rsplit("@", 1)[0]) for h in changed})

    def _requeue_project(self, project: str) -> None:
        """Credits granted or a Budget changed: the project's blocked Jobs are looked at now."""
        for record in self.views.blocked_in(project):
            self.meter.enqueue((project, record.metadata.name or ""))

    async def stop(self) -> None:
        await self.meter.stop()
        await self.budgeter.stop()
        await self.reports.stop()
        for sub in self.endpoints:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
        for informer in self.informers:
            await informer.stop()


def _new_spec(specs: dict[Key, tuple[str | None, int | None]], event: Event[Any]) -> bool:
    """Whether an event of a Sweep or a Pipeline changes what billing reads of it (its uid and generation:
    its cap), remembering what it saw; a deletion always does."""
    key = key_of(event.object)
    meta = event.object.metadata
    spec = (meta.uid, meta.generation)
    if event.type == "DELETED":
        specs.pop(key, None)
    elif specs.get(key) == spec:
        return False
    else:
        specs[key] = spec
    return True
