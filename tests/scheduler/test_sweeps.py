"""The sweep controller with the real scheduler (and billing): maxParallel, state, and stopping early.

The rig is the scheduler's (tests/scheduler/conftest.py); the sweep controller runs in this process on the
rig's connection, as the scheduler and billing do.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from nodus_kit.servicing import Settings
from nodus_kit.storing import ObjectStore
from nodus_schema.defaulting import default_sweep
from nodus_schema.jobs import Job
from nodus_schema.messages import StartAttempt
from nodus_schema.meta import ObjectMeta
from nodus_schema.quantities import usd_to_micros
from nodus_schema.sweeps import SWEEP_LABEL, Sweep, SweepSpec
from nodus_sweeps.reconciling import STOP_EARLY_ANNOTATION
from nodus_sweeps.service import SweepsService
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)


def forever(_: StartAttempt) -> tuple[float | None, int]:
    return (None, 0)


@contextlib.asynccontextmanager
async def sweeps_service(rig: Any) -> AsyncIterator[SweepsService]:
    settings = Settings.from_env(
        "nodus-sweeps",
        {
            "NODUS_NATS_URL": rig.server.url,
            "NODUS_NATS_NKEY_SEED": str(rig.server.harness_seed),
            "NODUS_REPLICA": "test",
            "NODUS_RESYNC_S": "1",
        },
    )
    svc = SweepsService(settings)
    svc.nc = rig.nc
    await svc.start()
    try:
        yield svc
    finally:
        svc.stopping.set()
        await svc.stop()


async def create_sweep(rig: Any, name: str, annotations: dict[str, str] | None = None, **spec: Any) -> Sweep:
    body = {"template": {"spec": {"image": "busybox", "resources": {"gpu": "L4:1"}}}, **spec}
    sweep = Sweep(
        metadata=ObjectMeta(name=name, namespace="t", annotations=annotations or {}, generation=1),
        spec=msgspec.convert(body, SweepSpec),
    )
    return await ObjectStore(rig.nc, "sweeps", Sweep).create(default_sweep(sweep))


async def change_sweep(rig: Any, name: str, **changes: Any) -> Sweep:
    def change(s: Sweep) -> Sweep:
        meta = msgspec.structs.replace(s.metadata, generation=(s.metadata.generation or 1) + 1)
        return msgspec.structs.replace(s, metadata=meta, spec=msgspec.structs.replace(s.spec, **changes))

    return await ObjectStore(rig.nc, "sweeps", Sweep).mutate("t", name, change)


async def cells(rig: Any, name: str) -> list[Job]:
    return [j for j in (await rig.jobs.list("t")).items if j.metadata.labels.get(SWEEP_LABEL) == name]


async def sweep_of(rig: Any, name: str) -> Sweep:
    return await ObjectStore(rig.nc, "sweeps", Sweep).get("t", name)


async def test_max_parallel_bounds_unfinished_cells_and_state_reaches_every_cell(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(forever, nodes=8) as rig, sweeps_service(rig):
        await create_sweep(rig, "par", maxParallel=2, matrix={"params": {"X": [str(i) for i in range(6)]}})

        async def count(n: int) -> list[Job]:
            jobs = await cells(rig, "par")
            assert len(jobs) == n and all(j.status.phase == "Running" for j in jobs), [
                (j.metadata.name, j.status.phase) for j in jobs
            ]
            return jobs

        await eventually(lambda: count(2), deadline_s=20, message="maxParallel 2: two cells run")
        await change_sweep(rig, "par", max_parallel=4)
        await eventually(lambda: count(4), deadline_s=20, message="raising maxParallel starts more at once")

        await change_sweep(rig, "par", state="Suspended")

        async def suspended() -> bool:
            jobs = await cells(rig, "par")
            assert len(jobs) == 4, "suspending creates no cells"
            assert all(j.spec.state == "Suspended" and j.status.phase == "Suspended" for j in jobs)
            assert all((j.metadata.generation or 1) > 1 for j in jobs), "a spec change is a new generation"
            return (await sweep_of(rig, "par")).status.phase == "Suspended"

        await eventually(suspended, deadline_s=30, message="the Sweep and every cell are suspended")
        await change_sweep(rig, "par", state="Running", max_parallel=1)

        async def resumed() -> bool:
            jobs = await cells(rig, "par")
            # Lowering maxParallel lets the running cells go on: none is stopped for it, none is added.
            assert len(jobs) == 4
            return all(j.spec.state == "Running" and j.status.phase == "Running" for j in jobs)

        await eventually(resumed, deadline_s=30, message="Running resumes every cell")
        await change_sweep(rig, "par", state="Cancelled")

        async def cancelled() -> bool:
            jobs = await cells(rig, "par")
            assert len(jobs) == 4, "cancelling creates no cells"
            return all(j.status.phase == "Cancelled" for j in jobs) and (
                (await sweep_of(rig, "par")).status.phase == "Cancelled"
            )

        await eventually(cancelled, deadline_s=30, message="Cancelled cancels every cell for good")


async def test_stop_early_starts_no_cell_the_cap_cannot_pay_for(make_rig: Callable[..., Any]) -> None:
    async with make_rig(nodes=2, funding=True) as rig, sweeps_service(rig):
        await rig.start_billing(
            NODUS_STARTING_CREDITS_USD="10", NODUS_METER_TICK_S="0.5", NODUS_STOP_MARGIN_S="1"
        )
        # Each cell costs about one second at $0.79/h (0.000220); ten of them would need 0.0022.
        await create_sweep(
            rig,
            "thrifty",
            annotations={STOP_EARLY_ANNOTATION: "true"},
            maxParallel=1,
            maxCostUSD="0.0012",
            matrix={"params": {"X": [str(i) for i in range(10)]}},
        )

        async def stopped() -> Sweep:
            sweep = await sweep_of(rig, "thrifty")
            assert (sweep.status.phase, sweep.status.reason) == ("Suspended", "StoppedEarly"), sweep.status
            return sweep

        sweep = await eventually(stopped, deadline_s=60, message="the Sweep stops early")
        done = [j for j in await cells(rig, "thrifty") if j.status.phase == "Succeeded"]
        assert 1 <= len(done) < 10
        condition = next(c for c in sweep.status.conditions if c.type == "ProjectedOverCap")
        assert condition.status == "True" and "cells left need about" in (condition.message or "")
        assert "raise spec.maxCostUSD to at least" in (sweep.status.message or "")
        assert sweep.status.cost is not None
        assert usd_to_micros(sweep.status.cost.total_usd or "0") <= 1_200, "within the cap"
