"""Node restriction for what agents send: a report, a log batch or a request about an Attempt counts only
when the node it came from is the node the Attempt is bound to (docs/production.md, ADR-0026).

The bus proves which node sent a message by its subject: an agent may publish reports only on
``nodus.report.<its node>.>``, log batches only on ``nodus.logs.<its node>.>`` and node requests only on
``nodus.rpc.node.<its node>.*``. What the message body says about its node is the agent's word, so the
subject's node, the body's node and the Attempt's node must all agree. Every consumer of agents' messages
(the scheduler, billing, the gateway) drops one that does not, counts it
(``nodus_node_messages_refused``) and logs it once per node, so a flood cannot fill the log.
"""

from __future__ import annotations

import logging
from typing import Final

from nodus_kit import measuring

log = logging.getLogger(__name__)

REPORT_PREFIX: Final = "nodus.report."
LOG_PREFIX: Final = "nodus.logs."
LOGGED_NODES: Final = 1024
"""Nodes whose first refusal is logged; past that, refusals are only counted (the log stays bounded)."""


def sender(subject: str, prefix: str) -> str | None:
    """The node token that follows ``prefix`` in ``subject`` (``nodus.report.<node>.…``); None if none."""
    if not subject.startswith(prefix):
        return None
    node = subject[len(prefix) :].split(".", 1)[0]
    return node or None


class Forgeries:
    """Counts (and logs once per node) what ``service`` refused of ``what`` (reports, logs, ...)."""

    def __init__(self, service: str, what: str) -> None:
        self.service, self.what = service, what
        self.counter = measuring.REFUSED_FROM_NODES.labels(service, what)
        self.logged: set[str] = set()
        self.total = 0

    def genuine(self, subject_node: str | None, claimed: str | None, bound: str | None, about: str) -> bool:
        """True when the three nodes agree; else the message is counted as refused (and False)."""
        if subject_node and subject_node == claimed == bound:
            return True
        self.count(
            subject_node or "?",
            f"{about}: sent as node {subject_node!r}, says node {claimed!r}, the Attempt is on {bound!r}",
        )
        return False

    def count(self, node: str, detail: str) -> None:
        self.total += 1
        self.counter.inc()
        if node in self.logged or len(self.logged) >= LOGGED_NODES:
            return
        self.logged.add(node)
        log.warning(
            "refused a %s from node %s (%s); later ones from this node are only counted",
            self.what,
            node,
            detail,
            extra={"node": node, "service": self.service},
        )
