"""The sweep controller service: one leader reconciles every Sweep from the Sweeps and cell Jobs its
informers hold.

Declared as controller-runtime declares one (issue #19): the Sweeps are what it reconciles; a Job change
wakes the Sweep it is a cell of (:meth:`SweepReconciler.wakes`); a Job a Sweep controls wakes that Sweep
too, and the controller queues the Sweep of any such Job whose Sweep is gone whenever it starts leading
and on every resync, so the cells of a Sweep deleted while no leader watched are collected; a finished
Sweep whose cells are all final is settled and left out of the resync (:func:`nodus_sweeps.cells.settled`).

The Pipeline controller (issue #22, ADR-0039) is declared beside it over the same informers: for Pipelines,
owning the Jobs and Sweeps a Pipeline controls (its stages' children, which the jobs and sweeps informers
index by ``nodus.dev/pipeline``, :func:`nodus_sweeps.staging.by_pipeline`), watching any other Job or Sweep
that holds a child's name (:meth:`PipelineReconciler.wakes`). It collects nothing (the gateway's cascade
deletes a deleted Pipeline's children), so an owned object whose Pipeline is gone wakes nothing.

The informers follow the store on every replica (a standby that wins the lease has its view already);
the controllers run on the leader only, both under the one lease.
"""

from __future__ import annotations

import asyncio
import contextlib

from nodus_kit.configuring import read_settings
from nodus_kit.controlling import Controller, owns, watches
from nodus_kit.informing import Indexer, Informer
from nodus_kit.leasing import Lease, run_as_leader
from nodus_kit.servicing import Service
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job
from nodus_schema.pipelines import Pipeline
from nodus_schema.sweeps import Sweep
from nodus_sweeps.cells import CELLS, SLOTS, by_cell, by_slot
from nodus_sweeps.pipelining import PipelineReconciler
from nodus_sweeps.reconciling import SweepReconciler
from nodus_sweeps.settings import SweepsSettings
from nodus_sweeps.staging import PIPELINES, by_pipeline


def _always(_: object) -> bool:
    return True


class SweepsService(Service):
    name = "nodus-sweeps"

    async def start(self) -> None:
        config = read_settings(SweepsSettings, self.settings.env)
        children: dict[str, Indexer] = {PIPELINES: by_pipeline}
        self.sweeps = Informer(ObjectStore(self.bus, "sweeps", Sweep), indexers=children, name="sweeps")
        indexers: dict[str, Indexer] = {SLOTS: by_slot, CELLS: by_cell, PIPELINES: by_pipeline}
        self.jobs = Informer(ObjectStore(self.bus, "jobs", Job), indexers=indexers, name="jobs")
        self.pipelines = Informer(ObjectStore(self.bus, "pipelines", Pipeline), name="pipelines")
        self.reconciler = rec = SweepReconciler(self.bus, self.sweeps, self.jobs)
        self.controller = Controller(
            "sweeps",
            rec.reconcile,
            for_=self.sweeps,
            owns=[owns(self.jobs, kind="Sweep")],
            watches=[watches(self.jobs, rec.wakes)],
            settled=rec.settled,
            workers=4,
            resync_s=config.resync_s,
        )
        self.pipeliner = pipes = PipelineReconciler(self.bus, self.pipelines, self.jobs, self.sweeps)
        self.pipelining = Controller(
            "pipelines",
            pipes.reconcile,
            for_=self.pipelines,
            # Nothing is collected here (the gateway cascades a delete): an owned object never wakes a
            # Pipeline that is gone, so the resync queues no key per leftover child.
            owns=[
                owns(self.jobs, kind="Pipeline", settled=_always),
                owns(self.sweeps, kind="Pipeline", settled=_always),
            ],
            watches=[watches(self.jobs, pipes.wakes), watches(self.sweeps, pipes.wakes)],
            settled=pipes.settled,
            workers=4,
            resync_s=config.resync_s,
        )
        await self.sweeps.start()
        await self.jobs.start()
        await self.pipelines.start()
        lease = Lease(self.bus, "sweep-controller", self.settings.replica, ttl_s=config.lease_ttl_s)
        self._leader = asyncio.create_task(run_as_leader(lease, self._lead, stop=self.stopping))

    async def _lead(self) -> None:
        """Both controllers, while this replica holds the lease: cancelled together when it is lost, and
        one that fails takes the other down with it (the lease loop then starts both again)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.controller.run(), name="sweeps")
            group.create_task(self.pipelining.run(), name="pipelines")

    async def stop(self) -> None:
        await self.controller.stop()
        await self.pipelining.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
        # The controllers do not own the informers: the service that started them stops them.
        await self.sweeps.stop()
        await self.jobs.stop()
        await self.pipelines.stop()
