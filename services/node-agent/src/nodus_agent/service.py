"""The node agent process: registers its Node, heartbeats, and runs the attempts assigned to it.

Start order matters: the outbox is opened (reports an earlier agent left are sent first), the Node is
registered (so the scheduler can see it), then attempts an earlier agent left behind are settled
(re-adopted containers, Lost processes, unsent finishes), and only then does the consumer take new
assignments, so a redelivered StartAttempt always meets a record that tells the truth. Stop runs the
other way round: no new work, running programs stopped and reported, the outbox drained for a moment,
then the Node says NotReady.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

from nodus_agent import retaining
from nodus_agent.gpuhealth import GPUHealth, runner_stopper
from nodus_agent.granting import Grants
from nodus_agent.inputcontext import InputSettings
from nodus_agent.inventory import Inventory, resolve
from nodus_agent.outbox import Outbox, outbox_dir
from nodus_agent.preparing import Toolkit
from nodus_agent.registering import Registration
from nodus_agent.reporting import Reporter
from nodus_agent.running import Runner
from nodus_agent.runtimes import ProcessRuntime, Runtime
from nodus_agent.settings import AgentSettings
from nodus_agent.volumecache import CACHE_DIR, VolumeCache
from nodus_agent.volumecommit import Committer
from nodus_kit.leasing import Lease, run_as_leader
from nodus_kit.messaging import Consumer
from nodus_kit.servicing import Check, Service, Settings
from nodus_kit.storing import ObjectStore
from nodus_schema.messages import Assignment
from nodus_schema.nodes import Node

log = logging.getLogger(__name__)

ASSIGNMENTS = "NODUS_ASSIGNMENTS"
OUTBOX_DRAIN_S = 5.0


def assign_subject(node: str) -> str:
    return f"nodus.assign.{node}"


class AgentService(Service):
    name = "nodus-agent"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.agent = AgentSettings.from_env(settings.env)
        # Stopping runs every program's SIGTERM-to-SIGKILL grace, then drains the outbox.
        self.stop_timeout_s = self.agent.stop_grace_s + OUTBOX_DRAIN_S + 5
        self.registration: Registration | None = None
        self.runner: Runner | None = None
        self.consumer: Consumer[Assignment] | None = None
        self.outbox: Outbox | None = None
        self.health: GPUHealth | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._retention: asyncio.Task[None] | None = None
        self._exits = contextlib.AsyncExitStack()

    async def start(self) -> None:
        self.agent, inventory = await asyncio.to_thread(resolve, self.agent)
        self.outbox = (await Outbox.open(outbox_dir(self.agent.workdir))).start(self.bus)
        # The agent's one store is its own Node, read with key-scoped direct gets: its credential may
        # read only that key (ADR-0026), and a stale read only makes its compare-and-set retry. Jobs,
        # Secrets and Connections it never reads: it asks the gateway (granting, nodus_schema.noding).
        nodes = ObjectStore(self.bus, "nodes", Node, direct_reads=True)
        self.registration = Registration(nodes, self.agent, inventory)
        await self.registration.register()
        self._heartbeat = asyncio.create_task(self.registration.heartbeat(), name="heartbeat")
        log.info(
            "node registered",
            extra={
                "node": self.agent.node,
                "offering": self.agent.offering,
                "gpus": len(inventory.gpus),
                "fakeGpus": inventory.fake,
                "runtime": self.agent.runtime,
                "workdir": str(self.agent.workdir),
            },
        )
        js = self.bus.jetstream()
        toolkit = await self._toolkit()
        runtime = await self._runtime(inventory, toolkit)
        self.runner = Runner(self.agent, Reporter(js, self.agent.node, self.outbox), runtime, toolkit)
        await self.runner.recover()
        if toolkit.s3 is not None and toolkit.store is not None:
            self._retention = asyncio.create_task(self._retain(toolkit), name="checkpoint-retention")
        health = GPUHealth(self.agent, self.registration, runner_stopper(self.runner))
        self.runner.drained = lambda: health.faults[-1].message if health.faults else None
        self.health = health
        await health.start()
        self.consumer = await Consumer(
            js,
            stream=ASSIGNMENTS,
            durable=f"agent-{self.agent.node}",
            subject=assign_subject(self.agent.node),
            typ=Assignment,  # type: ignore[arg-type]  # a union is a valid msgspec type, not a class
            handler=self.runner.handle,
        ).start()

    async def _retain(self, toolkit: Toolkit) -> None:
        """retainAfterFinish, by one agent of the fleet at a time (retaining.py says why)."""
        assert toolkit.s3 is not None and toolkit.store is not None
        client, bucket = toolkit.s3, toolkit.store.bucket
        ask = retaining.Asker(self.bus, self.agent.node)
        lease = Lease(self.bus, retaining.LEASE, holder=self.agent.node, ttl_s=30)
        # A standby looks for the lease once a pass, not every quarter of its TTL: the work runs every few
        # minutes, and a fleet of N agents then asks N / EVERY_S times a second.
        work = functools.partial(retaining.run, client, bucket, ask)
        await run_as_leader(lease, work, stop=self.stopping, poll_s=retaining.EVERY_S)

    async def _toolkit(self) -> Toolkit:
        store = await asyncio.to_thread(self.agent.s3_settings)  # reads the credentials file once
        client: Any | None = None
        if store is not None:
            from nodus_agent import s3  # aiobotocore is slow to import: only where a store is set

            client = await self._exits.enter_async_context(s3.client(store))
        # One cache per process: it alone counts the disk budget, and it finishes what a killed agent left.
        cache = await asyncio.to_thread(VolumeCache, self.agent.workdir / CACHE_DIR, self.agent.cache_bytes)
        return Toolkit(
            nc=self.bus,
            grants=Grants(self.bus, self.agent.node),
            store=store,
            s3=client,
            inputs=InputSettings(
                max_bytes=self.agent.max_input_bytes,
                ca_bundle=self.agent.ca_bundle,
                parallel=self.agent.input_parallel,
            ),
            interruptible=self.agent.interruptible,
            cache=cache,
            committer=Committer(self.bus, self.agent.node),
        )

    async def _runtime(self, inventory: Inventory, toolkit: Toolkit) -> Runtime:
        if self.agent.runtime != "docker":
            gpus = None if inventory.fake else tuple(g.uuid for g in inventory.gpus)
            return ProcessRuntime(self.agent.cwd, gpus)
        from nodus_agent.containers import ContainerRuntime
        from nodus_agent.dockerapi import DockerAPI
        from nodus_agent.dockerruntime import DockerRuntime

        api = DockerAPI(self.agent.docker_socket)
        self._exits.push_async_callback(api.close)
        await api.version()  # fails the start with what to do when no engine answers
        return DockerRuntime(
            ContainerRuntime(api, self.agent.node, self.agent.docker_ulimits),
            gpu_ids=[] if inventory.fake else [g.uuid for g in inventory.gpus],
            gpu_mode=self.agent.docker_gpu_mode,  # type: ignore[arg-type]  # checked by configuring
            grants=toolkit.grants,
        )

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.health is not None:
            await self.health.stop()
        if self.runner is not None:
            await self.runner.shutdown()
        if self.outbox is not None:
            await self.outbox.close(drain_s=OUTBOX_DRAIN_S)
        if self._retention is not None:
            self._retention.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        if self.registration is not None:
            try:
                await self.registration.mark_not_ready()
            except Exception as e:  # the bus may be gone; the stale heartbeat tells the same story
                log.warning("could not mark the node NotReady: %s", e)
        await self._exits.aclose()

    def checks(self) -> dict[str, Check]:
        async def registered() -> bool:
            return self.registration is not None and self.registration.registered

        return {**super().checks(), "registered": registered}
