"""What an attempt's containers are: the spec the runner hands the container runtime (ADR-0018).

An attempt is up to three kinds of container, told apart by the label ``nodus.dev/role``:

* ``init`` (``<name>-init``): ``initCommand``, run to completion before anything else, with the main
  container's image, mounts, env, resources and GPUs; a non-zero exit or a timeout fails the launch;
* ``sidecar`` (``<name>-sidecar-<sidecar>``): started before the main container and stopped once it has
  exited (Kubernetes' native sidecars). The first sidecar owns the network namespace (with the attempt's
  egress policy) and the main container and the other sidecars join it, so they reach each other on
  ``localhost`` as in a pod;
* ``main`` (``<name>``): the program.

Every container carries ``nodus.dev/node``, ``nodus.dev/namespace``, ``nodus.dev/attempt`` and
``nodus.dev/role``. This module is the vocabulary (roles, labels, the env contract's paths inside a
container, names) and the checked :class:`ContainerSpec`, with no I/O: the runner
(:mod:`nodus_agent.dockerruntime`) builds specs, :mod:`nodus_agent.containerbodies` turns them into what
the engine is sent and :mod:`nodus_agent.containers` runs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Final, Literal

from nodus_agent.attemptdir import AttemptDir
from nodus_agent.configuring import Ulimit
from nodus_agent.dockerapi import RegistryAuth

GpuMode = Literal["device-requests", "nvidia-runtime", "none"]
EgressPolicy = Literal["Deny", "AllowList", "Open"]
Role = Literal["main", "init", "sidecar"]
MAIN: Final = "main"
INIT: Final = "init"
SIDECAR: Final = "sidecar"

LABEL_NODE: Final = "nodus.dev/node"
LABEL_NAMESPACE: Final = "nodus.dev/namespace"
LABEL_ATTEMPT: Final = "nodus.dev/attempt"
LABEL_ROLE: Final = "nodus.dev/role"
LABEL_SIDECAR: Final = "nodus.dev/sidecar"
LABEL_EGRESS: Final = "nodus.dev/egress"
ALLOWLIST_UNENFORCED: Final = "AllowList-unenforced"

# Where the attempt directory appears inside a container (the env contract's paths).
INPUTS_PATH: Final = "/nodus/inputs"
OUTPUTS_PATH: Final = "/nodus/outputs"
STATE_PATH: Final = "/nodus/state"
REPORT_PATH: Final = "/nodus/report.jsonl"

# Docker's rule for container names; sidecar names become part of one.
CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")


def parse_ulimits(text: str) -> tuple[Ulimit, ...]:
    """``nofile=1024:1024,nproc=1024`` (soft:hard, or one number for both), as a setting is written.

    Real hosts leave it empty (containers inherit the engine's limits); a sandbox that may not raise
    rlimits (podman here, see ``notes/containers.md``) needs explicit, lower ones.
    """
    limits = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        how = f"ulimit {item!r}: write NAME=SOFT:HARD, e.g. nofile=1024:1024"
        name, sep, values = item.partition("=")
        soft, _, hard = values.partition(":")
        if not sep or not name.strip():
            raise ValueError(how)
        try:
            limits.append(Ulimit(name.strip(), int(soft), int(hard or soft)))
        except ValueError:
            raise ValueError(how) from None
    return tuple(limits)


@dataclass(frozen=True)
class Mount:
    """A host directory (or file) bound into the container."""

    source: Path
    target: str
    read_only: bool = False


def attempt_mounts(adir: AttemptDir) -> tuple[Mount, ...]:
    """The attempt directory as the env contract promises it: inputs read-only, outputs and state
    writable, and the report file (a file, so the agent's record and log beside it stay out of reach)."""
    return (
        Mount(adir.inputs, INPUTS_PATH, read_only=True),
        Mount(adir.outputs, OUTPUTS_PATH),
        Mount(adir.state, STATE_PATH),
        Mount(adir.report, REPORT_PATH),
    )


@dataclass(frozen=True)
class InitCommand:
    """``spec.initCommand``: an argv run to completion before the program, within ``timeout_s``."""

    command: tuple[str, ...]
    timeout_s: float


@dataclass(frozen=True)
class Sidecar:
    """``spec.sidecars[]``: a helper started before the program and stopped after it."""

    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    """Defaults to the Job's image."""


@dataclass(frozen=True)
class ContainerSpec:
    """Everything the runtime needs to run one attempt.

    ``command`` replaces the image's ENTRYPOINT and ``args`` its CMD, as in Kubernetes: with neither the
    image's own run; with ``args`` only, they go to the image's entrypoint.
    """

    name: str
    """The main container's name, unique on the engine (e.g. ``nodus-<namespace>-<attempt>``)."""
    namespace: str
    attempt: str
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_ids: tuple[str, ...] = ()
    """Device ids (indexes or UUIDs) of the GPUs the attempt may use."""
    gpu_mode: GpuMode = "device-requests"
    cpus: Decimal | None = None
    memory_bytes: int | None = None
    shm_bytes: int | None = None
    """/dev/shm size: the engine's 64 MiB default breaks PyTorch DataLoader workers and NCCL."""
    mounts: tuple[Mount, ...] = ()
    egress: EgressPolicy = "Open"
    egress_allow: tuple[str, ...] = ()
    host_network: bool = False
    """The node's own network (gang members: rendezvous and NCCL between nodes); egress is then Open."""
    pull_auth: RegistryAuth | None = None
    init_command: InitCommand | None = None
    sidecars: tuple[Sidecar, ...] = ()

    def __post_init__(self) -> None:
        if not CONTAINER_NAME.fullmatch(self.name):
            raise ValueError(f"container name {self.name!r}: letters, digits, '_', '.', '-' only")
        names = [s.name for s in self.sidecars]
        for name in names:
            if not CONTAINER_NAME.fullmatch(name):
                raise ValueError(f"sidecar name {name!r}: letters, digits, '_', '.', '-' only")
        if len(set(names)) != len(names):
            raise ValueError(f"sidecar names must be unique: {names}")
        if self.host_network and self.egress == "Deny":
            raise ValueError("egress Deny cannot be enforced on the host's network: drop host_network")
        if self.cpus is not None and self.cpus <= 0:
            raise ValueError(f"cpus={self.cpus} must be positive")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes={self.memory_bytes} must be positive")


def init_name(spec: ContainerSpec) -> str:
    return f"{spec.name}-init"


def sidecar_name(spec: ContainerSpec, sidecar: Sidecar) -> str:
    return f"{spec.name}-sidecar-{sidecar.name}"


def egress_warning(spec: ContainerSpec) -> str | None:
    """What the runner should tell the user about egress it cannot enforce, or None."""
    if spec.egress == "AllowList":
        return (
            "egress AllowList is not enforced by the docker runtime: the container's network is Open "
            f"(allowed: {', '.join(spec.egress_allow) or 'nothing'}); use Deny to cut it off"
        )
    return None
