"""The scheduler's rig: its own nats-server, the real scheduler service, and a scripted fleet.

The fleet stands in for node agents at the bus level, exactly as agents talk: it registers Node records
that heartbeat, takes ``nodus.assign.<node>`` messages from the assignments work queue, and publishes
AttemptStarted / AttemptFinished reports. What each run does is the test's script (succeed, fail with an
exit code, hang until stopped), so every lifecycle rule can be driven on purpose. It also checks the one
thing no scheduler may ever do: run two Attempts of the same index at the same time (for a gang: members
of two gang attempts of one index at once; the members of one gang attempt run together by design).

For gangs (ADR-0016) it can also hold a run before it starts (``hold``: no AttemptStarted until it is
stopped, as a member stuck pulling its image), and end a run as Lost (:meth:`Fleet.lose`, as an agent
that restarted under it reports).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig

from nodus_billing.service import BillingService
from nodus_kit import declaring, messaging
from nodus_kit.connecting import connect
from nodus_kit.servicing import Settings
from nodus_kit.storing import ObjectStore
from nodus_scheduler.service import SchedulerService
from nodus_schema.attempts import Attempt
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.messages import AttemptFinished, AttemptStarted, StartAttempt, StopAttempt
from nodus_schema.meta import ObjectMeta, now_rfc3339
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_testing.natsserver import NatsServer

OFFERING = "l4-x1-us"
REGION = "us"

# A run's script: what the fleet does with StartAttempt (seconds to run, exit code; None = until stopped).
Outcome = tuple[float | None, int]
Script = Callable[[StartAttempt], Outcome]


def succeed(_: StartAttempt) -> Outcome:
    return (0.0, 0)


def never(_: StartAttempt) -> bool:
    return False


@dataclass
class Fleet:
    nc: NATS
    script: Script = succeed
    nodes: list[str] = field(default_factory=list)
    started: list[StartAttempt] = field(default_factory=list)
    running: dict[str, StartAttempt] = field(default_factory=dict)  # attempt name -> its start
    overlaps: list[str] = field(default_factory=list)
    silent: set[str] = field(default_factory=set)  # nodes that stopped heartbeating
    max_running: int = 0
    hold: Callable[[StartAttempt], bool] = never  # runs that never report started (until stopped)

    def __post_init__(self) -> None:
        self.js = self.nc.jetstream()
        self.store = ObjectStore(self.nc, "nodes", Node)
        self._tasks: list[asyncio.Task[Any]] = []
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._seen: set[str] = set()
        self._stopped = False

    async def add_nodes(
        self, n: int, prefix: str = "n", offering: str = OFFERING, region: str = REGION
    ) -> list[str]:
        names = [f"{prefix}{len(self.nodes) + i}" for i in range(n)]
        for name in names:
            await self.store.create(
                Node(
                    metadata=ObjectMeta(name=name),
                    spec=NodeSpec(offering=offering, region_class=region),
                    status=NodeStatus(phase="Ready", last_heartbeat_time=now_rfc3339()),
                )
            )
        self.nodes += names
        return names

    async def start(self) -> None:
        await self.js.add_consumer(
            "NODUS_ASSIGNMENTS", ConsumerConfig(durable_name="fleet", filter_subject="nodus.assign.>")
        )
        self.sub = await self.js.pull_subscribe_bind("fleet", stream="NODUS_ASSIGNMENTS")
        self._tasks = [asyncio.create_task(self._take()), asyncio.create_task(self._beat())]

    async def stop(self) -> None:
        # The loops also end on this flag: Python 3.11's wait_for (inside nats-py's fetch) can swallow a
        # cancellation that lands as its timer fires, and a taking loop left running on a closed connection
        # spins without yielding, stalling every later test on the session's one event loop.
        self._stopped = True
        tasks = [*self._tasks, *self._runs.values()]
        for t in tasks:
            t.cancel()
        if not tasks:
            return
        done, _ = await asyncio.wait(tasks, timeout=5.0)
        for t in done:
            if not t.cancelled():
                t.exception()  # retrieved, so a run's failure is not reported again at exit

    async def _beat(self) -> None:
        while not self._stopped:
            for name in self.nodes:
                if name in self.silent:
                    continue

                def beat(node: Node) -> Node:
                    phase = "Ready" if node.status.phase == "NotReady" else node.status.phase
                    st = msgspec.structs.replace(node.status, phase=phase, last_heartbeat_time=now_rfc3339())
                    return msgspec.structs.replace(node, status=st)

                with contextlib.suppress(Exception):
                    await self.store.mutate(None, name, beat)
            await asyncio.sleep(1.0)  # a heartbeat period (not synchronisation)

    async def _take(self) -> None:
        decoder = msgspec.json.Decoder(StartAttempt | StopAttempt)
        while not self._stopped and not self.nc.is_closed:
            try:
                msgs = await self.sub.fetch(64, timeout=0.2)
            except Exception:
                continue
            for msg in msgs:
                node = msg.subject.rsplit(".", 1)[1]
                if node not in self.silent:
                    self._handle(node, decoder.decode(msg.data))
                await msg.ack()

    def _handle(self, node: str, message: StartAttempt | StopAttempt) -> None:
        if isinstance(message, StopAttempt):
            run = self._runs.get(message.attempt)
            if run is not None and message.attempt in self.running:
                run.cancel()
                self._runs[message.attempt] = asyncio.create_task(
                    self._finish(node, self.running[message.attempt], None, "Stopped")
                )
            return
        if message.attempt in self._seen:
            return  # a redelivery: an agent is idempotent on the attempt name
        self._seen.add(message.attempt)
        same = [
            a
            for a in self.running.values()
            if a.job == message.job
            and a.index == message.index
            and (message.gang is None or a.gang != message.gang)  # a gang's own members run together
        ]
        if same and same[0].namespace == message.namespace:
            self.overlaps.append(f"{message.attempt} started while {same[0].attempt} runs")
        self.started.append(message)
        self.running[message.attempt] = message
        self.max_running = max(self.max_running, len(self.running))
        self._runs[message.attempt] = asyncio.create_task(self._run(node, message))

    async def _run(self, node: str, start: StartAttempt) -> None:
        if self.hold(start):
            await asyncio.Event().wait()  # never starts (StopAttempt cancels this task and reports Stopped)
        await self._report(
            node,
            start,
            AttemptStarted(namespace=start.namespace, attempt=start.attempt, node=node, time=now_rfc3339()),
        )
        seconds, code = self.script(start)
        if seconds is None:
            await asyncio.Event().wait()  # runs until stopped (StopAttempt cancels this task)
        await asyncio.sleep(seconds or 0)  # the run's own duration, as scripted
        await self._finish(node, start, code, "Completed" if code == 0 else "Error")

    async def _finish(self, node: str, start: StartAttempt, code: int | None, reason: str) -> None:
        self.running.pop(start.attempt, None)
        await self._report(
            node,
            start,
            AttemptFinished(
                namespace=start.namespace,
                attempt=start.attempt,
                node=node,
                time=now_rfc3339(),
                exit_code=code,
                wall_millis=1,
                reason=reason,
                units_per_second="10" if code == 0 else None,
            ),
        )

    async def _report(self, node: str, start: StartAttempt, report: Any) -> None:
        await messaging.publish(
            self.js,
            f"nodus.report.{node}.{start.namespace}.{start.attempt}",
            report,
            msg_id=f"{start.attempt}:{type(report).__name__}",
        )

    def lose(self, attempt: str) -> None:
        """End a running run as Lost, as an agent that restarted under it reports (infrastructure)."""
        start = self.running.get(attempt)
        task = self._runs.get(attempt)
        if start is None or task is None:
            return
        task.cancel()
        self._runs[attempt] = asyncio.create_task(self._finish(start.node, start, None, "Lost"))

    def go_silent(self, node: str) -> None:
        """The node vanishes: no more heartbeats, and what it ran never reports again."""
        self.silent.add(node)
        for name, start in list(self.running.items()):
            if start.node == node:
                self.running.pop(name, None)
                task = self._runs.get(name)
                if task is not None:
                    task.cancel()


@dataclass
class Rig:
    server: NatsServer
    nc: NATS
    fleet: Fleet
    scheduler: SchedulerService | None = None
    billing: BillingService | None = None
    funding: bool = False
    env: dict[str, str] = field(default_factory=dict)
    """More of the scheduler's settings (``NODUS_NODE_UNREACHABLE_GRACE_S``, ...)."""

    @property
    def jobs(self) -> ObjectStore[Job]:
        return ObjectStore(self.nc, "jobs", Job)

    @property
    def attempts(self) -> ObjectStore[Attempt]:
        return ObjectStore(self.nc, "attempts", Attempt)

    async def start_scheduler(self) -> SchedulerService:
        settings = Settings.from_env(
            "nodus-scheduler",
            {
                "NODUS_NATS_URL": self.server.url,
                "NODUS_NATS_NKEY_SEED": str(self.server.harness_seed),
                "NODUS_REPLICA": "test",
                "NODUS_RESYNC_S": "2",
                # Billing is part of the rig only when asked for (test_funding.py): else no holds.
                "NODUS_FUNDING": "on" if self.funding else "off",
                **self.env,
            },
        )
        svc = SchedulerService(settings)
        svc.nc = self.nc
        await svc.start()
        self.scheduler = svc
        return svc

    async def start_billing(self, **env: str) -> BillingService:
        """The real billing service in this process; ``env`` sets its terms (``NODUS_METER_TICK_S``, ...)."""
        settings = Settings.from_env(
            "nodus-billing",
            {
                "NODUS_NATS_URL": self.server.url,
                "NODUS_NATS_NKEY_SEED": str(self.server.harness_seed),
                "NODUS_REPLICA": "test",
                "NODUS_RESYNC_S": "1",
                **env,
            },
        )
        svc = BillingService(settings)
        svc.nc = self.nc
        await svc.start()
        self.billing = svc
        return svc

    async def stop_billing(self) -> None:
        if self.billing is not None:
            self.billing.stopping.set()
            await self.billing.stop()
            self.billing = None

    async def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stopping.set()
            await self.scheduler.stop()
            self.scheduler = None

    async def submit(self, name: str, namespace: str = "t", **spec: Any) -> Job:
        body = {"image": "busybox", "command": ["true"], "resources": {"gpu": "L4:1"}, **spec}
        job = Job(metadata=ObjectMeta(name=name, namespace=namespace), spec=msgspec.convert(body, JobSpec))
        return await self.jobs.create(default_job(job))

    async def job(self, name: str, namespace: str = "t") -> Job:
        return await self.jobs.get(namespace, name)

    async def set_spec(self, name: str, namespace: str = "t", **changes: Any) -> Job:
        def change(job: Job) -> Job:
            spec = msgspec.structs.replace(job.spec, **changes)
            # A spec change is a new generation, as the gateway writes it (billing reads caps by it).
            meta = msgspec.structs.replace(job.metadata, generation=(job.metadata.generation or 1) + 1)
            return msgspec.structs.replace(job, spec=spec, metadata=meta)

        return await self.jobs.mutate(namespace, name, change)

    async def attempts_of(self, name: str, namespace: str = "t") -> list[Attempt]:
        return [a for a in (await self.attempts.list(namespace)).items if a.spec.job == name]


@contextlib.asynccontextmanager
async def _rig(
    script: Script = succeed,
    nodes: int = 4,
    *,
    scheduler: bool = True,
    funding: bool = False,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Rig]:
    """A fresh nats-server (cluster-scoped Nodes must not leak between tests), a fleet, a scheduler with
    the settings ``env`` adds."""
    with NatsServer() as server:
        nc = await connect(server.url, "rig", nkey_seed=server.harness_seed)
        await declaring.ensure(nc.jetstream())
        fleet = Fleet(nc, script)
        await fleet.add_nodes(nodes)
        await fleet.start()
        r = Rig(server, nc, fleet, funding=funding, env=dict(env or {}))
        if scheduler:
            await r.start_scheduler()
        try:
            yield r
        finally:
            await r.stop_scheduler()
            await r.stop_billing()
            await fleet.stop()
            await nc.close()


@pytest.fixture
def make_rig() -> Callable[..., contextlib.AbstractAsyncContextManager[Rig]]:
    """``async with make_rig(script, nodes=4, env={...}) as rig:`` — see :class:`Rig` and :class:`Fleet`."""
    return _rig
