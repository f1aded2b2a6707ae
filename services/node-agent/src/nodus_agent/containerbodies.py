"""What the engine is sent to create one container of an attempt: the ``POST /containers/create`` body.

Pure: a :class:`~nodus_agent.containerspec.ContainerSpec` and the container's role in, a JSON body out, so
every rule about labels, networks, GPUs, limits and argv is tested without an engine. Separate from the
runtime (:mod:`nodus_agent.containers`), which decides when to create which container.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodus_agent.configuring import Ulimit
from nodus_agent.containerspec import (
    ALLOWLIST_UNENFORCED,
    INIT,
    LABEL_ATTEMPT,
    LABEL_EGRESS,
    LABEL_NAMESPACE,
    LABEL_NODE,
    LABEL_ROLE,
    LABEL_SIDECAR,
    ContainerSpec,
    EgressPolicy,
    Role,
    Sidecar,
)


def labels(spec: ContainerSpec, node: str, role: Role, sidecar: str | None = None) -> dict[str, str]:
    """The job's labels, then ours (which it cannot override: adoption and cleanup trust them)."""
    result = dict(spec.labels)
    result.update(
        {
            LABEL_NODE: node,
            LABEL_NAMESPACE: spec.namespace,
            LABEL_ATTEMPT: spec.attempt,
            LABEL_ROLE: role,
            LABEL_EGRESS: "Open" if spec.host_network else _egress_label(spec.egress),
        }
    )
    if sidecar is not None:
        result[LABEL_SIDECAR] = sidecar
    return result


def _egress_label(policy: EgressPolicy) -> str:
    return ALLOWLIST_UNENFORCED if policy == "AllowList" else policy


def network_mode(spec: ContainerSpec) -> str:
    """Deny: no interface but loopback. Open and AllowList (not enforceable here): the default bridge."""
    if spec.host_network:
        return "host"
    return "none" if spec.egress == "Deny" else "bridge"


def gpu_config(spec: ContainerSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """(HostConfig fields, env) that give the container exactly ``spec.gpu_ids``.

    NVIDIA_VISIBLE_DEVICES is always set in the GPU modes, to the ids or to ``void`` (none): CUDA base
    images set it to ``all``, and on a host whose default runtime is nvidia that alone would hand a
    container every GPU of the node. The job's own env cannot override it.
    """
    if spec.gpu_mode == "none":
        return {}, {}
    visible = ",".join(spec.gpu_ids) if spec.gpu_ids else "void"
    if spec.gpu_mode == "nvidia-runtime":
        return {"Runtime": "nvidia"}, {"NVIDIA_VISIBLE_DEVICES": visible}
    if not spec.gpu_ids:
        return {}, {"NVIDIA_VISIBLE_DEVICES": visible}
    request = {"Driver": "nvidia", "DeviceIDs": list(spec.gpu_ids), "Capabilities": [["gpu"]]}
    return {"DeviceRequests": [request]}, {"NVIDIA_VISIBLE_DEVICES": visible}


def create_body(
    spec: ContainerSpec,
    node: str,
    role: Role,
    *,
    ulimits: Sequence[Ulimit] = (),
    init_process: bool = True,
    join: str | None = None,
    sidecar: Sidecar | None = None,
) -> dict[str, Any]:
    """The ``POST /containers/create`` body of one container of the attempt.

    ``join``: the id of the container whose network namespace this one shares (the first sidecar's).
    Sidecars get the mounts but neither GPUs nor the program's CPU and memory limits.
    """
    env = dict(spec.env)
    host: dict[str, Any] = {
        "Mounts": [
            {"Type": "bind", "Source": str(m.source), "Target": m.target, "ReadOnly": m.read_only}
            for m in spec.mounts
        ],
        "NetworkMode": f"container:{join}" if join else network_mode(spec),
        # A tiny init as PID 1 forwards signals and reaps zombies: a program that is PID 1 itself
        # ignores SIGTERM unless it installs a handler, so every stop would wait out its grace.
        "Init": init_process,
    }
    if ulimits:
        host["Ulimits"] = [u.body() for u in ulimits]
    if spec.shm_bytes:
        host["ShmSize"] = spec.shm_bytes
    body: dict[str, Any] = {"Image": spec.image, "Tty": False, "OpenStdin": False}
    if sidecar is None:
        if spec.cpus is not None:
            host["NanoCpus"] = int(spec.cpus * 1_000_000_000)
        if spec.memory_bytes is not None:
            # Swap equal to memory means no swap: the limit is real, and crossing it is an OOM kill.
            host["Memory"] = host["MemorySwap"] = spec.memory_bytes
        gpu_host, gpu_env = gpu_config(spec)
        host.update(gpu_host)
        env.update(gpu_env)
        if spec.working_dir:
            body["WorkingDir"] = spec.working_dir
        argv = spec.init_command.command if role == INIT and spec.init_command else None
        _set_argv(body, argv or spec.command, () if argv else spec.args)
    else:
        body["Image"] = sidecar.image or spec.image
        env.update(sidecar.env)
        _set_argv(body, sidecar.command, ())
    body["Env"] = [f"{k}={v}" for k, v in env.items()]
    body["Labels"] = labels(spec, node, role, sidecar.name if sidecar else None)
    body["HostConfig"] = host
    return body


def _set_argv(body: dict[str, Any], command: Sequence[str], args: Sequence[str]) -> None:
    if command:
        # An explicit (possibly empty) Cmd: the image's CMD must not trail a replaced entrypoint.
        body["Entrypoint"], body["Cmd"] = list(command), list(args)
    elif args:
        body["Cmd"] = list(args)
