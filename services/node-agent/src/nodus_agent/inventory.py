"""GPU discovery: NVML where a driver answers, else a fake inventory of the configured variant.

The fake inventory is what local stacks and tests run on: the Node says ``fakeGpus: true`` so nobody
mistakes it for hardware. Discovery never fails the agent: a host without NVML is a fake-GPU host.

On a GPU host the hardware is the truth: NVML's model name maps to a catalog variant
(:data:`NVML_VARIANTS`), its count and memory are what the node offers, and where they disagree with the
configuration the discrepancy is logged as an error and the discovered values win, unless the operator
pinned the variant with ``force_variant`` (a part the table does not know yet, or a deliberate choice).
:func:`resolve` returns both the inventory and the settings the node should register with.

Every NVML call goes through a module object (``pynvml`` by default), so the logic can be tested with a
stand-in of the same shape where no driver exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from nodus_agent.configuring import default_offering
from nodus_agent.settings import AgentSettings
from nodus_schema.nodes import GPUDevice
from nodus_schema.quantities import format_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NvmlModel:
    """One row of the NVML name table: a pattern on ``nvmlDeviceGetName`` and the catalog variant."""

    pattern: str
    variant: str
    nvlink: bool
    """The catalog's interconnect is NVLink: active links are expected on a multi-GPU node."""


NVML_VARIANTS: Final[tuple[NvmlModel, ...]] = (
    # A copy of the scheduler's catalog (services/scheduler/.../data/catalog.json) reduced to what NVML
    # can tell apart; the agent may not import the scheduler, and tests/agent/test_inventory.py fails
    # when the two drift. First match wins, so the specific forms (NVL, PCIe) come before the plain name.
    NvmlModel(r"\bB200\b", "B200-SXM-180G", nvlink=True),
    NvmlModel(r"\bH200 NVL\b", "H200-NVL-141G", nvlink=True),
    NvmlModel(r"\bH200\b", "H200-SXM-141G", nvlink=True),  # "NVIDIA H200"
    NvmlModel(r"\bH100 NVL\b", "H100-NVL-94G", nvlink=True),
    NvmlModel(r"\bH100 PCIe\b", "H100-PCIE-80G", nvlink=False),
    NvmlModel(r"\bH100\b", "H100-SXM-80G", nvlink=True),  # "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"
    NvmlModel(r"\bA100-SXM4?-40GB\b", "A100-SXM-40G", nvlink=True),
    NvmlModel(r"\bA100-SXM4?-80GB\b", "A100-SXM-80G", nvlink=True),
    NvmlModel(r"\bA100 80GB PCIe\b|\bA100-PCIE-80GB\b", "A100-PCIE-80G", nvlink=False),
    NvmlModel(r"\bL40S\b", "L40S", nvlink=False),
    NvmlModel(r"\bL4\b", "L4", nvlink=False),
    NvmlModel(r"\bA10G\b", "A10G", nvlink=False),
)
_COMPILED: Final = tuple((re.compile(m.pattern, re.IGNORECASE), m) for m in NVML_VARIANTS)


def model_of(nvml_name: str) -> NvmlModel | None:
    """The table row for an NVML device name, or None for a part the table does not know."""
    for pattern, model in _COMPILED:
        if pattern.search(nvml_name):
            return model
    return None


@dataclass(frozen=True)
class NvmlGPU:
    """One device as NVML reports it."""

    index: int
    uuid: str
    name: str
    memory_bytes: int
    nvlinks: int
    """Active NVLink links (0 on PCIe parts and where NVML cannot tell)."""


@dataclass(frozen=True)
class Discovery:
    """What NVML says of this host."""

    gpus: list[NvmlGPU]
    driver_version: str | None = None
    cuda_version: str | None = None
    """The CUDA version the driver supports ("12.4"), not a toolkit's."""


@dataclass(frozen=True)
class Inventory:
    gpus: list[GPUDevice]
    fake: bool
    driver_version: str | None = None
    cuda_version: str | None = None
    names: tuple[str, ...] = ()
    """NVML's model name of each GPU offered."""
    nvlinks: tuple[int, ...] = ()
    """Active NVLink links of each GPU offered."""


# -- entry points -------------------------------------------------------------------------------------------
def discover(settings: AgentSettings, nvml: Any = None) -> Inventory:
    """The GPUs of this host (blocking: NVML calls are synchronous; run it in a thread)."""
    return resolve(settings, nvml)[1]


def resolve(settings: AgentSettings, nvml: Any = None) -> tuple[AgentSettings, Inventory]:
    """The settings the node registers with and its inventory: NVML's discovery reconciled with the
    configuration (:func:`reconcile`), or a fake inventory of the configured variant. Blocking."""
    return _settle(settings, None if settings.fake_gpus else read_nvml(nvml))


def _settle(settings: AgentSettings, found: Discovery | None) -> tuple[AgentSettings, Inventory]:
    if found is None or not found.gpus:
        return settings, Inventory(gpus=fake_devices(settings), fake=True)
    return reconcile(settings, found)


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


def load_nvml() -> Any | None:
    """The ``pynvml`` module, or None where nvidia-ml-py is not installed."""
    try:
        # nvidia-ml-py ships no type information; importing is harmless, nvmlInit loads the driver.
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return None
    return pynvml


# -- reading NVML ---------------------------------------------------------------------------------------
def read_nvml(nvml: Any = None) -> Discovery | None:
    """What NVML reports, or None when NVML is missing or fails (the host then runs a fake inventory)."""
    nvml = nvml if nvml is not None else load_nvml()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: a fake-GPU host
        log.info("no NVML (%s): using a fake GPU inventory", e)
        return None
    try:
        gpus = [_device(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]
        return Discovery(gpus=gpus, driver_version=_driver(nvml), cuda_version=_cuda(nvml))
    except Exception as e:
        log.warning("NVML failed while listing GPUs (%s): using a fake GPU inventory", e)
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as e:
            log.debug("nvmlShutdown failed: %s", e)


def _device(nvml: Any, index: int) -> NvmlGPU:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    return NvmlGPU(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        nvlinks=_active_links(nvml, handle),
    )


def _active_links(nvml: Any, handle: Any) -> int:
    active = 0
    for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                active += 1
        except nvml.NVMLError:
            # Not supported (PCIe parts), or a link number past this part's last: no link there.
            continue
    return active


def _driver(nvml: Any) -> str | None:
    try:
        return _text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as e:
        log.warning("NVML did not say the driver version: %s", e)
        return None


def _cuda(nvml: Any) -> str | None:
    try:
        version = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
    except nvml.NVMLError as e:
        log.warning("NVML did not say the CUDA version: %s", e)
        return None
    return f"{version // 1000}.{version % 1000 // 10}"  # 12040 -> "12.4"


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py versions return bytes.
    return value.decode() if isinstance(value, bytes) else value


# -- reconciling ------------------------------------------------------------------------------------------
def reconcile(settings: AgentSettings, found: Discovery) -> tuple[AgentSettings, Inventory]:
    """The configured node against the discovered one (pure, apart from log lines). The variant:
    NVML's wins unless ``force_variant`` or NVML names a part the table does not know. The count:
    all GPUs found, or the first ``gpus`` if the operator set fewer. The offering: derived again
    when it was left default, else kept and checked against the variant and count."""
    gpus = _offered(settings, found.gpus)
    variant = _variant(settings, gpus)
    _check_nvlink(variant, gpus)
    offering = settings.offering
    if "offering" not in settings.configured:
        offering = default_offering(variant, len(gpus), settings.region_class)
    elif not offering.startswith(default_offering(variant, len(gpus), "")):
        log.error(
            "offering %s does not look like an offering of %d %s GPUs; the scheduler prices and places "
            "this node as %s: fix `offering` in the agent's config (or NODUS_AGENT_OFFERING)",
            offering,
            len(gpus),
            variant,
            offering,
        )
    resolved = dataclasses.replace(
        settings,
        variant=variant,
        gpus=len(gpus),
        gpu_memory=format_bytes(gpus[0].memory_bytes),
        offering=offering,
    )
    for g in gpus:
        memory = format_bytes(g.memory_bytes)
        log.info("GPU %d: %s (%s), %s, %d NVLink links", g.index, g.name, g.uuid, memory, g.nvlinks)
    inventory = Inventory(
        gpus=[
            GPUDevice(index=g.index, uuid=g.uuid, variant=variant, memory=format_bytes(g.memory_bytes))
            for g in gpus
        ],
        fake=False,
        driver_version=found.driver_version,
        cuda_version=found.cuda_version,
        names=tuple(g.name for g in gpus),
        nvlinks=tuple(g.nvlinks for g in gpus),
    )
    return resolved, inventory


def _offered(settings: AgentSettings, found: list[NvmlGPU]) -> list[NvmlGPU]:
    if "gpus" not in settings.configured or settings.gpus == len(found):
        return found
    if settings.gpus < len(found):
        log.warning(
            "offering %d of the %d GPUs NVML sees (indexes 0-%d), as `gpus` says",
            settings.gpus,
            len(found),
            settings.gpus - 1,
        )
        return found[: settings.gpus]
    log.error(
        "`gpus` says %d but NVML sees %d GPUs on this host: offering %d; fix `gpus` in the agent's config "
        "(or NODUS_AGENT_GPUS), or check `nvidia-smi` for a GPU that fell off the bus",
        settings.gpus,
        len(found),
        len(found),
    )
    return found


def _variant(settings: AgentSettings, gpus: list[NvmlGPU]) -> str:
    models = [model_of(g.name) for g in gpus]
    known = Counter(m.variant for m in models if m is not None)
    if not known:
        log.warning(
            "NVML's GPU %r is not in the agent's model table: registering the configured variant %s; "
            "set `force_variant = true` to say that is intended",
            gpus[0].name,
            settings.variant,
        )
        return settings.variant
    discovered, _ = known.most_common(1)[0]
    if len({g.name for g in gpus}) > 1:
        log.error(
            "this host mixes GPU models (%s): a node is one offering of one variant; registering %s",
            ", ".join(sorted({g.name for g in gpus})),
            discovered,
        )
    if discovered == settings.variant:
        return discovered
    if settings.force_variant:
        log.error(
            "GPU VARIANT MISMATCH: NVML reports %r (%s) but `variant` pins %s with force_variant: "
            "registering %s as configured",
            gpus[0].name,
            discovered,
            settings.variant,
            settings.variant,
        )
        return settings.variant
    if "variant" in settings.configured:
        log.error(
            "GPU VARIANT MISMATCH: `variant` says %s but NVML reports %r (%s): registering %s; fix "
            "`variant` in the agent's config, or set force_variant = true to keep %s",
            settings.variant,
            gpus[0].name,
            discovered,
            discovered,
            settings.variant,
        )
    return discovered


def _check_nvlink(variant: str, gpus: list[NvmlGPU]) -> None:
    model = next((m for m in NVML_VARIANTS if m.variant == variant), None)
    if model is not None and model.nvlink and len(gpus) > 1 and not any(g.nvlinks for g in gpus):
        log.error(
            "%s GPUs are NVLink parts but no NVLink link is active on this host: Jobs asking for "
            "interconnect NVLink will be slow here; check the fabric manager (systemctl status "
            "nvidia-fabricmanager) and `nvidia-smi nvlink --status`",
            variant,
        )


# -- python -m nodus_agent.inventory ----------------------------------------------------------------------
def main() -> None:
    """Print NVML's discovery as the agent sees it (``deploy/agent/gpu-check.sh`` runs this)."""
    parser = argparse.ArgumentParser(prog="python -m nodus_agent.inventory", description=main.__doc__)
    parser.add_argument("--config", metavar="PATH", help="the agent's TOML config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    settings = AgentSettings.from_env(dict(os.environ), args.config)
    found = None if settings.fake_gpus else read_nvml()
    resolved, inventory = _settle(settings, found)
    out = {
        "nvml": None if found is None else dataclasses.asdict(found),
        "registersAs": {
            "node": resolved.node,
            "offering": resolved.offering,
            "variant": resolved.variant,
            "gpus": resolved.gpus,
            "gpuMemory": resolved.gpu_memory,
            "fakeGpus": inventory.fake,
            "driverVersion": inventory.driver_version,
            "cudaVersion": inventory.cuda_version,
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
