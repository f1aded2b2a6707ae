"""The commit of a writable Volume mount, asked of the gateway (``nodus.rpc.node.<node>.commit``, ADR-0036).

The agent uploads the mount's content as a blob itself (it has the store's keys); only the gateway may make
it the Volume's next revision, and does so only while the Attempt is bound to this node and its Job holds
the Volume's writer claim. A repeated request (same Attempt, same digest) answers the same revision, so a
commit cut short by a lost reply or a restarted agent is simply asked again.
"""

from __future__ import annotations

from typing import Final, Protocol

from nats.aio.client import Client as NATS

from nodus_kit import messaging
from nodus_schema.noding import VolumeCommitReply, VolumeCommitRequest, commit_subject

__all__ = ["Committer", "VolumeCommitter"]

TIMEOUT_S: Final = 30.0
"""The gateway writes the Volume (a compare-and-set) and the blob's record before it answers."""


class VolumeCommitter(Protocol):
    """What :func:`nodus_agent.mounting.commit_mounts` asks: :class:`Committer`, or a fake in tests."""

    async def commit(self, request: VolumeCommitRequest) -> VolumeCommitReply: ...


class Committer:
    """Asks this node's commit subject; errors are the kit's (``errors.NotFound`` for a refusal: the
    Attempt is not bound here or its Job does not hold the writer claim; ``Timeout``/``Unavailable`` when
    the gateway does not answer)."""

    def __init__(self, nc: NATS, node: str, *, timeout_s: float = TIMEOUT_S) -> None:
        self.nc, self.subject, self.timeout_s = nc, commit_subject(node), timeout_s

    async def commit(self, request: VolumeCommitRequest) -> VolumeCommitReply:
        return await messaging.request(
            self.nc, self.subject, request, VolumeCommitReply, timeout=self.timeout_s
        )
