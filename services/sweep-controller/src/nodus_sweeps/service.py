"""The sweep controller service: one leader reconciles every Sweep from Sweep and cell-Job events."""

from __future__ import annotations

import asyncio
import contextlib

from nodus_kit.controlling import Controller, Source
from nodus_kit.leasing import Lease, run_as_leader, ttl_from
from nodus_kit.servicing import Service
from nodus_sweeps.reconciling import SweepReconciler


class SweepsService(Service):
    name = "nodus-sweeps"

    async def start(self) -> None:
        self.reconciler = rec = SweepReconciler(self.bus)
        # Sweeps are watched by the controller, whose mapper keeps the Sweeps it decodes for the
        # reconciler (reconciling.py says why); cell Jobs by the reconciler's index, which puts their
        # Sweep in the queue once it holds the change (caching.py says why).
        self.controller = Controller(
            "sweeps",
            rec.reconcile,
            [Source(rec.sweeps, mapper=rec.seen)],
            workers=4,
            resync_s=float(self.settings.env.get("NODUS_RESYNC_S", "30")),
        )
        rec.cells.hook = lambda key: self.controller.queue.add(key)
        lease = Lease(self.bus, "sweep-controller", self.settings.replica, ttl_s=ttl_from(self.settings.env))
        self._leader = asyncio.create_task(run_as_leader(lease, self._lead, stop=self.stopping))

    async def _lead(self) -> None:
        self.reconciler.reset()
        await self.reconciler.cells.start()
        try:
            await self.controller.run()
        finally:
            await self.reconciler.cells.stop()

    async def stop(self) -> None:
        await self.controller.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
