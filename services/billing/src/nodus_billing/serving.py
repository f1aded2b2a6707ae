"""Billing's endpoints (ADR-0024): holds for the scheduler; accounts, credits and usage for the gateway.

``nodus.rpc.billing.hold`` funds one Attempt before the scheduler creates it: a hold named after the
Attempt, for one funding window at its rate or as much of it as the caps, Budgets and credits allow, but
never less than two stop margins. A hold that does not fit blocks the Job (the ``funding`` record) with the
reason and a fix, before the reply, so the scheduler that reads the reply and the one that reads the
record agree. Asking again for the same Attempt returns the same hold.

Every endpoint answers either its reply or an error with a registered reason and a sentence its reader can
act on, never a Python exception's text (a scheduler puts billing's words into the Job's status.message):
a refusal that is not about funding (a bad request) is ``Invalid`` with billing's message and fix, and
whatever else goes wrong is logged with the project and answered as ``ServiceUnavailable``: nothing was
changed, and the caller may retry (the scheduler does, every second).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

from nats.aio.client import Client as NATS

from nodus_billing.accounting import CREDITS_ISSUED
from nodus_billing.archiving import Archive, filed_holds
from nodus_billing.books import Books
from nodus_billing.holding import Grant, Op, PlaceHold, Revoke
from nodus_billing.metering import Metering, now_ms
from nodus_billing.putting import job_ref
from nodus_billing.standing import (
    INTERNAL,
    Hold,
    State,
    available,
    forgotten_spent,
    job_spent,
    month_of,
    project_held,
    room_for,
)
from nodus_kit import errors, measuring, messaging
from nodus_kit.errors import NotFound
from nodus_schema.billing import (
    ACCOUNT_SUBJECT,
    FUNDING_REASONS,
    GRANT_SUBJECT,
    HOLD_SUBJECT,
    USAGE_SUBJECT,
    AccountRequest,
    AccountView,
    Block,
    Funding,
    GrantReply,
    GrantRequest,
    HoldReply,
    HoldRequest,
    UsageReply,
    UsageRequest,
    UsageRow,
)
from nodus_schema.holds import hold_micros, minimum_hold_micros
from nodus_schema.jobs import TERMINAL_PHASES
from nodus_schema.ledger import MICROS_PER_HOUR_MS
from nodus_schema.meta import ObjectMeta
from nodus_schema.quantities import MAX_DURATION, MAX_USD_MICROS, duration_micros, micros_to_usd

log = logging.getLogger(__name__)

QUEUE = "billing"
HOLDS_IN_FLIGHT = 64
MAX_RATE_MICROS_PER_HOUR: Final = MAX_USD_MICROS
"""The highest rate a hold is placed at ($1,000,000,000 an hour, the API's MAX_USD; no price book comes
near it). A hold is at most what the credits allow whatever the rate; what a run's ticks and capture
report beyond the books' bound is clamped there (``holding.bounded``)."""
MAX_WINDOW_MS: Final = duration_micros(MAX_DURATION) // 1000
"""The longest funding window a hold request may ask for (MAX_DURATION)."""

Request = TypeVar("Request")
Reply = TypeVar("Reply")


def guarded(
    what: str,
) -> Callable[[Callable[[Any, Request], Awaitable[Reply]]], Callable[[Any, Request], Awaitable[Reply]]]:
    """An endpoint that answers a NodusError as it is, and anything else as ServiceUnavailable with a
    sentence (``what`` billing could not do, for which project) and an incident id in its log."""

    def wrap(
        handler: Callable[[Any, Request], Awaitable[Reply]],
    ) -> Callable[[Any, Request], Awaitable[Reply]]:
        @functools.wraps(handler)
        async def guarded_handler(self: Any, req: Request) -> Reply:
            try:
                return await handler(self, req)
            except errors.NodusError:
                raise
            except Exception:
                incident = uuid.uuid4().hex[:12]
                project = str(getattr(req, "namespace", None) or getattr(req, "project", ""))
                log.exception(
                    "billing endpoint failed", extra={"project": project, "what": what, "incident": incident}
                )
                raise errors.Unavailable(unavailable(what, project, incident)) from None

        return guarded_handler

    return wrap


def unavailable(what: str, project: str, incident: str) -> str:
    return (
        f"billing could not {what} for project {project} just now; nothing was changed. It is retried; "
        f"if this persists, the cluster operator finds incident {incident} in nodus-billing's log"
    )


class Holds:
    def __init__(self, books: Books, metering: Metering) -> None:
        self.books = books
        self.metering = metering

    @guarded("fund the run")
    async def hold(self, req: HoldRequest) -> HoldReply:
        try:
            job = await self.metering.jobs.get(req.namespace, req.job)
        except NotFound:
            raise errors.NotFound(f"job {req.namespace}/{req.job} does not exist") from None
        if job.metadata.uid != req.job_uid:
            raise errors.NotFound(f"job {req.namespace}/{req.job} was re-created (uid {job.metadata.uid})")
        if job.status.phase in TERMINAL_PHASES:
            # An ended Job runs nothing more, and its record leaves the book once its cost is final
            # (forgetting): a hold placed then would start it again from nothing, and nobody meters it.
            raise errors.Conflict(
                f"job {req.namespace}/{req.job} has ended ({job.status.phase}): billing funds no run of it"
            )
        if not 0 < req.rate_micros_per_hour <= MAX_RATE_MICROS_PER_HOUR:
            raise errors.Invalid(
                f"the run's rate of {req.rate_micros_per_hour} µ$/h is not one billing can fund: it must be"
                f" positive and at most ${micros_to_usd(MAX_RATE_MICROS_PER_HOUR)} an hour; the offering's"
                " price book needs fixing (ask the cluster operator)"
            )
        terms = self.metering.terms
        ref = job_ref(req.job, req.job_uid)
        now = now_ms()
        rate = req.rate_micros_per_hour
        window = min(req.window_millis, MAX_WINDOW_MS) if req.window_millis > 0 else terms.window_ms
        least = minimum_hold_micros(rate)

        def plan(state: State) -> Op | None:
            if ref not in state.jobs:
                return None  # refused put (see below)
            existing = state.holds.get(req.attempt)
            if existing is not None:  # a retry: the same op id returns the first answer
                return PlaceHold(
                    hold_id=req.attempt,
                    job=ref,
                    amount_micros=existing.reserved_micros,
                    funded_until_ms=0,
                    at_ms=0,
                )
            room, _ = room_for(state, ref, month_of(now))
            # Sized to what every limit leaves (the estimate's rule); below one billing increment it is
            # asked for whole and refused with the binding reason.
            amount = hold_micros(rate, window, room) or max(least, 1)
            until = now + amount * MICROS_PER_HOUR_MS // rate
            return PlaceHold(
                hold_id=req.attempt,
                job=ref,
                amount_micros=amount,
                funded_until_ms=until,
                at_ms=now,
                rate_micros_per_hour=rate,
            )

        steps = [*self.metering.puts(job, *(await self.metering.owners(job))), plan]
        applied = await self.books.apply(req.namespace, steps)
        result = applied.results[-1]
        if result is None:
            raise errors.TemporaryError(f"job {req.namespace}/{req.job} is not in the books yet; ask again")
        state = applied.state
        if not result.ok and result.code not in FUNDING_REASONS:
            # Not about funding (a bad request, an operation billing could not apply): the scheduler asks
            # again and shows the sentence; an ok=False reply would block the Job under a reason that no
            # cap, grant or Budget change lifts.
            measuring.BILLING_HOLDS.labels("refused", result.code or "Unknown").inc()
            said = f"{result.message}; {result.fix}" if result.fix else (result.message or "")
            if result.code == INTERNAL:
                raise errors.Unavailable(f"billing could not fund the run: {said}")
            raise errors.Invalid(f"billing cannot fund the run: {said}")
        if not result.ok:
            if result.code in FUNDING_REASONS:
                await self._block(
                    req,
                    Block(
                        reason=result.code or "",
                        message=result.message or "",
                        fix=result.fix or "",
                        rate_micros_per_hour=rate,
                    ),
                )
            measuring.BILLING_HOLDS.labels("refused", result.code or "Unknown").inc()
            return HoldReply(ok=False, code=result.code, message=result.message, fix=result.fix)
        hold = state.holds[req.attempt]
        measuring.BILLING_HOLDS.labels("placed", "").inc()
        return HoldReply(ok=True, hold_micros=hold.reserved_micros, funded_until_ms=hold.funded_until_ms)

    async def _block(self, req: HoldRequest, block: Block) -> None:
        store = self.metering.funding
        record = Funding(
            metadata=ObjectMeta(name=req.job, namespace=req.namespace), job_uid=req.job_uid, blocked=block
        )
        try:
            current = await store.get(req.namespace, req.job)
        except NotFound:
            try:
                self.metering.wrote_funding(await store.create(record))
            except errors.AlreadyExists:
                pass  # another replica blocked it at the same moment
            return
        if current.job_uid == req.job_uid and current.blocked == block:
            return
        record.metadata.resource_version = current.metadata.resource_version
        try:
            self.metering.wrote_funding(await store.update(record))
        except errors.Conflict:
            pass  # written meanwhile: metering's next pass decides


class Accounts:
    def __init__(self, books: Books, requeue_project: Any = None) -> None:
        self.books = books
        self.requeue_project = requeue_project or (lambda project: None)
        self.archive = Archive(books.nc)

    @guarded("read the account")
    async def account(self, req: AccountRequest) -> AccountView:
        return account_view(req.project, await self.books.read(req.project))

    @guarded("grant or revoke credits")
    async def grant(self, req: GrantRequest) -> GrantReply:
        op: Op
        if req.revoke:
            op = Revoke(revoke_id=req.grant_id, project=req.project, amount_micros=req.amount_micros)
        else:
            op = Grant(grant_id=req.grant_id, project=req.project, amount_micros=req.amount_micros)
        applied = await self.books.apply(req.project, [op])
        result = applied.results[0]
        view = account_view(req.project, applied.state)
        if result is not None and result.code == INTERNAL:
            raise errors.Unavailable(f"billing could not grant or revoke credits: {result.message}")
        if result is None or not result.ok:
            code = result.code if result else "Invalid"
            return GrantReply(
                ok=False,
                code=code,
                message=result.message if result else None,
                fix=result.fix if result else None,
                account=view,
            )
        if not req.revoke:
            self.requeue_project(req.project)  # blocked Jobs may run again
        return GrantReply(ok=True, account=view)

    @guarded("read the usage")
    async def usage(self, req: UsageRequest) -> UsageReply:
        state = await self.books.read(req.project)
        records = await self.archive.records(req.project)
        runs = {**filed_holds(records), **state.holds}
        sweeps = {r.job: r.sweep for r in records if r.sweep is not None}
        rows = usage_rows(state, req.project, req.month, runs, sweeps)
        return UsageReply(project=req.project, rows=rows)


def account_view(project: str, state: State) -> AccountView:
    refs = [r for r, job in state.jobs.items() if job.project == project]
    spent = forgotten_spent(state) + sum(job_spent(state, r) for r in refs)
    granted = sum(
        e.amount_micros if e.source == CREDITS_ISSUED else -e.amount_micros
        for e in state.ledger.values()
        if CREDITS_ISSUED in (e.source, e.target)
        and project in (_project_of(e.source), _project_of(e.target))
    )
    covered = state.filed_covered_micros + sum(
        sum(h.usage.covered.values()) for h in state.holds.values() if h.project == project and h.usage
    )
    return AccountView(
        project=project,
        granted_micros=granted,
        available_micros=available(state, project),
        held_micros=project_held(state, project),
        spent_micros=spent,
        unbilled_micros=sum(state.jobs[r].unbilled_micros for r in refs)
        + covered
        + state.forgotten_unbilled_micros,
        open_holds=sum(1 for h in state.holds.values() if h.project == project and h.status == "Open"),
    )


def _project_of(account: str) -> str | None:
    parts = account.split(":")
    return parts[1] if len(parts) == 3 and parts[0] == "project" else None


def usage_rows(
    state: State,
    project: str,
    month: str | None,
    runs: Mapping[str, Hold] | None = None,
    sweeps: Mapping[str, str] | None = None,
) -> list[UsageRow]:
    """One row per captured hold (one Attempt's run), oldest first. ``runs``: every run's hold, those
    filed out of the book included (``Archive.runs``); by default the book's. ``sweeps``: the Sweep of
    each Job the book has forgotten (its history record's)."""
    rows: list[UsageRow] = []
    holds = state.holds if runs is None else runs
    for hold in sorted(holds.values(), key=lambda h: (h.placed_ms, h.usage.attempt if h.usage else "")):
        if hold.project != project or hold.usage is None or (month and hold.month != month):
            continue
        u = hold.usage
        job = state.jobs.get(hold.job)
        sweep = job.sweep if job is not None else (sweeps or {}).get(hold.job)
        rows.append(
            UsageRow(
                month=hold.month,
                job=hold.job.rsplit("@", 1)[0],
                attempt=u.attempt,
                offering=u.offering,
                pricebook_version=u.pricebook_version,
                rate_micros_per_hour=u.rate_micros_per_hour,
                billed_millis=u.billed_millis,
                amount_micros=hold.charged_micros,
                boot_micros=u.segments.get("Boot", 0),
                running_micros=u.segments.get("Running", 0),
                restore_micros=u.segments.get("Restore", 0),
                teardown_micros=u.segments.get("Teardown", 0),
                covered_micros=sum(u.covered.values()),
                sweep=sweep.rsplit("@", 1)[0] if sweep else None,
                start_time=u.start_time,
                finish_time=u.finish_time,
            )
        )
    return rows


async def serve_holds(nc: NATS, holds: Holds) -> Any:
    # Concurrent requests wait together on the project's book: one KV write serves them all.
    return await messaging.serve(
        nc, HOLD_SUBJECT, HoldRequest, holds.hold, queue=QUEUE, concurrency=HOLDS_IN_FLIGHT
    )


async def serve_accounts(nc: NATS, books: Books, requeue_project: Any = None) -> list[Any]:
    """The account, grant and usage endpoints; returns their subscriptions."""
    accounts = Accounts(books, requeue_project)
    return [
        await messaging.serve(nc, ACCOUNT_SUBJECT, AccountRequest, accounts.account, queue=QUEUE),
        await messaging.serve(nc, GRANT_SUBJECT, GrantRequest, accounts.grant, queue=QUEUE),
        await messaging.serve(nc, USAGE_SUBJECT, UsageRequest, accounts.usage, queue=QUEUE),
    ]
