"""The Pipelines' rig (issue #22): a nats-server of its own, the real scheduler and billing in this event
loop, the sweep controller in it too (or as a subprocess, for the crash test), and a simulated fleet
(``nodus_agent.simulating``, docs/simulation.md) whose runs last what each stage's ``NODUS_SIM_*`` env
says. Nothing is executed and no output is uploaded: what flows between stages is checked on the
children's specs (the e2e test, tests/e2e/test_pipelines.py, runs real programs and outputs).

A watch on the ``jobs`` and ``sweeps`` buckets records every uid each name was seen with
(:class:`Creations`): a child or cell created twice shows a second uid (or a DELETED event).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_agent.simulating import FleetSettings, SimulatedFleet
from nodus_billing.service import BillingService
from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.errors import NotFound
from nodus_kit.storing import ObjectStore
from nodus_scheduler.service import SchedulerService
from nodus_schema.expanding import PARAM_PREFIX
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import ObjectMeta
from nodus_schema.pipelines import Pipeline, PipelineSpec
from nodus_schema.sweeps import Sweep
from nodus_sweeps.service import SweepsService
from nodus_testing.hosting import in_process
from nodus_testing.natsserver import NatsServer
from nodus_testing.waiting import eventually

NS = "flows"
L4 = "L4:1"
H100 = "H100:1"


def sim(seconds: float = 0.3, sigma: str = "0", **more: str) -> list[dict[str, str]]:
    """The simulated fleet's knobs for a stage's runs: ``seconds`` long (``sigma``: lognormal spread)."""
    env = {"NODUS_SIM_SECONDS": str(seconds), "NODUS_SIM_SIGMA": sigma, **more}
    return [{"name": k, "value": v} for k, v in env.items()]


def job(
    seconds: float = 0.3, *, sigma: str = "0", env: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A Job stage's spec: a simulated run of ``seconds`` on one L4, with ``env`` (knobs, params) added."""
    return {
        "image": "busybox",
        "command": ["true"],
        "resources": {"gpu": L4},
        "env": sim(seconds, sigma, **(env or {})),
        **spec,
    }


def flow(
    seconds: float = 0.3, max_parallel: int = 6, last_seconds: float | None = None
) -> list[dict[str, Any]]:
    """The issue's four stages: prepare (a Job that outputs ``data``) -> grid (a Sweep of 6 cells over GPU
    and LR that reads ``data``, runs of sampled lengths and throughputs) -> train (the grid's best cell by
    Throughput; its template's own ``NODUS_PARAM_LR`` is replaced; outputs ``model``) -> evaluate (reads
    ``model``). Each run lasts ``seconds`` (evaluate's ``last_seconds``, if given); the Sweep runs
    ``max_parallel`` cells at once."""
    data_in = [{"name": "data", "fromStage": {"stage": "prepare", "output": "data"}}]
    model_in = [{"name": "model", "fromStage": {"stage": "train", "output": "model"}}]
    return [
        {
            "name": "prepare",
            "template": {"job": job(seconds, outputs=[{"name": "data", "path": "/nodus/outputs/data"}])},
        },
        {
            "name": "grid",
            "dependsOn": ["prepare"],
            "template": {
                "sweep": {
                    "maxParallel": max_parallel,
                    "matrix": {"gpu": [L4, H100], "params": {"LR": ["1", "2", "3"]}},
                    "template": {"spec": job(seconds, sigma="0.5", inputs=data_in)},
                }
            },
        },
        {
            "name": "train",
            "dependsOn": ["grid"],
            "fromBest": {"stage": "grid", "by": "Throughput"},
            "template": {
                "job": job(
                    seconds,
                    env={f"{PARAM_PREFIX}LR": "0"},
                    outputs=[{"name": "model", "path": "/nodus/outputs/model"}],
                )
            },
        },
        {
            "name": "evaluate",
            "dependsOn": ["train"],
            "template": {"job": job(last_seconds or seconds, inputs=model_in)},
        },
    ]


@dataclass
class Creations:
    """Every uid each Job, Sweep and Pipeline name was seen with (``<kind>/<name>``), the names seen
    deleted, and how many changes were seen in all."""

    uids: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    deleted: list[str] = field(default_factory=list)
    events: int = 0
    controller_writes: int = 0
    """Changes only the sweep controller makes: a Job created, any write of a Sweep or a Pipeline (their
    status is the controller's; the test writes a Pipeline only to create it or change its state)."""

    def once(self) -> dict[str, list[str]]:
        """The names seen with more than one uid (created more than once)."""
        return {name: uids for name, uids in self.uids.items() if len(uids) != 1}

    def created(self, kind: str) -> list[str]:
        """The names of ``kind`` seen, sorted."""
        return sorted(n.partition("/")[2] for n in self.uids if n.startswith(f"{kind}/"))

    async def follow(self, store: ObjectStore[Any], kind: str) -> None:
        async with store.watch(NS) as w:
            async for event in w:
                meta = event.object.metadata
                name = f"{kind}/{meta.name}"
                if meta.uid not in self.uids[name]:
                    self.uids[name].append(meta.uid or "")
                    self.controller_writes += kind == "Job"
                self.controller_writes += kind != "Job"
                if event.type == "DELETED":
                    self.deleted.append(name)
                self.events += 1


@dataclass
class Rig:
    nc: NATS
    server: NatsServer
    fleet: SimulatedFleet
    creations: Creations

    @property
    def pipelines(self) -> ObjectStore[Pipeline]:
        return ObjectStore(self.nc, "pipelines", Pipeline)

    @property
    def jobs(self) -> ObjectStore[Job]:
        return ObjectStore(self.nc, "jobs", Job)

    @property
    def sweeps(self) -> ObjectStore[Sweep]:
        return ObjectStore(self.nc, "sweeps", Sweep)

    async def create(self, name: str, stages: list[dict[str, Any]], **spec: Any) -> Pipeline:
        """A Pipeline as the gateway stores it (generation 1, no status)."""
        body = msgspec.convert({"stages": stages, **spec}, PipelineSpec)
        pipeline = Pipeline(metadata=ObjectMeta(name=name, namespace=NS, generation=1), spec=body)
        return await self.pipelines.create(pipeline)

    async def pipeline(self, name: str) -> Pipeline:
        return await self.pipelines.get(NS, name)

    async def job(self, name: str) -> Job | None:
        try:
            return await self.jobs.get(NS, name)
        except NotFound:
            return None

    async def sweep(self, name: str) -> Sweep | None:
        try:
            return await self.sweeps.get(NS, name)
        except NotFound:
            return None

    async def set_state(self, name: str, state: str) -> None:
        """spec.state as the gateway writes it: a spec change, a new generation."""

        def change(p: Pipeline) -> Pipeline:
            meta = msgspec.structs.replace(p.metadata, generation=(p.metadata.generation or 1) + 1)
            return msgspec.structs.replace(
                p, metadata=meta, spec=msgspec.structs.replace(p.spec, state=state)
            )

        await self.pipelines.mutate(NS, name, change)

    async def ended(self, name: str, deadline_s: float = 60) -> Pipeline:
        """The Pipeline once it ended and its cost is final."""

        async def done() -> Pipeline:
            p = await self.pipeline(name)
            st = p.status
            assert st.phase in TERMINAL_PHASES, (st.phase, st.reason, st.message)
            assert st.cost is not None and st.cost.final, "the children's costs are not final yet"
            return p

        return await eventually(done, deadline_s=deadline_s, interval_s=0.1, message=f"{name} never ended")


@contextlib.asynccontextmanager
async def rig(
    tmp_path: Path,
    *,
    sweeps: bool = True,
    nodes: int = 8,
    offerings: tuple[str, ...] = ("l4-x1-us", "h100-sxm-80g-x1-us"),
) -> AsyncIterator[Rig]:
    """The rig; ``sweeps``: run the sweep controller in this process (False: the test runs it)."""
    with NatsServer() as server:
        nc = await connect(server.url, "pipelines", nkey_seed=server.harness_seed)
        await declaring.ensure(nc.jetstream())
        creations = Creations()
        watching = [
            asyncio.create_task(creations.follow(ObjectStore(nc, "jobs", Job), "Job")),
            asyncio.create_task(creations.follow(ObjectStore(nc, "sweeps", Sweep), "Sweep")),
            asyncio.create_task(creations.follow(ObjectStore(nc, "pipelines", Pipeline), "Pipeline")),
        ]
        settings = FleetSettings(
            fleet="p", nodes=nodes, offerings=offerings, progress_s=0, seed=7, workdir=tmp_path / "fleet"
        )
        fleet = await SimulatedFleet(nc, settings).start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                billing = {"NODUS_STARTING_CREDITS_USD": "100", "NODUS_METER_TICK_S": "1"}
                await stack.enter_async_context(in_process(BillingService, nc, billing))
                scheduler = {"NODUS_RESYNC_S": "2", "NODUS_FUNDING": "on"}
                await stack.enter_async_context(in_process(SchedulerService, nc, scheduler))
                if sweeps:
                    await stack.enter_async_context(in_process(SweepsService, nc, {"NODUS_RESYNC_S": "2"}))
                yield Rig(nc, server, fleet, creations)
        finally:
            for task in watching:
                task.cancel()
            await asyncio.gather(*watching, return_exceptions=True)
            await fleet.stop()
            await nc.close()
