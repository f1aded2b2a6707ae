"""GPU discovery: NVML where a driver answers, else a fake inventory of the configured variant.

The fake inventory is what local stacks and tests run on: the Node says ``fakeGpus: true`` so nobody
mistakes it for hardware. Discovery never fails the agent: a host without NVML is a fake-GPU host.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from nodus_agent.settings import AgentSettings
from nodus_schema.nodes import GPUDevice
from nodus_schema.quantities import format_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inventory:
    gpus: list[GPUDevice]
    fake: bool


def discover(settings: AgentSettings) -> Inventory:
    """The GPUs of this host (blocking: NVML calls are synchronous; run it in a thread)."""
    gpus = [] if settings.fake_gpus else nvml_devices(settings.variant)
    if gpus:
        return Inventory(gpus=gpus, fake=False)
    return Inventory(gpus=fake_devices(settings), fake=True)


def fake_devices(settings: AgentSettings) -> list[GPUDevice]:
    return [
        GPUDevice(
            index=i,
            uuid=f"GPU-fake-{settings.node}-{i}",
            variant=settings.variant,
            memory=settings.gpu_memory,
        )
        for i in range(settings.gpus)
    ]


def nvml_devices(variant: str) -> list[GPUDevice]:
    """Devices NVML reports, or [] when NVML is missing, fails, or sees no device."""
    try:
        # nvidia-ml-py ships no type information; importing is harmless, nvmlInit loads the driver.
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: a fake-GPU host
        log.info("no NVML (%s): using a fake GPU inventory", e)
        return []
    try:
        return [_device(pynvml, i, variant) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception as e:
        log.warning("NVML failed while listing GPUs (%s): using a fake GPU inventory", e)
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as e:
            log.debug("nvmlShutdown failed: %s", e)


def _device(nvml: Any, index: int, variant: str) -> GPUDevice:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    log.info("GPU %d: %s (%s)", index, _text(nvml.nvmlDeviceGetName(handle)), uuid)
    return GPUDevice(
        index=index,
        uuid=uuid,
        # NVML names ("NVIDIA H100 80GB HBM3") are not catalog ids: the operator's variant is what the
        # offering was priced for, so it wins; the NVML name shows up in the agent's log.
        variant=variant,
        memory=format_bytes(total),
    )


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py versions return bytes.
    return value.decode() if isinstance(value, bytes) else value
