"""Funding: billing's word on each Job, as the scheduler needs it (ADR-0024).

Before an Attempt is created the binder asks billing for a hold (``nodus.rpc.billing.hold``); a hold that
does not fit leaves the Job waiting, and billing blocks the Job in the ``funding`` bucket with the reason
(MaxCostReached, InsufficientCredits, BudgetExceeded) and a fix. The scheduler's informer keeps those
records in memory (:mod:`nodus_scheduler.viewing`) so that every reconcile sees them without a read: a
blocked Job is stopped with a checkpoint and held Suspended with billing's reason, and runs again once
billing clears the block.

``NODUS_FUNDING=off`` runs without billing (a private fleet nobody pays for): no holds, no blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from nats.aio.client import Client as NATS

from nodus_kit import errors, messaging
from nodus_kit.informing import Informer, key_of
from nodus_kit.keying import Event
from nodus_schema.attempts import Attempt
from nodus_schema.billing import (
    FUNDING_REASONS,
    HOLD_SUBJECT,
    Block,
    Funding,
    HoldReply,
    HoldRequest,
)
from nodus_schema.jobs import Job
from nodus_schema.meta import ObjectMeta

log = logging.getLogger(__name__)

HOLD_TIMEOUT_S: Final = 5.0
RETRY_AFTER_S: Final = 1.0
"""A Job whose hold could not be asked (billing down) is looked at again after this."""

JobKey = tuple[str, str]


class FundingView:
    """Billing's funding records by Job (from the world's informer), and the hold request.

    ``requeue(key, delay_s)`` looks at a Job again later: one whose hold could not be asked (billing down).
    A refusal is known here at once (billing writes the same record, which the informer brings a moment
    later): :attr:`refused` holds it until then."""

    def __init__(
        self,
        nc: NATS,
        records: Informer[Funding] | None,
        *,
        requeue: Callable[[JobKey, float], None] = lambda key, delay_s: None,
    ) -> None:
        self.nc = nc
        self.enabled = records is not None
        self.records = records
        self.requeue = requeue
        self.refused: dict[JobKey, Funding] = {}
        if records is not None:
            records.add_handler(self._recorded)

    def _recorded(self, event: Event[Funding]) -> None:
        self.refused.pop(key_of(event.object), None)  # billing's own record is in: it speaks now

    def blocked(self, job: Job) -> Block | None:
        """Why billing will not fund the Job now (None: it may run)."""
        key = (job.metadata.namespace or "", job.metadata.name or "")
        record = self.refused.get(key) or (self.records.get(*key) if self.records is not None else None)
        if record is None or record.job_uid != job.metadata.uid:
            return None
        return record.blocked

    async def hold(self, job: Job, attempts: tuple[Attempt, ...]) -> str | None:
        """Fund each Attempt before it is created; None when all are funded, else why not (the unplaced
        reason). A refusal blocks the Job here at once (billing has written the same record)."""
        if not self.enabled:
            return None
        key = (job.metadata.namespace or "", job.metadata.name or "")
        for attempt in attempts:
            request = HoldRequest(
                namespace=key[0],
                job=key[1],
                job_uid=job.metadata.uid or "",
                attempt=attempt.metadata.name or "",
                rate_micros_per_hour=attempt.spec.rate_micros_per_hour,
                window_millis=0,
            )
            try:
                reply = await messaging.request(
                    self.nc, HOLD_SUBJECT, request, HoldReply, timeout=HOLD_TIMEOUT_S
                )
            except errors.NodusError as e:
                self.requeue(key, RETRY_AFTER_S)
                # The Job's message is a user's to read: billing's own sentence for the kit's errors, never
                # the text of an unexpected failure (an older billing answered Python's words).
                known = isinstance(e, errors.Unavailable | errors.Timeout | errors.Invalid)
                why = str(e) if known else "billing could not fund it just now; it is asked again shortly"
                return f"waiting for billing to fund the run: {why}"
            if not reply.ok and reply.code not in FUNDING_REASONS:
                # Not a funding verdict (a caps or credits refusal blocks the Job; this does not): ask again.
                log.warning("billing refused a hold with %s: %s", reply.code, reply.message)
                self.requeue(key, RETRY_AFTER_S)
                return "waiting for billing to fund the run: billing could not place the hold just now"
            if not reply.ok:
                block = Block(reason=reply.code or "", message=reply.message or "", fix=reply.fix or "")
                meta = ObjectMeta(name=key[1], namespace=key[0])
                self.refused[key] = Funding(metadata=meta, job_uid=job.metadata.uid or "", blocked=block)
                return f"{reply.message}; {reply.fix}"
        return None
