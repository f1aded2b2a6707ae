"""Reports to the scheduler and billing on ``nodus.report.<node>.<namespace>.<attempt>``, with
deterministic ids, through the agent's on-disk outbox (:mod:`nodus_agent.outbox`).

Ids are ``<ns>/<attempt>:started``, ``…:progress:<n>`` and ``…:finished`` (attempt names are only unique
within a namespace, so the namespace is part of the id): a report published
twice (a retry, a duplicate StartAttempt, an agent restart) is dropped by the stream inside its
duplicate window, and readers are idempotent on the same key beyond it.

With an outbox (the node agent) every method returns once the report is **on disk**, not once the stream
has it: the outbox sends it, in order, whenever the bus is reachable, after a restart too. So a caller
that records "reported" after :meth:`Reporter.finished` records "handed to the outbox durably", which an
agent restart does not lose. ``finished(msg, delivered=True)`` also waits for the stream's ack, for a
caller that must know the scheduler can see it.

Without an outbox (the simulated fleet, which keeps its own journal) reports are published directly,
retried a few times, as before the outbox existed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from nats.js import JetStreamContext

from nodus_agent.outbox import Outbox
from nodus_kit import measuring
from nodus_kit.backingoff import Backoff
from nodus_kit.messaging import publish
from nodus_schema.attempts import MountRecord, SourceRecord
from nodus_schema.messages import AttemptFinished, AttemptProgress, AttemptStarted

log = logging.getLogger(__name__)
PUBLISH_BACKOFF = Backoff(base=0.25, cap=5.0)  # jittered: agents that lost the bus together spread out


class AboutAttempt(Protocol):
    """Any report about one attempt (the three below, a checkpoint saved, a throughput sample)."""

    @property
    def namespace(self) -> str: ...

    @property
    def attempt(self) -> str: ...


def subject(node: str, namespace: str, attempt: str) -> str:
    return f"nodus.report.{node}.{namespace}.{attempt}"


def progress_key(namespace: str, attempt: str) -> str:
    """The outbox key of an attempt's progress reports: a newer one replaces those not yet sent."""
    return f"progress:{namespace}/{attempt}"


class Reporter:
    def __init__(self, js: JetStreamContext, node: str, outbox: Outbox | None = None) -> None:
        """``outbox``: journal reports there (the node agent); None publishes directly (simulated nodes)."""
        self.js, self.node, self.outbox = js, node, outbox

    async def started(
        self,
        namespace: str,
        attempt: str,
        time: str,
        *,
        started_ms: int | None = None,
        program_ms: int | None = None,
        source: SourceRecord | None = None,
        mounts: list[MountRecord] | None = None,
    ) -> None:
        """AttemptStarted: durable in the outbox on return (or acknowledged, without one). ``source`` and
        ``mounts``: the commit or blob checked out and the Volume revisions mounted (ADR-0036)."""
        msg = AttemptStarted(
            namespace=namespace,
            attempt=attempt,
            node=self.node,
            time=time,
            started_ms=started_ms,
            program_ms=program_ms,
            source=source,
            mounts=list(mounts or []),
        )
        await self._send(msg, f"{namespace}/{attempt}:started", tries=8)
        measuring.AGENT_ATTEMPTS_STARTED.inc()

    async def progress(self, namespace: str, attempt: str, n: int, units_per_second: str) -> bool:
        """AttemptProgress ``n``; False if it could not be journalled (or, without an outbox, sent).

        Best effort: a lost or replaced progress report is superseded by the next one and by the finish.
        In the outbox only the newest unsent progress report of an attempt is kept.
        """
        msg = AttemptProgress(
            namespace=namespace, attempt=attempt, node=self.node, units_per_second=units_per_second
        )
        try:
            await self._send(
                msg, f"{namespace}/{attempt}:progress:{n}", tries=1, key=progress_key(namespace, attempt)
            )
        except Exception as e:
            log.warning("progress report not sent: %s", e, extra={"attempt": attempt})
            return False
        return True

    async def finished(self, msg: AttemptFinished, *, delivered: bool = False) -> None:
        """AttemptFinished: durable in the outbox on return; with ``delivered``, acknowledged by the
        stream as well (which may wait as long as the bus is down)."""
        # Without an outbox: many tries, since until this is acknowledged the attempt's record says
        # "unreported", and only an agent restart would send it again.
        await self._send(msg, f"{msg.namespace}/{msg.attempt}:finished", tries=12, delivered=delivered)
        measuring.AGENT_ATTEMPTS_FINISHED.labels(msg.reason).inc()

    async def send(
        self, msg: AboutAttempt, msg_id: str, *, key: str | None = None, delivered: bool = False
    ) -> None:
        """Any other report about an attempt, on its report subject, in order with the rest; ``key``
        lets a newer report replace unsent ones with the same key (samples that only the latest
        matters of). ``msg_id`` must be deterministic (``<ns>/<attempt>:<what>[:<n>]``)."""
        await self._send(msg, msg_id, tries=8, key=key, delivered=delivered)

    async def _send(
        self, msg: AboutAttempt, msg_id: str, *, tries: int, key: str | None = None, delivered: bool = False
    ) -> None:
        where = subject(self.node, msg.namespace, msg.attempt)
        if self.outbox is not None:
            seq = await self.outbox.append(where, msg, msg_id=msg_id, key=key)
            if delivered:
                await self.outbox.wait_sent(seq)
            return
        # Decorrelated jitter rather than full: a count of tries must still cover a reconnect's seconds.
        pauses = PUBLISH_BACKOFF.pauses()
        for n in range(1, tries + 1):
            try:
                await publish(self.js, where, msg, msg_id=msg_id)
                return
            except Exception as e:  # a reconnecting bus: wait and publish again (same id, no duplicate)
                if n == tries:
                    raise
                log.warning("report %s not acknowledged (%s): retrying", msg_id, e)
                await asyncio.sleep(next(pauses))
