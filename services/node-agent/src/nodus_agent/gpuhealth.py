"""GPU health: watch NVML for faults and drain the node on the first one.

A thread (NVML's calls block) waits on an NVML event set for critical XID errors and double-bit ECC
errors, and between waits polls what NVML only reports as state: rows waiting to be remapped or a remap
that failed (Ampere and later), pages waiting to be retired (earlier parts), a GPU that is lost. The same
poll runs once at start, so an agent restarted on a GPU that still needs a reset drains again at once.

On a fault the node drains (:meth:`Registration.drain_node`): phase ``Draining``, condition
``GPUHealthy=False`` with the fault as its reason, the GPU ``healthy: false``. The scheduler offers a
Draining node no new work. Running work is stopped and reported Lost (``gpu_health.on_fault = "stop"``,
the default: a program on a faulty GPU tends to hang or compute garbage while it is billed, and Lost
resumes it elsewhere from its checkpoint), or left to finish (``"finish"``).

The drain lasts until the agent restarts: the operator resets or replaces the GPU, then runs
``systemctl restart nodus-agent`` (deploy/agent/README.md).

XIDs a program causes on a healthy GPU (:data:`~nodus_agent.configuring.APPLICATION_XIDS`) never drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from nodus_agent.inventory import load_nvml
from nodus_agent.registering import Registration
from nodus_agent.settings import AgentSettings

log = logging.getLogger(__name__)

WAIT_S: Final = 1.0
"""The longest single wait for an NVML event: how late the watch thread may notice a stop."""

# Condition reasons (CamelCase codes, as every Nodus reason).
XID_CRITICAL: Final = "XidCriticalError"
DOUBLE_BIT_ECC: Final = "DoubleBitEccError"
ROW_REMAP_PENDING: Final = "RowRemapPending"
ROW_REMAP_FAILURE: Final = "RowRemapFailure"
RETIRED_PAGES_PENDING: Final = "RetiredPagesPending"
GPU_LOST: Final = "GpuLost"
GPU_RESET_REQUIRED: Final = "GpuResetRequired"

XID_MEANINGS: Final = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""The usual hardware XIDs, for the message an operator reads (NVIDIA's XID catalog has them all)."""


@dataclass(frozen=True)
class Fault:
    """One GPU fault: the condition's reason and message, and the GPU (None: the whole host)."""

    reason: str
    message: str
    gpu: int | None = None


# -- the decisions (pure: an NVML-shaped module in, a Fault or None out) ------------------------------------
def classify_event(
    nvml: Any, event_type: int, event_data: int, gpu: int, ignore_xids: Iterable[int]
) -> Fault | None:
    """A Fault for an NVML event that means a bad GPU; None for an XID a program causes, or any other."""
    if event_type & nvml.nvmlEventTypeXidCriticalError:
        if event_data in set(ignore_xids):
            log.info("GPU %d: XID %d is an application error: not draining", gpu, event_data)
            return None
        meaning = XID_MEANINGS.get(event_data, "see NVIDIA's XID catalog")
        return Fault(XID_CRITICAL, f"GPU {gpu}: XID {event_data} ({meaning})", gpu)
    if event_type & nvml.nvmlEventTypeDoubleBitEccError:
        return Fault(DOUBLE_BIT_ECC, f"GPU {gpu}: uncorrectable (double-bit) ECC memory error", gpu)
    return None


def inspect_device(nvml: Any, handle: Any, gpu: int) -> Fault | None:
    """What NVML reports as state rather than as an event: a row remap pending or failed, retired pages
    pending, a GPU lost or in need of a reset. None for a healthy GPU, or one that supports none of it."""
    try:
        _, _, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
    except nvml.NVMLError as e:
        lost = _lost(nvml, e, gpu)
        if lost is not None:
            return lost
    else:
        if failure:
            return Fault(ROW_REMAP_FAILURE, f"GPU {gpu}: row remapping failed: the GPU needs replacing", gpu)
        if pending:
            return Fault(ROW_REMAP_PENDING, f"GPU {gpu}: memory rows wait to be remapped: reset the GPU", gpu)
    try:
        retired = nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    except nvml.NVMLError as e:
        return _lost(nvml, e, gpu)
    if retired == nvml.NVML_FEATURE_ENABLED:
        return Fault(RETIRED_PAGES_PENDING, f"GPU {gpu}: memory pages wait to be retired: reset the GPU", gpu)
    return None


def _lost(nvml: Any, error: Any, gpu: int) -> Fault | None:
    """A fault for the NVML errors that say the GPU is gone or broken; None for the rest (not supported
    on this part, no permission, ...), which are no news about its health."""
    value = getattr(error, "value", None)
    if value == nvml.NVML_ERROR_GPU_IS_LOST:
        return Fault(GPU_LOST, f"GPU {gpu}: NVML says the GPU is lost ({error})", gpu)
    if value == nvml.NVML_ERROR_RESET_REQUIRED:
        return Fault(GPU_RESET_REQUIRED, f"GPU {gpu}: NVML says the GPU needs a reset ({error})", gpu)
    return None


# -- the watch (blocking: one thread) -----------------------------------------------------------------------
class Monitor:
    """NVML's side of the watch: :meth:`open`, then :meth:`wait_event` and :meth:`poll` in turn, then
    :meth:`close`; each fault is returned once (a pending remap is not news on the next poll)."""

    def __init__(self, nvml: Any, gpus: Sequence[int], ignore_xids: Iterable[int]) -> None:
        self.nvml = nvml
        self.indexes = list(gpus)
        self.ignore_xids = frozenset(ignore_xids)
        self.handles: dict[int, Any] = {}
        self.events: Any = None
        self._seen: set[tuple[str, str, int | None]] = set()

    def open(self) -> None:
        """Initialise NVML and register for the fault events each GPU supports; a GPU without event
        support (vGPU, some cloud parts) is still polled."""
        nvml = self.nvml
        nvml.nvmlInit()
        self.handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indexes}
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        try:
            self.events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            log.warning("NVML events unavailable (%s): GPU health is polled only", e)
            return
        for index, handle in self.handles.items():
            try:
                mask = wanted & int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, self.events)
            except nvml.NVMLError as e:
                log.warning("GPU %d: no NVML fault events (%s): its health is polled only", index, e)

    def wait_event(self, timeout_ms: int) -> list[Fault] | None:
        """Wait up to ``timeout_ms`` for one event: its fault, if new ([] for none); None when there is
        no event set to wait on, or the wait failed (the caller then waits on its own)."""
        nvml = self.nvml
        if self.events is None:
            return None
        try:
            data = nvml.nvmlEventSetWait_v2(self.events, timeout_ms)
        except nvml.NVMLError as e:
            if getattr(e, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                return []
            log.warning("waiting for NVML events failed: %s", e)
            return None
        gpu = self._index_of(data.device)
        fault = classify_event(nvml, int(data.eventType), int(data.eventData), gpu, self.ignore_xids)
        return self._new([fault] if fault is not None else [])

    def poll(self) -> list[Fault]:
        """The state of every GPU: the faults not reported before."""
        found = [inspect_device(self.nvml, handle, index) for index, handle in self.handles.items()]
        return self._new([f for f in found if f is not None])

    def close(self) -> None:
        nvml = self.nvml
        if self.events is not None:
            with contextlib.suppress(Exception):
                nvml.nvmlEventSetFree(self.events)
            self.events = None
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()

    def run(self, stopping: threading.Event, report: Callable[[Fault], None], poll_s: float) -> None:
        """The thread's loop until ``stopping`` is set: a poll at once, then events and polls in turn."""
        try:
            self.open()
        except Exception as e:
            log.error("GPU health watch not started: NVML failed (%s); faults will not drain this node", e)
            return
        # Waits are at most WAIT_S, so a stop is noticed within a second whatever poll_s says.
        wait_s = min(poll_s, WAIT_S)
        try:
            polled = time.monotonic()
            for fault in self.poll():
                report(fault)
            while not stopping.is_set():
                faults = self.wait_event(int(wait_s * 1000))
                if faults is None:
                    stopping.wait(wait_s)  # nothing to block on: the stop event is the timer
                    faults = []
                if time.monotonic() - polled >= poll_s:
                    polled = time.monotonic()
                    faults += self.poll()
                for fault in faults:
                    report(fault)
        except Exception:
            log.exception("GPU health watch failed; faults will not drain this node until the agent restarts")
        finally:
            self.close()

    def _index_of(self, device: Any) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetIndex(device))
        except Exception:
            return -1

    def _new(self, faults: list[Fault]) -> list[Fault]:
        fresh = [f for f in faults if (f.reason, f.message, f.gpu) not in self._seen]
        self._seen.update((f.reason, f.message, f.gpu) for f in fresh)
        return fresh


# -- the agent's side (asyncio) -----------------------------------------------------------------------------
StopWork = Callable[[str], Awaitable[None]]
"""Stops every running attempt with a message (reported Lost); see :func:`runner_stopper`."""


class _Stoppable(Protocol):
    def request_stop(self, reason: str, message: str) -> None: ...


class _Runs(Protocol):
    @property
    def runs(self) -> Mapping[Any, _Stoppable]: ...


def runner_stopper(runner: _Runs) -> StopWork:
    """A StopWork for :class:`~nodus_agent.running.Runner`: each run is asked to stop as Lost (its
    supervisor does the SIGTERM, the grace and the report), so the scheduler starts a new Attempt
    elsewhere, from the last checkpoint, counted against recovery.maxAttempts."""

    async def stop(message: str) -> None:
        for run in list(runner.runs.values()):
            run.request_stop("Lost", message)

    return stop


class GPUHealth:
    """Starts the watch thread, and drains the node (and stops work, per the setting) on a fault."""

    def __init__(
        self,
        settings: AgentSettings,
        registration: Registration,
        stop_work: StopWork | None = None,
        nvml: Any = None,
    ) -> None:
        self.settings, self.registration, self.stop_work = settings, registration, stop_work
        self._nvml = nvml
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self.faults: list[Fault] = []
        """Every fault handled, in order (for logs, tests and a future status endpoint)."""

    async def start(self) -> bool:
        """Watch, unless disabled, on a fake inventory, or without NVML; True when the watch runs."""
        if not self.settings.gpu_health or self.registration.inventory.fake:
            return False
        nvml = self._nvml if self._nvml is not None else load_nvml()
        if nvml is None:
            return False
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Fault] = asyncio.Queue()
        monitor = Monitor(
            nvml, [g.index for g in self.registration.inventory.gpus], self.settings.gpu_ignore_xids
        )

        def report(fault: Fault) -> None:  # on the watch thread: hand the fault to the event loop
            if self._stopping.is_set():
                return
            try:
                loop.call_soon_threadsafe(queue.put_nowait, fault)
            except RuntimeError:  # the loop closed under a thread that outlived stop()
                log.error("GPU fault after the agent stopped: %s", fault.message)

        self._thread = threading.Thread(
            target=monitor.run,
            args=(self._stopping, report, self.settings.gpu_poll_s),
            name="gpu-health",
            daemon=True,  # a driver call that never returns must not keep the agent from exiting
        )
        self._thread.start()
        self._task = asyncio.create_task(self._handle(queue), name="gpu-health")
        log.info(
            "watching GPU health",
            extra={"gpus": len(monitor.indexes), "onFault": self.settings.gpu_fault_action},
        )
        return True

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._thread is not None:
            # The thread notices within one wait (WAIT_S); it is a daemon, so a driver call that hangs
            # costs this join and nothing more.
            await asyncio.to_thread(self._thread.join, WAIT_S + 0.5)

    async def _handle(self, queue: asyncio.Queue[Fault]) -> None:
        while True:
            fault = await queue.get()
            try:
                await self.on_fault(fault)
            except Exception:
                log.exception("handling a GPU fault failed", extra={"reason": fault.reason})

    async def on_fault(self, fault: Fault) -> None:
        """Drain the node for ``fault``; stop running work if the setting says so. Idempotent."""
        self.faults.append(fault)
        node = self.settings.node
        log.error(
            "GPU FAULT on node %s: %s; draining the node (no new work)%s. Reset or replace the GPU, then "
            "restart the agent (systemctl restart nodus-agent) to take work again",
            node,
            fault.message,
            ", stopping running work" if self.settings.gpu_fault_action == "stop" else "",
            extra={"node": node, "reason": fault.reason, "gpu": fault.gpu},
        )
        await self.registration.drain_node(fault.reason, fault.message, fault.gpu)
        if self.settings.gpu_fault_action == "stop" and self.stop_work is not None:
            await self.stop_work(f"GPU fault on node {node}: {fault.message}")
