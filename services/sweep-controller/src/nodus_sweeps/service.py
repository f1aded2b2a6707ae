"""The sweep controller service: one leader reconciles every Sweep from Sweep and cell-Job events."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from nodus_kit.controlling import Controller, Key, Source
from nodus_kit.leasing import Lease, run_as_leader
from nodus_kit.servicing import Service
from nodus_kit.storing import Event
from nodus_schema.sweeps import SWEEP_LABEL
from nodus_sweeps.reconciling import SweepReconciler


def job_to_sweep(event: Event[Any]) -> Iterable[Key]:
    meta = event.object.metadata
    sweep = meta.labels.get(SWEEP_LABEL)
    return [(meta.namespace or "", sweep)] if sweep else []


class SweepsService(Service):
    name = "nodus-sweeps"

    async def start(self) -> None:
        rec = SweepReconciler(self.bus)
        self.controller = Controller(
            "sweeps",
            rec.reconcile,
            [Source(rec.sweeps), Source(rec.jobs, job_to_sweep)],
            workers=4,
            resync_s=float(self.settings.env.get("NODUS_RESYNC_S", "30")),
        )
        lease = Lease(self.bus, "sweep-controller", self.settings.replica, ttl_s=10)
        self._leader = asyncio.create_task(run_as_leader(lease, self.controller.run, stop=self.stopping))

    async def stop(self) -> None:
        await self.controller.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._leader
