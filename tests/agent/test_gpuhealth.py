"""GPU health (ADR-0022): which NVML events and states drain a node, the watch thread, and the drain itself
in the real ``nodes`` bucket of the session's nats-server.

NVML is a stand-in of pynvml's shape (no driver exists here) with pynvml's own constants and errors. Its
event wait blocks on a real queue with NVML's timeout, so the watch thread runs as it would on a host;
tests feed events into the queue and await the Node record, never a sleep.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pynvml
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_agent.attemptdir import FINISHED, AttemptDir
from nodus_agent.configuring import APPLICATION_XIDS
from nodus_agent.gpuhealth import (
    DOUBLE_BIT_ECC,
    GPU_LOST,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    XID_CRITICAL,
    Fault,
    GPUHealth,
    Monitor,
    classify_event,
    inspect_device,
    runner_stopper,
)
from nodus_agent.inventory import Inventory
from nodus_agent.registering import GPU_HEALTHY, Registration
from nodus_agent.reporting import Reporter
from nodus_agent.settings import AgentSettings
from nodus_kit.storing import ObjectStore
from nodus_schema.messages import StartAttempt
from nodus_schema.meta import find_condition
from nodus_schema.nodes import GPUDevice, Node
from nodus_testing.waiting import eventually

XID = pynvml.nvmlEventTypeXidCriticalError
DBE = pynvml.nvmlEventTypeDoubleBitEccError
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


@dataclass
class Gpu:
    remap: tuple[int, int, int, int] | int = (0, 0, 0, 0)
    """(corrected, uncorrected, pending, failure), or an NVML error code to raise."""
    retired_pending: int = pynvml.NVML_FEATURE_DISABLED
    """NVML_FEATURE_ENABLED/DISABLED, or an NVML error code (>= 2) to raise."""
    events: int = XID | DBE
    """Event types it supports."""


@dataclass
class FakeNVML:
    """pynvml's shape for the health watch; everything not defined here is pynvml's."""

    gpus: list[Gpu]
    events: queue.Queue[Any] = field(default_factory=queue.Queue)
    registered: dict[int, int] = field(default_factory=dict)
    event_sets: bool = True
    shutdowns: int = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return SimpleNamespace(index=index)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return int(handle.index)

    def nvmlEventSetCreate(self) -> object:
        if not self.event_sets:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return object()

    def nvmlEventSetFree(self, _: object) -> None:
        pass

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self.gpus[handle.index].events

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, _: object) -> None:
        self.registered[handle.index] = mask

    def nvmlEventSetWait_v2(self, _: object, timeout_ms: int) -> Any:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        remap = self.gpus[handle.index].remap
        if isinstance(remap, int):
            raise pynvml.NVMLError(remap)
        return remap

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        pending = self.gpus[handle.index].retired_pending
        if pending >= 2:
            raise pynvml.NVMLError(pending)
        return pending

    def fire(self, gpu: int, event_type: int, data: int = 0) -> None:
        self.events.put(
            SimpleNamespace(device=SimpleNamespace(index=gpu), eventType=event_type, eventData=data)
        )


# -- the decisions ---------------------------------------------------------------------------------------


def test_critical_xids_drain_and_application_xids_do_not() -> None:
    nvml = FakeNVML([Gpu()])
    fault = classify_event(nvml, XID, 79, 3, APPLICATION_XIDS)
    assert fault == Fault(XID_CRITICAL, "GPU 3: XID 79 (GPU has fallen off the bus)", 3)
    assert classify_event(nvml, XID, 13, 0, APPLICATION_XIDS) is None  # a program's bad memory access
    assert classify_event(nvml, XID, 13, 0, ()) is not None  # the operator's list is the one that counts
    assert "NVIDIA's XID catalog" in classify_event(nvml, XID, 154, 0, APPLICATION_XIDS).message  # type: ignore[union-attr]
    assert classify_event(nvml, DBE, 0, 1, APPLICATION_XIDS) == Fault(
        DOUBLE_BIT_ECC, "GPU 1: uncorrectable (double-bit) ECC memory error", 1
    )
    assert classify_event(nvml, pynvml.nvmlEventTypePState, 0, 1, APPLICATION_XIDS) is None


@pytest.mark.parametrize(
    ("gpu", "reason"),
    [
        (Gpu(), None),
        (Gpu(remap=(12, 0, 0, 0)), None),  # corrected rows already remapped: healthy
        (Gpu(remap=(0, 1, 1, 0)), ROW_REMAP_PENDING),
        (Gpu(remap=(0, 1, 0, 1)), ROW_REMAP_FAILURE),
        (Gpu(remap=NOT_SUPPORTED, retired_pending=pynvml.NVML_FEATURE_ENABLED), RETIRED_PAGES_PENDING),
        (Gpu(remap=NOT_SUPPORTED, retired_pending=NOT_SUPPORTED), None),  # a part with neither
        (Gpu(remap=pynvml.NVML_ERROR_GPU_IS_LOST), GPU_LOST),
        (Gpu(remap=NOT_SUPPORTED, retired_pending=pynvml.NVML_ERROR_GPU_IS_LOST), GPU_LOST),
        (Gpu(remap=pynvml.NVML_ERROR_NO_PERMISSION, retired_pending=NOT_SUPPORTED), None),
    ],
)
def test_polled_state_that_drains(gpu: Gpu, reason: str | None) -> None:
    nvml = FakeNVML([gpu])
    fault = inspect_device(nvml, nvml.nvmlDeviceGetHandleByIndex(0), 0)
    assert (fault.reason if fault else None) == reason
    if fault is not None:
        assert fault.gpu == 0 and fault.message.startswith("GPU 0: ")


def test_the_monitor_registers_what_each_gpu_supports_and_reports_each_fault_once() -> None:
    nvml = FakeNVML([Gpu(remap=(0, 2, 1, 0)), Gpu(events=XID), Gpu(events=0)])
    monitor = Monitor(nvml, [0, 1, 2], APPLICATION_XIDS)
    monitor.open()
    assert nvml.registered == {0: XID | DBE, 1: XID}  # GPU 2 supports no event: polled only
    assert [f.reason for f in monitor.poll()] == [ROW_REMAP_PENDING]
    assert monitor.poll() == []  # still pending: not news
    assert monitor.wait_event(1) == []  # NVML's timeout
    nvml.fire(1, XID, 48)
    assert monitor.wait_event(1000) == [Fault(XID_CRITICAL, "GPU 1: XID 48 (double-bit ECC error)", 1)]
    nvml.fire(1, XID, 48)
    assert monitor.wait_event(1000) == []
    nvml.fire(1, XID, 31)
    assert monitor.wait_event(1000) == []  # an application XID
    monitor.close()
    assert nvml.shutdowns == 1


def test_without_event_sets_the_monitor_polls_only() -> None:
    nvml = FakeNVML([Gpu()], event_sets=False)
    monitor = Monitor(nvml, [0], APPLICATION_XIDS)
    monitor.open()
    assert monitor.wait_event(1000) is None and monitor.poll() == []


# -- the drain, in the real nodes bucket ---------------------------------------------------------------------


@dataclass
class Host:
    settings: AgentSettings
    store: ObjectStore[Node]
    registration: Registration
    nvml: FakeNVML
    stopped: list[str] = field(default_factory=list)

    async def stop_work(self, message: str) -> None:
        self.stopped.append(message)

    async def node(self) -> Node:
        return await self.store.get(None, self.settings.node)


def real_inventory(node: str, n: int) -> Inventory:
    gpus = [
        GPUDevice(index=i, uuid=f"GPU-{node}-{i}", variant="H100-SXM-80G", memory="81559Mi") for i in range(n)
    ]
    return Inventory(gpus=gpus, fake=False, driver_version="550.54.15", cuda_version="12.4")


def agent_settings(unique: str, tmp_path: Path, **env: str) -> AgentSettings:
    return AgentSettings.from_env(
        {
            "NODUS_AGENT_NODE": unique,
            "NODUS_AGENT_WORKDIR": str(tmp_path),
            "NODUS_AGENT_GPU_HEALTH_POLL_S": "0.05",
            "NODUS_AGENT_STOP_GRACE_S": "2",
            **env,
        }
    )


@pytest_asyncio.fixture
async def host(nc: NATS, unique: str, tmp_path: Path) -> AsyncIterator[Host]:
    store = ObjectStore(nc, "nodes", Node)
    settings = agent_settings(unique, tmp_path)
    registration = Registration(store, settings, real_inventory(unique, 2))
    await registration.register()
    yield Host(settings, store, registration, FakeNVML([Gpu(), Gpu()]))
    await store.delete(None, unique)


async def drained(host: Host) -> Node:
    async def check() -> Node | None:
        node = await host.node()
        return node if node.status.phase == "Draining" else None

    return await eventually(check, message="the node never drained")


async def test_a_critical_xid_drains_the_node_and_stops_work(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    node = await host.node()
    healthy = find_condition(node.status.conditions, GPU_HEALTHY)
    assert node.status.phase == "Ready" and healthy is not None and healthy.status == "True"
    health = GPUHealth(host.settings, host.registration, host.stop_work, nvml=host.nvml)
    assert await health.start()
    try:
        host.nvml.fire(1, XID, 13)  # an application error first: nothing happens
        host.nvml.fire(1, XID, 79)
        with caplog.at_level(logging.ERROR, logger="nodus_agent.gpuhealth"):
            node = await drained(host)
            await eventually(lambda: host.stopped, message="running work was never stopped")
    finally:
        await health.stop()
    condition = find_condition(node.status.conditions, GPU_HEALTHY)
    assert condition is not None and (condition.status, condition.reason) == ("False", XID_CRITICAL)
    assert condition.message == "GPU 1: XID 79 (GPU has fallen off the bus)"
    assert [g.healthy for g in node.status.gpus] == [True, False]
    assert host.stopped == [
        f"GPU fault on node {host.settings.node}: GPU 1: XID 79 (GPU has fallen off the bus)"
    ]
    assert [f.reason for f in health.faults] == [XID_CRITICAL]
    assert any("GPU FAULT" in r.getMessage() for r in caplog.records)


async def test_the_drain_outlives_heartbeats_and_a_missed_beat_and_ends_with_a_restart(host: Host) -> None:
    await host.registration.drain_node(ROW_REMAP_PENDING, "GPU 0: memory rows wait to be remapped", 0)
    first = await host.node()
    since = find_condition(first.status.conditions, GPU_HEALTHY).last_transition_time  # type: ignore[union-attr]
    await host.registration.drain_node(GPU_LOST, "GPU 1: lost", 1)  # a second fault adds its GPU
    # The scheduler marks a silent node NotReady; the next beat must not make a drained node Ready.
    await host.store.mutate(
        None,
        host.settings.node,
        lambda n: msgspec.structs.replace(n, status=msgspec.structs.replace(n.status, phase="NotReady")),
    )
    assert (await host.node()).status.phase == "NotReady"
    beaten = await host.registration.beat()
    assert beaten.status.phase == "Draining"
    condition = find_condition(beaten.status.conditions, GPU_HEALTHY)
    assert condition is not None and condition.reason == ROW_REMAP_PENDING  # the first fault stays
    assert condition.last_transition_time == since
    assert [g.healthy for g in beaten.status.gpus] == [False, False]
    # The operator's un-drain: the agent restarts (a new Registration, as a new process would have).
    restarted = Registration(host.store, host.settings, host.registration.inventory)
    node = await restarted.register()
    assert node.status.phase == "Ready" and [g.healthy for g in node.status.gpus] == [True, True]
    assert find_condition(node.status.conditions, GPU_HEALTHY).status == "True"  # type: ignore[union-attr]


async def test_a_gpu_still_pending_a_reset_drains_again_at_start_and_finish_leaves_work(
    nc: NATS, unique: str, tmp_path: Path
) -> None:
    store = ObjectStore(nc, "nodes", Node)
    settings = agent_settings(unique, tmp_path, NODUS_AGENT_GPU_HEALTH_ON_FAULT="finish")
    registration = Registration(store, settings, real_inventory(unique, 1))
    await registration.register()
    stopped: list[str] = []

    async def stop_work(message: str) -> None:
        stopped.append(message)

    health = GPUHealth(settings, registration, stop_work, nvml=FakeNVML([Gpu(remap=(0, 1, 1, 0))]))
    try:
        assert await health.start()
        host = Host(settings, store, registration, FakeNVML([]))
        node = await drained(host)
        assert find_condition(node.status.conditions, GPU_HEALTHY).reason == ROW_REMAP_PENDING  # type: ignore[union-attr]
        assert stopped == []  # on_fault = "finish": running work is left alone
    finally:
        await health.stop()
        await store.delete(None, unique)


async def test_no_watch_on_a_fake_inventory_or_when_disabled(nc: NATS, unique: str, tmp_path: Path) -> None:
    store = ObjectStore(nc, "nodes", Node)
    fake = Registration(store, agent_settings(unique, tmp_path), Inventory(gpus=[], fake=True))
    assert not await GPUHealth(fake.settings, fake, nvml=FakeNVML([])).start()
    off = agent_settings(unique, tmp_path, NODUS_AGENT_GPU_HEALTH_ENABLED="false")
    real = Registration(store, off, real_inventory(unique, 1))
    assert not await GPUHealth(off, real, nvml=FakeNVML([Gpu()])).start()


async def test_stopping_work_reports_a_running_attempt_lost(nc: NATS, unique: str, tmp_path: Path) -> None:
    """runner_stopper against the real Runner: the program is stopped and its attempt reported Lost, so the
    scheduler resumes it elsewhere."""
    # Imported here: the runner is shared with other work in progress; only this test depends on it.
    from nodus_agent.running import Runner

    settings = agent_settings(unique, tmp_path)
    runner = Runner(settings, Reporter(nc.jetstream(), unique))
    program = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]
    msg = StartAttempt(
        namespace="gpu",
        job="train",
        attempt=f"{unique}-a1",
        index=0,
        attempt_no=1,
        node=unique,
        command=program,
    )
    await runner.start(msg)
    assert runner.runs
    await runner_stopper(runner)("GPU fault on node x: GPU 0: XID 79")
    adir = AttemptDir(settings.workdir, "gpu", msg.attempt)

    def finished() -> bool:
        record = adir.load()
        return record is not None and record.phase == FINISHED and record.reported

    await eventually(finished, message="the attempt was never reported")
    report = adir.load().report  # type: ignore[union-attr]
    assert (
        report is not None
        and report.reason == "Lost"
        and report.message == "GPU fault on node x: GPU 0: XID 79"
    )
    await asyncio.wait_for(runner.shutdown(), 5)


async def test_a_start_that_reaches_a_drained_node_is_lost_without_running(
    nc: NATS, unique: str, tmp_path: Path
) -> None:
    from nodus_agent.running import Runner

    settings = agent_settings(unique, tmp_path)
    runner = Runner(settings, Reporter(nc.jetstream(), unique))
    runner.drained = lambda: "GPU 0: XID 79"
    ran = tmp_path / "ran"
    msg = StartAttempt(
        namespace="gpu",
        job="train",
        attempt=f"{unique}-late",
        index=0,
        attempt_no=1,
        node=unique,
        command=[sys.executable, "-c", f"open({str(ran)!r}, 'w').close()"],
    )
    await runner.start(msg)
    report = AttemptDir(settings.workdir, "gpu", msg.attempt).load().report  # type: ignore[union-attr]
    assert report is not None and report.reason == "Lost"
    assert report.message is not None and "drained" in report.message and "XID 79" in report.message
    assert not ran.exists() and not runner.runs
