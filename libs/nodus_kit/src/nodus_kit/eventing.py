"""Events on the bus: every transition of a Job, an Attempt or a Sweep, as Kubernetes Events say them (one
helper for every controller: the scheduler's and the sweep controller's).

Subject ``nodus.events.<namespace>.<plural>.<name>`` on the NODUS_EVENTS stream, one :class:`ObjectEvent`
each. The message id is the object's uid and the transition, so a reconcile that runs again after a
crash publishes the same event again and the stream's duplicate window drops it.

An event is news, not state: it is published without waiting for the stream's acknowledgement (a core
publish the stream still stores), because a placement would otherwise wait for three writes instead of
two. Losing one (the server restarting at that moment) loses no decision.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit import tracing
from nodus_kit.messaging import MSG_ID
from nodus_schema.messages import ObjectEvent
from nodus_schema.meta import now_rfc3339

log = logging.getLogger(__name__)

PLURALS = {"Job": "jobs", "Attempt": "attempts", "Sweep": "sweeps", "Node": "nodes"}


def event_subject(kind: str, namespace: str | None, name: str) -> str:
    return f"nodus.events.{namespace or '_'}.{PLURALS.get(kind, kind.lower() + 's')}.{name}"


_encoder = msgspec.json.Encoder()


async def publish_event(
    nc: NATS,
    obj: Any,
    reason: str,
    message: str,
    *,
    severity: str = "Normal",
    phase: str | None = None,
    once: str | None = None,
) -> None:
    """Publish the event of ``obj``'s transition; ``once`` (default: the reason) keys its deduplication."""
    meta = obj.metadata
    event = ObjectEvent(
        namespace=meta.namespace or "",
        kind=obj.kind,
        name=meta.name or "",
        uid=meta.uid or "",
        reason=reason,
        message=message,
        time=now_rfc3339(),
        severity=severity,
        phase=phase,
    )
    headers = tracing.inject({MSG_ID: f"event:{meta.uid}:{once or reason}"})
    try:
        await nc.publish(
            event_subject(obj.kind, meta.namespace, meta.name or ""), _encoder.encode(event), headers=headers
        )
    except Exception as e:  # news, not state: a failed publish must not fail the reconcile
        log.warning("event not published: %s", e, extra={"object": meta.name, "reason": reason})
