"""GPU discovery (ADR-0022): NVML's model names to catalog variants, count, memory, NVLink, driver and CUDA,
and how a discovery that disagrees with the configuration is settled.

No driver exists on the test machines, so NVML is a stand-in of pynvml's shape: the functions the agent
calls, over a list of devices, with pynvml's own constants and error classes. Only the decisions are under
test here; ``deploy/agent/gpu-check.sh`` runs the same code against a real driver.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from nodus_agent.inventory import NVML_VARIANTS, discover, model_of, resolve
from nodus_agent.settings import AgentSettings
from nodus_schema.quantities import format_bytes

CATALOG = Path(__file__).parents[2] / "services/scheduler/src/nodus_scheduler/data/catalog.json"
H100_BYTES = 85_520_809_984  # what NVML reports for an 80 GB H100 (81559 MiB)
H200_BYTES = 150_754_820_096


@dataclass
class Device:
    name: str | bytes
    memory: int = H100_BYTES
    nvlinks: int | None = 18
    """Active links; None: NVLink not supported (a PCIe part)."""
    max_links: int = 18


class FakeNVML:
    """pynvml's shape over fake devices; anything not defined here (constants, errors) is pynvml's."""

    def __init__(
        self,
        devices: list[Device],
        *,
        driver: str | bytes = "550.54.15",
        cuda: int = 12040,
        init_error: int | None = None,
    ) -> None:
        self.devices, self.driver, self.cuda, self.init_error = devices, driver, cuda, init_error
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return SimpleNamespace(index=index, dev=self.devices[index])

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return handle.dev.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"GPU-{handle.index:08d}-aaaa"

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=handle.dev.memory, free=handle.dev.memory, used=0)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        dev = handle.dev
        if dev.nvlinks is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= dev.max_links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if link < dev.nvlinks else pynvml.NVML_FEATURE_DISABLED

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda


def settings(**env: str) -> AgentSettings:
    base = {"NODUS_AGENT_NODE": "gpu-1", "NODUS_AGENT_REGION": "us"}
    return AgentSettings.from_env({**base, **{f"NODUS_AGENT_{k.upper()}": v for k, v in env.items()}})


def hosts(name: str, n: int, **dev: Any) -> FakeNVML:
    return FakeNVML([Device(name, **dev) for _ in range(n)])


# -- the model table -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvml_name", "variant"),
    [
        ("NVIDIA B200", "B200-SXM-180G"),
        ("NVIDIA H200", "H200-SXM-141G"),
        ("NVIDIA H200 NVL", "H200-NVL-141G"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80G"),
        ("NVIDIA H100 SXM5 80GB", "H100-SXM-80G"),
        ("NVIDIA H100 PCIe", "H100-PCIE-80G"),
        ("NVIDIA H100 NVL", "H100-NVL-94G"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM-40G"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM-80G"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIE-80G"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        # Parts the catalog does not sell: no variant, rather than a wrong one.
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA L40", None),
        ("NVIDIA A100-PCIE-40GB", None),
        ("Tesla V100-SXM2-16GB", None),
        ("NVIDIA H800", None),
    ],
)
def test_nvml_names_map_to_catalog_variants(nvml_name: str, variant: str | None) -> None:
    model = model_of(nvml_name)
    assert (model.variant if model else None) == variant


def test_the_table_agrees_with_the_scheduler_catalog() -> None:
    """The table is a copy (the agent may not import the scheduler): every variant it names is in the
    catalog with the same interconnect, and every NVIDIA variant of the catalog has a row."""
    catalog = {v["id"]: v for v in json.loads(CATALOG.read_text())["variants"]}
    for model in NVML_VARIANTS:
        assert model.variant in catalog, f"{model.variant} is not a catalog variant"
        assert (catalog[model.variant]["interconnect"] == "NVLink") == model.nvlink, model.variant
    nvidia = {v for v, spec in catalog.items() if spec["interconnect"] != "InfinityFabric"}
    assert nvidia == {m.variant for m in NVML_VARIANTS}


# -- discovery -----------------------------------------------------------------------------------------------


def test_a_gpu_host_registers_what_nvml_sees() -> None:
    nvml = hosts("NVIDIA H200", 8, memory=H200_BYTES, nvlinks=18)
    resolved, inventory = resolve(settings(), nvml)
    assert (resolved.variant, resolved.gpus, resolved.offering) == ("H200-SXM-141G", 8, "h200-sxm-141g-x8-us")
    assert resolved.gpu_memory == format_bytes(H200_BYTES) == "143771Mi"
    assert not inventory.fake
    assert [(g.index, g.variant, g.memory, g.healthy) for g in inventory.gpus] == [
        (i, "H200-SXM-141G", "143771Mi", True) for i in range(8)
    ]
    assert inventory.gpus[3].uuid == "GPU-00000003-aaaa"
    assert (inventory.driver_version, inventory.cuda_version) == ("550.54.15", "12.4")
    assert inventory.nvlinks == (18,) * 8 and inventory.names == ("NVIDIA H200",) * 8
    assert nvml.calls == ["init", "shutdown"]
    assert discover(settings(), nvml).gpus == inventory.gpus


def test_older_nvml_bindings_return_bytes() -> None:
    nvml = FakeNVML([Device(b"NVIDIA L4", nvlinks=None)], driver=b"535.104.05", cuda=12020)
    resolved, inventory = resolve(settings(), nvml)
    assert (resolved.variant, inventory.names, inventory.driver_version) == (
        "L4",
        ("NVIDIA L4",),
        "535.104.05",
    )
    assert (inventory.cuda_version, inventory.nvlinks) == ("12.2", (0,))


def test_no_driver_means_a_fake_inventory_of_the_configured_node() -> None:
    nvml = FakeNVML([Device("NVIDIA H100 80GB HBM3")], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    configured = settings(variant="L4", gpus="2", gpu_memory="24Gi")
    resolved, inventory = resolve(configured, nvml)
    assert resolved == configured and inventory.fake
    assert [(g.variant, g.memory) for g in inventory.gpus] == [("L4", "24Gi"), ("L4", "24Gi")]
    # fake_gpus: NVML is not even asked.
    untouched = FakeNVML([Device("NVIDIA H100 80GB HBM3")])
    assert resolve(settings(fake_gpus="true"), untouched)[1].fake and untouched.calls == []


def test_a_configured_variant_nvml_contradicts_loses_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        resolved, _ = resolve(settings(variant="H100-SXM-80G"), hosts("NVIDIA H200", 8))
    assert (resolved.variant, resolved.offering) == ("H200-SXM-141G", "h200-sxm-141g-x8-us")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("GPU VARIANT MISMATCH" in m and "force_variant" in m for m in errors), errors


def test_force_variant_keeps_the_configured_one(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        resolved, inventory = resolve(
            settings(variant="H100-SXM-80G", force_variant="true"), hosts("NVIDIA H200", 8)
        )
    assert resolved.variant == "H100-SXM-80G" and {g.variant for g in inventory.gpus} == {"H100-SXM-80G"}
    assert any(r.levelno == logging.ERROR and "MISMATCH" in r.getMessage() for r in caplog.records)


def test_an_unknown_part_keeps_the_configured_variant(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        resolved, _ = resolve(settings(variant="H100-SXM-80G"), hosts("NVIDIA H800", 2))
    assert resolved.variant == "H100-SXM-80G" and resolved.gpus == 2
    assert any(r.levelno == logging.WARNING and "H800" in r.getMessage() for r in caplog.records)


def test_the_default_variant_gives_way_quietly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        resolved, _ = resolve(settings(), hosts("NVIDIA L40S", 4, nvlinks=None))
    assert (resolved.variant, resolved.offering) == ("L40S", "l40s-x4-us")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_gpus_set_lower_offers_the_first_ones_and_set_higher_gives_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    resolved, inventory = resolve(settings(gpus="4"), hosts("NVIDIA H100 80GB HBM3", 8))
    assert resolved.gpus == 4 and [g.index for g in inventory.gpus] == [0, 1, 2, 3]
    assert resolved.offering == "h100-sxm-80g-x4-us"
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        resolved, inventory = resolve(settings(gpus="8"), hosts("NVIDIA H100 80GB HBM3", 7))
    assert resolved.gpus == 7 and len(inventory.gpus) == 7
    assert any(r.levelno == logging.ERROR and "NVML sees 7" in r.getMessage() for r in caplog.records)


def test_a_configured_offering_is_kept_and_checked(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        fits, _ = resolve(settings(offering="h100-sxm-80g-x8-eu"), hosts("NVIDIA H100 80GB HBM3", 8))
    assert fits.offering == "h100-sxm-80g-x8-eu"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        odd, _ = resolve(settings(offering="h100-sxm-80g-x8-us"), hosts("NVIDIA H100 80GB HBM3", 4))
    assert odd.offering == "h100-sxm-80g-x8-us"  # the price book is the scheduler's: kept, and flagged
    assert any(r.levelno == logging.ERROR and "does not look like" in r.getMessage() for r in caplog.records)


def test_an_nvlink_part_without_active_links_is_flagged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        _, inventory = resolve(settings(), hosts("NVIDIA H100 80GB HBM3", 8, nvlinks=0))
    assert inventory.nvlinks == (0,) * 8
    assert any("fabric manager" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        resolve(settings(), hosts("NVIDIA H100 80GB HBM3", 1, nvlinks=0))  # one GPU: nothing to link
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_mixed_models_are_an_error_and_the_majority_wins(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNVML(
        [Device("NVIDIA H100 80GB HBM3"), Device("NVIDIA H100 80GB HBM3"), Device("NVIDIA H100 PCIe")]
    )
    with caplog.at_level(logging.INFO, logger="nodus_agent.inventory"):
        resolved, _ = resolve(settings(), nvml)
    assert resolved.variant == "H100-SXM-80G"
    assert any(r.levelno == logging.ERROR and "mixes GPU models" in r.getMessage() for r in caplog.records)
