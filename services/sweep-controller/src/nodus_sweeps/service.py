"""The sweep controller service: one leader reconciles every Sweep from the Sweeps and cell Jobs its
informers hold.

Declared as controller-runtime declares one (issue #19): the Sweeps are what it reconciles; a Job change
wakes the Sweep it is a cell of (:meth:`SweepReconciler.wakes`); a Job a Sweep controls wakes that Sweep
too, and the controller queues the Sweep of any such Job whose Sweep is gone whenever it starts leading
and on every resync, so the cells of a Sweep deleted while no leader watched are collected; a finished
Sweep whose cells are all final is settled and left out of the resync (:func:`nodus_sweeps.cells.settled`).

The informers follow the store on every replica (a standby that wins the lease has its view already);
the controller runs on the leader only.
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
from nodus_schema.sweeps import Sweep
from nodus_sweeps.cells import CELLS, SLOTS, by_cell, by_slot
from nodus_sweeps.reconciling import SweepReconciler
from nodus_sweeps.settings import SweepsSettings


class SweepsService(Service):
    name = "nodus-sweeps"

    async def start(self) -> None:
        config = read_settings(SweepsSettings, self.settings.env)
        self.sweeps = Informer(ObjectStore(self.bus, "sweeps", Sweep), name="sweeps")
        indexers: dict[str, Indexer] = {SLOTS: by_slot, CELLS: by_cell}
        self.jobs = Informer(ObjectStore(self.bus, "jobs", Job), indexers=indexers, name="jobs")
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
        await self.sweeps.start()
        await self.jobs.start()
        lease = Lease(self.bus, "sweep-controller", self.settings.replica, ttl_s=config.lease_ttl_s)
        self._leader = asyncio.create_task(run_as_leader(lease, self.controller.run, stop=self.stopping))

    async def stop(self) -> None:
        await self.controller.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
        # The controller does not own the informers: the service that started them stops them.
        await self.sweeps.stop()
        await self.jobs.stop()
