"""Events on the bus: every transition of a Job or an Attempt, as Kubernetes Events say them.

Subject ``nodus.events.<namespace>.<plural>.<name>`` on the NODUS_EVENTS stream, one :class:`ObjectEvent`
each. Published at least once: the message id is the object's uid and the transition, so a reconcile
that runs again after a crash publishes the same event again and the stream's duplicate window drops it.
An event is news, not state: losing one (past the window, or a failed publish) loses no decision.
"""

from __future__ import annotations

import logging
from typing import Any

from nats.js import JetStreamContext

from nodus_kit import messaging
from nodus_schema.messages import ObjectEvent
from nodus_schema.meta import now_rfc3339

log = logging.getLogger(__name__)

PLURALS = {"Job": "jobs", "Attempt": "attempts", "Sweep": "sweeps", "Node": "nodes"}


def event_subject(kind: str, namespace: str | None, name: str) -> str:
    return f"nodus.events.{namespace or '_'}.{PLURALS.get(kind, kind.lower() + 's')}.{name}"


async def publish_event(
    js: JetStreamContext,
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
    try:
        await messaging.publish(
            js,
            event_subject(obj.kind, meta.namespace, meta.name or ""),
            event,
            msg_id=f"event:{meta.uid}:{once or reason}",
        )
    except Exception as e:  # news, not state: a failed publish must not fail the reconcile
        log.warning("event not published: %s", e, extra={"object": meta.name, "reason": reason})
