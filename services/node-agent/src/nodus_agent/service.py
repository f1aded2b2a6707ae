"""The node agent process: registers its Node, heartbeats, and runs the attempts assigned to it.

Start order matters: the Node is registered (so the scheduler can see it), then attempts an earlier
agent left behind are settled, and only then does the consumer take new assignments, so a redelivered
StartAttempt always meets a record that tells the truth. Stop runs the other way round: no new work,
running programs stopped and reported, then the Node says NotReady.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nodus_agent.inventory import discover
from nodus_agent.registering import Registration
from nodus_agent.reporting import Reporter
from nodus_agent.running import Runner
from nodus_agent.settings import AgentSettings
from nodus_kit.messaging import Consumer
from nodus_kit.servicing import Check, Service, Settings
from nodus_kit.storing import ObjectStore
from nodus_schema.messages import Assignment
from nodus_schema.nodes import Node

log = logging.getLogger(__name__)

ASSIGNMENTS = "NODUS_ASSIGNMENTS"


def assign_subject(node: str) -> str:
    return f"nodus.assign.{node}"


class AgentService(Service):
    name = "nodus-agent"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.agent = AgentSettings.from_env(settings.env)
        self.registration: Registration | None = None
        self.runner: Runner | None = None
        self.consumer: Consumer[Assignment] | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        inventory = await asyncio.to_thread(discover, self.agent)
        self.registration = Registration(ObjectStore(self.bus, "nodes", Node), self.agent, inventory)
        await self.registration.register()
        self._heartbeat = asyncio.create_task(self.registration.heartbeat(), name="heartbeat")
        log.info(
            "node registered",
            extra={
                "node": self.agent.node,
                "offering": self.agent.offering,
                "gpus": len(inventory.gpus),
                "fakeGpus": inventory.fake,
                "workdir": str(self.agent.workdir),
            },
        )
        js = self.bus.jetstream()
        self.runner = Runner(self.agent, Reporter(js, self.agent.node))
        await self.runner.recover()
        self.consumer = await Consumer(
            js,
            stream=ASSIGNMENTS,
            durable=f"agent-{self.agent.node}",
            subject=assign_subject(self.agent.node),
            typ=Assignment,  # type: ignore[arg-type]  # a union is a valid msgspec type, not a class
            handler=self.runner.handle,
        ).start()

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.runner is not None:
            await self.runner.shutdown()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        if self.registration is not None:
            try:
                await self.registration.mark_not_ready()
            except Exception as e:  # the bus may be gone; the stale heartbeat tells the same story
                log.warning("could not mark the node NotReady: %s", e)

    def checks(self) -> dict[str, Check]:
        async def registered() -> bool:
            return self.registration is not None and self.registration.registered

        return {**super().checks(), "registered": registered}
