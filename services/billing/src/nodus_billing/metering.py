"""Metering: each finished Attempt is charged once at its offering's rate, then the Job's cost is rolled up.

Idempotent on the attempt: the ledger entry's name is the attempt's, so a report that arrives twice
finds the entry already there and only re-derives the Job's total from the ledger (which is the truth;
``status.cost`` is a display copy).
"""

from __future__ import annotations

import logging

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit.errors import AlreadyExists, NotFound
from nodus_kit.messaging import Delivery
from nodus_kit.selecting import Selector
from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import Attempt
from nodus_schema.costs import Cost
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.ledger import LedgerEntry, LedgerEntrySpec, charge_micros
from nodus_schema.messages import AttemptFinished, Report
from nodus_schema.meta import ObjectMeta
from nodus_schema.quantities import micros_to_usd

log = logging.getLogger(__name__)
JOB_LABEL = "nodus.dev/job"


class Metering:
    def __init__(self, nc: NATS) -> None:
        self.attempts = ObjectStore(nc, "attempts", Attempt)
        self.ledger = ObjectStore(nc, "ledger", LedgerEntry)
        self.jobs = ObjectStore(nc, "jobs", Job)

    async def handle(self, delivery: Delivery[Report]) -> None:
        report = delivery.data
        if not isinstance(report, AttemptFinished):
            return
        try:
            attempt = await self.attempts.get(report.namespace, report.attempt)
        except NotFound:
            log.warning("finished attempt %s is unknown; not charged", report.attempt)
            return
        await self._charge(attempt, report)
        await self.roll_up(report.namespace, attempt.spec.job)

    async def _charge(self, attempt: Attempt, report: AttemptFinished) -> None:
        spec = attempt.spec
        entry = LedgerEntry(
            metadata=ObjectMeta(
                name=attempt.metadata.name, namespace=attempt.metadata.namespace, labels={JOB_LABEL: spec.job}
            ),
            spec=LedgerEntrySpec(
                job=spec.job,
                attempt=attempt.metadata.name or "",
                offering=spec.offering,
                pricebook_version=spec.pricebook_version,
                rate_micros_per_hour=spec.rate_micros_per_hour,
                billed_millis=report.wall_millis,
                amount_micros=charge_micros(spec.rate_micros_per_hour, report.wall_millis),
            ),
        )
        try:
            await self.ledger.create(entry)
        except AlreadyExists:
            pass  # charged already: a redelivered report

    async def finalize(self, key: tuple[str, str]) -> float | None:
        """A Job that reached a terminal phase gets its cost rolled up once more, marked final."""
        ns, name = key
        try:
            job = await self.jobs.get(ns, name)
        except NotFound:
            return None
        if job.status.phase in TERMINAL_PHASES and not (job.status.cost and job.status.cost.final):
            await self.roll_up(ns, name)
        return None

    async def roll_up(self, namespace: str, job_name: str) -> None:
        entries = (await self.ledger.list(namespace, selector=Selector.equals({JOB_LABEL: job_name}))).items
        total = sum(e.spec.amount_micros for e in entries if e.spec)

        def change(job: Job) -> Job | None:
            cost = Cost(
                total_usd=micros_to_usd(total),
                limit_usd=job.spec.max_cost_usd,
                final=job.status.phase in TERMINAL_PHASES,
            )
            if job.status.cost == cost:
                return None
            return msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, cost=cost))

        try:
            await self.jobs.mutate(namespace, job_name, change)
        except NotFound:
            pass
