"""Warm capacity end to end (issue #21): a Sweep of 20 short cells with ``scaledownWindow: 5m`` on two
simulated nodes starts at most two runs cold, costs less than the same Sweep without a window, and its
estimate said so first.

The rig is the sweeps' crash test's: a nats-server of its own; the real scheduler, billing and sweep
controller in this event loop; a simulated fleet (``nodus_agent.simulating``) whose nodes boot for 2 s
cold and 0.05 s warm (``NODUS_SIM_BOOT_SECONDS``, ``NODUS_SIM_WARM_BOOT_SECONDS``: the run's Boot segment,
from billing's start to the program's launch, on the node's clock) and run each cell for 0.5 s.

The Sweep without a window runs first, in project ``cold``; then the same Sweep with ``scaledownWindow:
5m`` in project ``warm``. After the warm Sweep ends, its two nodes stay kept for ``warm``: a run of
another project does not get them, one of ``warm`` does. Its cell Jobs are then deleted, as a user who is
done deletes them, which ends the windows; what each project paid is read from its book once every hold
is captured.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_agent.simulating import FleetSettings, SimulatedFleet
from nodus_billing.archiving import Archive
from nodus_billing.books import Books
from nodus_billing.service import BillingService
from nodus_kit import declaring, messaging
from nodus_kit.connecting import connect
from nodus_kit.errors import NotFound
from nodus_kit.storing import ObjectStore
from nodus_scheduler.service import SchedulerService
from nodus_schema.attempts import Attempt
from nodus_schema.costs import Estimate
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.estimating import (
    ESTIMATE_SUBJECT,
    QUOTE_SUBJECT,
    EstimateReply,
    EstimateRequest,
    QuoteRequest,
)
from nodus_schema.jobs import Job
from nodus_schema.meta import ObjectMeta
from nodus_schema.quantities import micros_to_usd, usd_to_micros
from nodus_schema.sweeps import Sweep, SweepSpec
from nodus_sweeps.service import SweepsService
from nodus_testing.hosting import in_process
from nodus_testing.natsserver import NatsServer
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow

CELLS = 20
COLD_BOOT_S = 2.0
WARM_BOOT_S = 0.05


def _sweep_spec(window: str | None) -> SweepSpec:
    template: dict[str, Any] = {
        "image": "busybox",
        "command": ["true"],
        "resources": {"gpu": "L4:1"},
        "expectedDuration": "2m",
        "env": [
            {"name": "NODUS_SIM_SECONDS", "value": "0.5"},
            {"name": "NODUS_SIM_SIGMA", "value": "0"},
            {"name": "NODUS_SIM_BOOT_SECONDS", "value": str(COLD_BOOT_S)},
            {"name": "NODUS_SIM_WARM_BOOT_SECONDS", "value": str(WARM_BOOT_S)},
        ],
    }
    if window is not None:
        template["scaledownWindow"] = window
    body = {"matrix": {"params": {"A": [str(i) for i in range(CELLS)]}}, "template": {"spec": template}}
    return msgspec.convert(body, SweepSpec)


async def _estimate(nc: NATS, project: str, spec: SweepSpec) -> Estimate:
    """The scheduler's estimate priced by billing, over the real subjects, as the gateway asks."""
    request = EstimateRequest(namespace=project, kind="Sweep", sweep_spec=spec)
    scheduled = await messaging.request(nc, ESTIMATE_SUBJECT, request, EstimateReply, timeout=10)
    quoted = QuoteRequest(request=request, scheduled=scheduled)
    return (await messaging.request(nc, QUOTE_SUBJECT, quoted, EstimateReply, timeout=10)).estimate


async def _run_sweep(nc: NATS, project: str, spec: SweepSpec) -> list[Attempt]:
    """Create the Sweep, wait until every cell succeeded; its cells' Attempts."""
    sweep = Sweep(metadata=ObjectMeta(name="grid", namespace=project, generation=1), spec=spec)
    await ObjectStore(nc, "sweeps", Sweep).create(default_sweep(sweep))

    async def done() -> list[Attempt]:
        got = await ObjectStore(nc, "sweeps", Sweep).get(project, "grid")
        assert got.status.phase == "Succeeded", (got.status.phase, got.status.message)
        return (await ObjectStore(nc, "attempts", Attempt).list(project)).items

    return await eventually(done, deadline_s=120, interval_s=0.2, message=f"sweep {project} never ended")


async def _paid(nc: NATS, project: str) -> int:
    """What the project's Sweep cells were charged, once no hold of them is open (micro-dollars)."""
    state = await Books(nc).read(project)
    runs = await Archive(nc).runs(project, state)  # filed out of the book once final (issue #23)
    cells = [h for h in runs.values() if h.job.startswith("grid-")]
    assert len(cells) == CELLS, f"{len(cells)} holds of cells"
    assert all(h.status != "Open" for h in cells), "a hold is still open"
    return sum(h.charged_micros for h in cells)


def _boot_ms(a: Attempt) -> int:
    st = a.status
    assert st.billing_start_ms is not None and st.program_start_ms is not None
    return st.program_start_ms - st.billing_start_ms


@pytest.mark.timeout(300)
async def test_a_sweep_with_a_scaledown_window_starts_two_cold_and_costs_less(tmp_path: Path) -> None:
    with NatsServer() as server:
        nc = await connect(server.url, "warm", nkey_seed=server.harness_seed)
        await declaring.ensure(nc.jetstream())
        fleet = await SimulatedFleet(
            nc,
            FleetSettings(
                fleet="w", nodes=2, offerings=("l4-x1-us",), progress_s=0, seed=5, workdir=tmp_path / "fleet"
            ),
        ).start()
        try:
            async with (
                in_process(
                    BillingService, nc, {"NODUS_STARTING_CREDITS_USD": "100", "NODUS_METER_TICK_S": "1"}
                ),
                in_process(SchedulerService, nc, {"NODUS_RESYNC_S": "2", "NODUS_FUNDING": "on"}),
                in_process(SweepsService, nc, {"NODUS_RESYNC_S": "2"}),
            ):
                plain, windowed = _sweep_spec(None), _sweep_spec("5m")
                before_plain = await _estimate(nc, "cold", plain)
                before_warm = await _estimate(nc, "warm", windowed)
                cold = await _run_sweep(nc, "cold", plain)
                paid_cold = await eventually(lambda: _paid(nc, "cold"), deadline_s=60)
                warm = await _run_sweep(nc, "warm", windowed)

                # The warm Sweep's nodes stay kept for its project: a Job of another project waits, one of
                # the same project takes one at once and starts warm.
                other = await _create_job(nc, "cold", "late")
                mine = await _create_job(nc, "warm", "late")
                reused = await eventually(
                    lambda: _started(nc, mine), deadline_s=30, message="the warm project's Job never started"
                )
                # ``other`` was in line before ``mine`` and found no node: both are kept for ``warm``.
                with pytest.raises(AssertionError):
                    await _started(nc, other)

                # Done: the user deletes the warm cells and Job; their windows end, billing captures them.
                await ObjectStore(nc, "sweeps", Sweep).delete("warm", "grid")
                jobs = ObjectStore(nc, "jobs", Job)
                for job in (await jobs.list("warm")).items:  # as the gateway's cascade does
                    with contextlib.suppress(NotFound):  # or the sweep controller, first
                        await jobs.delete("warm", job.metadata.name or "")
                await eventually(lambda: _started(nc, other), deadline_s=30, message="nodes never came free")
                paid_warm = await eventually(lambda: _paid(nc, "warm"), deadline_s=60)
                warm_book = await Books(nc).read("warm")
                warm_runs = await Archive(nc).runs("warm", warm_book)  # filed ones too (issue #23)
        finally:
            await fleet.stop()
            await nc.close()

    # At most two cold starts: every other cell reused a node its project kept warm.
    assert len(cold) == CELLS and len(warm) == CELLS
    warm_cells = [a for a in warm if a.spec.warm_from]
    cold_cells = [a for a in warm if not a.spec.warm_from]
    assert len(cold_cells) <= 2 and len(warm_cells) >= CELLS - 2
    assert all(a.status.placement and a.status.placement.warm_reuse for a in warm_cells)
    assert not any(a.spec.warm_from for a in cold), "a Sweep without a window reused nothing"
    # The Boot segment is the warm one: container start only (the node's clock says so).
    assert all(_boot_ms(a) < 1000 for a in warm_cells), [_boot_ms(a) for a in warm_cells]
    assert all(_boot_ms(a) >= COLD_BOOT_S * 1000 for a in cold_cells + cold)
    assert reused.spec.warm_from and reused.status.placement and reused.status.placement.warm_reuse

    # The window is paid by the Job that kept the node, as Teardown.
    teardown = sum(h.usage.segments.get("Teardown", 0) for h in warm_runs.values() if h.usage)
    assert teardown > 0
    # Cheaper with the window, as the estimate said before anything ran.
    assert paid_warm < paid_cold, (micros_to_usd(paid_warm), micros_to_usd(paid_cold))
    assert before_warm.placement_preview is not None and before_warm.placement_preview.warm_reuse
    assert before_plain.placement_preview is not None and not before_plain.placement_preview.warm_reuse
    assert before_warm.cost_usd is not None and before_plain.cost_usd is not None
    assert usd_to_micros(before_warm.cost_usd.p50 or "0") < usd_to_micros(before_plain.cost_usd.p50 or "0")
    note = next(w for w in before_warm.warnings if w.code == "WarmWindow")
    assert f"{CELLS - 2} of {CELLS} starts" in (note.message or "")
    print(
        f"\nwarm capacity: without a window {micros_to_usd(paid_cold)} USD, with scaledownWindow 5m "
        f"{micros_to_usd(paid_warm)} USD ({len(cold_cells)} cold starts); estimate p50 "
        f"{before_plain.cost_usd.p50} vs {before_warm.cost_usd.p50} USD"
    )


async def _create_job(nc: NATS, project: str, name: str) -> Job:
    job = Job(
        metadata=ObjectMeta(name=name, namespace=project, generation=1), spec=_sweep_spec(None).template.spec
    )
    return await ObjectStore(nc, "jobs", Job).create(default_job(job))


async def _started(nc: NATS, job: Job) -> Attempt:
    attempts = (await ObjectStore(nc, "attempts", Attempt).list(job.metadata.namespace)).items
    mine = [a for a in attempts if a.spec.job == job.metadata.name]
    assert mine, "no Attempt yet"
    return mine[0]
