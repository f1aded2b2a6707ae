"""The scheduler's view of the world: the kit's informers (:mod:`nodus_kit.informing`) for Jobs, Attempts,
Nodes and billing's funding records, shared by every controller of the process.

Placement decides from this view (which nodes are free, what each index of each Job has run) instead of
reading the store on every decision, which is what lets one scheduler place thousands of indexes a second;
a reconcile reads its Job and Attempts from here too, so a resync costs no request. Two indexes answer
what the scheduler asks most: the Attempts of a Job (:data:`BY_JOB`) and the active Attempts on a node
(:data:`ACTIVE_ON`, one run per node at a time). The controllers reconcile only once every informer has
listed (:attr:`World.synced`), so a scheduler that has just restarted never starts a run the store already
holds.

Safe to lose: killing the process loses only the view, and a new one lists again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nats.aio.client import Client as NATS

from nodus_kit.informing import Informer
from nodus_kit.storing import ObjectStore
from nodus_scheduler.beating import Liveness
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_LABEL, Attempt
from nodus_schema.billing import FUNDING_BUCKET, Funding
from nodus_schema.jobs import Job
from nodus_schema.nodes import Node

JobKey = tuple[str, str]  # (namespace, Job name)
BY_JOB = "job"
ACTIVE_ON = "active-on"
WARM_ON = "warm-on"
"""Finished Attempts with a warm window not ended early, by node (issue #21; nodus_schema.warmth)."""
WARM_FROM = "warm-from"
"""Attempts that reused a warm window, by the keeper's namespace/name."""


def job_key(a: Attempt) -> JobKey:
    return (a.metadata.namespace or "", a.metadata.labels.get(JOB_LABEL, a.spec.job))


def _by_job(a: Attempt) -> Iterable[str]:
    ns, job = job_key(a)
    return (f"{ns}/{job}",)


def _active_on(a: Attempt) -> Iterable[str]:
    return () if a.status.phase in ATTEMPT_TERMINAL else (a.spec.node,)


def _warm_on(a: Attempt) -> Iterable[str]:
    st = a.status
    return (a.spec.node,) if st.warm_until_ms is not None and st.warm_end_ms is None else ()


def _warm_from(a: Attempt) -> Iterable[str]:
    return (f"{a.metadata.namespace or ''}/{a.spec.warm_from}",) if a.spec.warm_from else ()


class World:
    """The informers, and the questions the scheduler asks of them."""

    def __init__(self, nc: NATS, *, funding: bool = True) -> None:
        self.nc = nc
        # The beats heard on the bus, laid over the Nodes' records (ADR-0042).
        self.liveness = Liveness()
        self.jobs = Informer(ObjectStore(nc, "jobs", Job))
        self.attempts = Informer(
            ObjectStore(nc, "attempts", Attempt),
            indexers={BY_JOB: _by_job, ACTIVE_ON: _active_on, WARM_ON: _warm_on, WARM_FROM: _warm_from},
        )
        self.nodes = Informer(ObjectStore(nc, "nodes", Node), transform=self.liveness.overlay)
        self.liveness.attach(self.nodes)
        # NODUS_FUNDING=off: a fleet nobody pays for has no funding records to follow.
        self.funding = Informer(ObjectStore(nc, FUNDING_BUCKET, Funding)) if funding else None

    @property
    def informers(self) -> list[Informer[Any]]:
        found: list[Informer[Any]] = [self.jobs, self.attempts, self.nodes]
        return [*found, self.funding] if self.funding is not None else found

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    async def wait_synced(self, timeout: float) -> bool:
        for informer in self.informers:
            if not await informer.wait_synced(timeout):
                return False
        return True

    async def start(self) -> None:
        await self.liveness.start(self.nc)  # first: a beat after the list is not missed
        for informer in self.informers:
            await informer.start()

    async def stop(self) -> None:
        for informer in self.informers:
            await informer.stop()
        await self.liveness.stop()

    # -- questions -----------------------------------------------------------------------------------
    def attempts_of(self, key: JobKey) -> list[Attempt]:
        return self.attempts.by_index(BY_JOB, f"{key[0]}/{key[1]}")

    def attempt(self, namespace: str | None, name: str) -> Attempt | None:
        return self.attempts.get(namespace, name)

    def node(self, name: str) -> Node | None:
        return self.nodes.get(None, name)

    def active_on(self, node: str) -> int:
        """How many unfinished Attempts the node has (one run per node at a time)."""
        return len(self.attempts.by_index(ACTIVE_ON, node))

    def warm_on(self, node: str) -> list[Attempt]:
        """Finished Attempts on ``node`` whose warm window was not ended early (it may have run out, or a
        reuse may have ended it: nodus_schema.warmth decides)."""
        return self.attempts.by_index(WARM_ON, node)

    def reusers_of(self, keeper: Attempt) -> list[Attempt]:
        """The Attempts that reused ``keeper``'s warm window."""
        return self.attempts.by_index(WARM_FROM, f"{keeper.metadata.namespace or ''}/{keeper.metadata.name}")

    def busy(self) -> set[str]:
        """Nodes with an active Attempt."""
        return set(self.attempts.index_values(ACTIVE_ON))
