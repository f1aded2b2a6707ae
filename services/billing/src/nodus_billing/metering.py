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
from nodus_schema.attempts import JOB_LABEL, JOB_UID_LABEL, Attempt
from nodus_schema.costs import Cost
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.ledger import LedgerEntry, LedgerEntrySpec, charge_micros
from nodus_schema.messages import AttemptFinished, Report
from nodus_schema.meta import ObjectMeta
from nodus_schema.quantities import micros_to_usd

log = logging.getLogger(__name__)


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
                name=attempt.metadata.name,
                namespace=attempt.metadata.namespace,
                labels={JOB_LABEL: spec.job, JOB_UID_LABEL: attempt.metadata.labels.get(JOB_UID_LABEL, "")},
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
        """status.cost from the ledger; ``final`` only once the Job is terminal AND every one of its
        Attempts that ran has its charge posted (a report can reach billing after the Job ended)."""
        by_job = Selector.equals({JOB_LABEL: job_name})
        entries = (await self.ledger.list(namespace, selector=by_job)).items
        attempts = (await self.attempts.list(namespace, selector=by_job)).items

        def change(job: Job) -> Job | None:
            uid = job.metadata.uid
            # Only this Job's: a deleted Job of the same name keeps its history, not its charges.
            mine = [e for e in entries if e.metadata.labels.get(JOB_UID_LABEL) == uid]
            charged = {e.metadata.name for e in mine}
            unposted = [
                a
                for a in attempts
                if a.metadata.labels.get(JOB_UID_LABEL) == uid
                and a.metadata.name not in charged
                # A run lost with its node never reports a finish: Nodus covers it, nothing to post.
                and not (a.status.phase == "Lost" and a.status.reason == "NodeLost")
            ]
            total = sum(e.spec.amount_micros for e in mine if e.spec)
            cost = Cost(
                total_usd=micros_to_usd(total),
                limit_usd=job.spec.max_cost_usd,
                final=job.status.phase in TERMINAL_PHASES and not unposted,
            )
            if job.status.cost == cost:
                return None
            return msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, cost=cost))

        try:
            await self.jobs.mutate(namespace, job_name, change)
        except NotFound:
            pass
