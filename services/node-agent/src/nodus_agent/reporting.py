"""Reports to the scheduler and billing on ``nodus.report.<node>.<namespace>.<attempt>``, with
deterministic ids.

Ids are ``<ns>/<attempt>:started``, ``…:progress:<n>`` and ``…:finished`` (attempt names are only unique
within a namespace, so the namespace is part of the id): a report published
twice (a retry, a duplicate StartAttempt, an agent restart) is dropped by the stream inside its
duplicate window, and readers are idempotent on the same key beyond it.
"""

from __future__ import annotations

import asyncio
import logging

from nats.js import JetStreamContext

from nodus_kit.messaging import backoff, publish
from nodus_schema.messages import AttemptFinished, AttemptProgress, AttemptStarted, Report

log = logging.getLogger(__name__)


def subject(node: str, namespace: str, attempt: str) -> str:
    return f"nodus.report.{node}.{namespace}.{attempt}"


class Reporter:
    def __init__(self, js: JetStreamContext, node: str) -> None:
        self.js, self.node = js, node

    async def started(self, namespace: str, attempt: str, time: str) -> None:
        msg = AttemptStarted(namespace=namespace, attempt=attempt, node=self.node, time=time)
        await self._send(msg, f"{namespace}/{attempt}:started", tries=8)

    async def progress(self, namespace: str, attempt: str, n: int, units_per_second: str) -> bool:
        """Best effort: a lost progress report is superseded by the next one and by the finish."""
        msg = AttemptProgress(
            namespace=namespace, attempt=attempt, node=self.node, units_per_second=units_per_second
        )
        try:
            await self._send(msg, f"{namespace}/{attempt}:progress:{n}", tries=1)
        except Exception as e:
            log.warning("progress report not sent: %s", e, extra={"attempt": attempt})
            return False
        return True

    async def finished(self, msg: AttemptFinished) -> None:
        # Many tries: until this is acknowledged the attempt's record says "unreported", and only an
        # agent restart would send it again.
        await self._send(msg, f"{msg.namespace}/{msg.attempt}:finished", tries=12)

    async def _send(self, msg: Report, msg_id: str, *, tries: int) -> None:
        for n in range(1, tries + 1):
            try:
                await publish(self.js, subject(self.node, msg.namespace, msg.attempt), msg, msg_id=msg_id)
                return
            except Exception as e:  # a reconnecting bus: wait and publish again (same id, no duplicate)
                if n == tries:
                    raise
                log.warning("report %s not acknowledged (%s): retrying", msg_id, e)
                await asyncio.sleep(backoff(n, base=0.25, cap=5.0))
