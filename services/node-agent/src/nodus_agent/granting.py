"""What this node may read for a run, asked of the gateway (nodus_schema.noding, ADR-0026).

The agent's credential reads no Job, Secret or Connection: it asks ``nodus.rpc.node.<node>.secrets`` for
one Attempt, and the gateway answers only while that Attempt is bound to this node and not finished, with
only what its Job names. The same answer is the agent's check that a StartAttempt is about an Attempt
that exists and is its own: a refusal means the run is not ours, and nothing of it starts.

One answer per Attempt is kept while it runs (its sinks need the Connections again at the end), at most
:data:`KEPT` of them; values stay in memory only, never in a log or an error message.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from nats.aio.client import Client as NATS

from nodus_kit import errors, messaging
from nodus_schema.configs import Connection, Secret
from nodus_schema.messages import StartAttempt
from nodus_schema.noding import (
    GrantedRevision,
    RunSecrets,
    RunSecretsRequest,
    ServiceAccountGrant,
    secrets_subject,
)

T = TypeVar("T", Secret, Connection)
KEPT: Final = 1024
TIMEOUT_S: Final = 10.0


class NotBound(errors.PermanentError):
    """The gateway says the Attempt is not bound to this node (or does not exist, or has finished)."""


@dataclass
class _Reader(Generic[T]):
    """``get(namespace, name)`` over one answer, as the agent's Secret and Connection readers are."""

    namespace: str
    items: dict[str, T] = field(default_factory=dict)

    async def get(self, namespace: str | None, name: str) -> T:
        found = self.items.get(name) if namespace == self.namespace else None
        if found is None:
            raise errors.NotFound(f"{namespace}/{name} is not one this run may read")
        return found


@dataclass
class Granted:
    """What one Attempt may read: its Secrets and Connections by name, the blob of each Volume revision
    it mounts (ADR-0036: the agent learns revisions from the gateway, never from a Volume), and its
    ServiceAccount's API token (ADR-0037; ``missing`` names an account the gateway could not grant)."""

    namespace: str
    secrets: _Reader[Secret]
    connections: _Reader[Connection]
    revisions: list[GrantedRevision] = field(default_factory=list)
    service_account: ServiceAccountGrant | None = field(default=None, repr=False)
    missing: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, namespace: str, answer: RunSecrets) -> Granted:
        return cls(
            namespace,
            _Reader(namespace, {s.metadata.name or "": s for s in answer.secrets}),
            _Reader(namespace, {c.metadata.name or "": c for c in answer.connections}),
            list(answer.revisions),
            answer.service_account,
            list(answer.missing),
        )


class Grants:
    """Asks once per Attempt (and again after :meth:`forget`)."""

    def __init__(self, nc: NATS, node: str, *, timeout_s: float = TIMEOUT_S) -> None:
        self.nc, self.node, self.timeout_s = nc, node, timeout_s
        self._kept: OrderedDict[tuple[str, str], Granted] = OrderedDict()

    async def of(self, msg: StartAttempt) -> Granted:
        key = (msg.namespace, msg.attempt)
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept
        request = RunSecretsRequest(namespace=msg.namespace, attempt=msg.attempt)
        try:
            answer = await messaging.request(
                self.nc, secrets_subject(self.node), request, RunSecrets, timeout=self.timeout_s
            )
        except errors.NotFound as e:
            raise NotBound(str(e)) from None
        granted = Granted.of(msg.namespace, answer)
        self._kept[key] = granted
        while len(self._kept) > KEPT:
            self._kept.popitem(last=False)
        return granted

    def forget(self, namespace: str, attempt: str) -> None:
        self._kept.pop((namespace, attempt), None)
