"""The node agent's own settings, read from the ``NODUS_AGENT_*`` variables of the kit's ``Settings.env``.

Every field has a default that works on one machine (a fake one-GPU H100 node in region class ``local``),
so ``make run`` can start several agents by setting only ``NODUS_AGENT_NODE``.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from nodus_schema.quantities import parse_bytes

# Node names end up in subjects (``nodus.assign.<node>``), durable consumer names and KV keys: one
# subject token, so a DNS label (no dots) is the safe common ground.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class AgentSettings:
    node: str
    offering: str
    region_class: str
    variant: str
    gpu_memory: str
    gpus: int
    workdir: Path
    cwd: Path
    heartbeat_s: float
    pool: str | None
    stop_grace_s: float = 10.0
    fake_gpus: bool = False
    """Skip NVML: simulated nodes on a GPU host, and tests that must see the same on every machine."""
    interruptible: bool = False
    """The host is interruptible capacity (its provider may reclaim it): NODUS_AGENT_INTERRUPTIBLE."""

    @classmethod
    def from_env(cls, env: dict[str, str]) -> AgentSettings:
        """Build from ``NODUS_*`` variables; raises ValueError with the variable to fix."""
        node = env.get("NODUS_AGENT_NODE") or default_node_name()
        if not _NODE_NAME.fullmatch(node):
            raise ValueError(
                f"NODUS_AGENT_NODE={node!r} is not a node name: lowercase letters, digits and '-', "
                "at most 63, starting and ending with a letter or digit"
            )
        variant = env.get("NODUS_AGENT_VARIANT", "H100-SXM-80G")
        region = env.get("NODUS_AGENT_REGION", "local")
        gpus = _positive_int(env, "NODUS_AGENT_GPUS", "1")
        gpu_memory = env.get("NODUS_AGENT_GPU_MEMORY", "80Gi")
        try:
            parse_bytes(gpu_memory)
        except ValueError as e:
            raise ValueError(f"NODUS_AGENT_GPU_MEMORY: {e}") from None
        heartbeat_s = float(env.get("NODUS_AGENT_HEARTBEAT_S", "2"))
        if heartbeat_s <= 0:
            raise ValueError(f"NODUS_AGENT_HEARTBEAT_S={heartbeat_s} must be positive")
        return cls(
            node=node,
            # The price book's naming rule (h100-sxm-80g-x1-us): a default agent matches a default offering.
            offering=env.get("NODUS_AGENT_OFFERING") or f"{variant.lower()}-x{gpus}-{region}",
            region_class=region,
            variant=variant,
            gpu_memory=gpu_memory,
            gpus=gpus,
            workdir=Path(env.get("NODUS_AGENT_WORKDIR") or Path(".nodus") / "agent" / node).absolute(),
            cwd=Path(env.get("NODUS_AGENT_CWD") or os.getcwd()).absolute(),
            heartbeat_s=heartbeat_s,
            pool=env.get("NODUS_AGENT_POOL") or None,
            stop_grace_s=float(env.get("NODUS_AGENT_STOP_GRACE_S", "10")),
            fake_gpus=env.get("NODUS_AGENT_FAKE_GPUS", "").lower() in ("1", "true", "yes"),
            interruptible=env.get("NODUS_AGENT_INTERRUPTIBLE", "").lower() in ("1", "true", "yes"),
        )


def default_node_name() -> str:
    """The short host name, lowercased, with anything a node name cannot hold turned into '-'."""
    short = socket.gethostname().split(".")[0].lower()
    name = re.sub(r"[^a-z0-9-]+", "-", short).strip("-")[:63].strip("-")
    return name or "node"


def _positive_int(env: dict[str, str], key: str, default: str) -> int:
    raw = env.get(key, default)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{key}={value} must be at least 1")
    return value
