"""Events of Sweeps on the bus, as Kubernetes Events say them (as nodus_scheduler.eventing does).

Subject ``nodus.events.<namespace>.sweeps.<name>`` on the NODUS_EVENTS stream, one :class:`ObjectEvent`
each. The message id is the Sweep's uid and what happened, so a pass that runs again after a crash
publishes the same event again and the stream's duplicate window drops it. News, not state: published
without waiting for the stream's acknowledgement, and a failed publish never fails the pass.
"""

from __future__ import annotations

import logging

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit import tracing
from nodus_kit.messaging import MSG_ID
from nodus_schema.messages import ObjectEvent
from nodus_schema.meta import now_rfc3339
from nodus_schema.sweeps import Sweep

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()


def event_subject(namespace: str | None, name: str) -> str:
    return f"nodus.events.{namespace or '_'}.sweeps.{name}"


async def publish_event(
    nc: NATS,
    sweep: Sweep,
    reason: str,
    message: str,
    *,
    severity: str = "Normal",
    once: str | None = None,
) -> None:
    """Publish an event of ``sweep``; ``once`` (default: the reason) keys its deduplication."""
    meta = sweep.metadata
    event = ObjectEvent(
        namespace=meta.namespace or "",
        kind=sweep.kind,
        name=meta.name or "",
        uid=meta.uid or "",
        reason=reason,
        message=message,
        time=now_rfc3339(),
        severity=severity,
        phase=sweep.status.phase,
    )
    headers = tracing.inject({MSG_ID: f"event:{meta.uid}:{once or reason}"})
    try:
        await nc.publish(
            event_subject(meta.namespace, meta.name or ""), _encoder.encode(event), headers=headers
        )
    except Exception as e:  # news, not state: a failed publish must not fail the reconcile
        log.warning("event not published: %s", e, extra={"object": meta.name, "reason": reason})
