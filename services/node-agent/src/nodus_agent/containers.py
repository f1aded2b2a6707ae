"""The container runtime of the node agent: an attempt as containers of a Docker Engine API (ADR-0018).

The runner hands :meth:`ContainerRuntime.launch` a :class:`ContainerSpec` and gets a container id back;
:meth:`~ContainerRuntime.wait` returns how it ended, :meth:`~ContainerRuntime.follow_logs` copies its
output into the attempt's log file, :meth:`~ContainerRuntime.stop`, :meth:`~ContainerRuntime.signal` and
:meth:`~ContainerRuntime.remove` end it, and :meth:`~ContainerRuntime.adoptable` lists what an earlier
agent on this node left running.

An attempt is up to three kinds of container, told apart by the label ``nodus.dev/role``:

* ``init`` (``<name>-init``): ``initCommand``, run to completion before anything else, with the main
  container's image, mounts, env, resources and GPUs; a non-zero exit or a timeout fails the launch;
* ``sidecar`` (``<name>-sidecar-<sidecar>``): started before the main container and stopped once it has
  exited (Kubernetes' native sidecars). The first sidecar owns the network namespace (with the attempt's
  egress policy) and the main container and the other sidecars join it, so they reach each other on
  ``localhost`` as in a pod;
* ``main`` (``<name>``): the program.

Every container carries ``nodus.dev/node``, ``nodus.dev/namespace``, ``nodus.dev/attempt`` and
``nodus.dev/role``. Names are deterministic and every step looks at what exists before it acts, so a launch
is idempotent and safe to kill at any line: an agent that restarts (or a duplicate StartAttempt) adopts the
containers it finds (starting one that was only created) rather than failing on the name or running the
program twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, Final, Literal

from nodus_agent import processes
from nodus_agent.attemptdir import AttemptDir
from nodus_agent.configuring import Ulimit
from nodus_agent.dockerapi import (
    Conflict,
    DockerAPI,
    DockerError,
    EngineUnavailable,
    LogLine,
    NotFound,
    RegistryAuth,
    unix_time,
)

log = logging.getLogger(__name__)

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
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
SIGKILL_EXIT: Final = 137  # 128 + SIGKILL: what the OOM killer (and a stop past its grace) leaves
LOG_TAIL_LINES: Final = 20
LOG_DRAIN_S: Final = 2.0  # how long a followed stream may run on after its container exited


# -- the spec ---------------------------------------------------------------------------------------------
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
        if not _CONTAINER_NAME.fullmatch(self.name):
            raise ValueError(f"container name {self.name!r}: letters, digits, '_', '.', '-' only")
        names = [s.name for s in self.sidecars]
        for name in names:
            if not _CONTAINER_NAME.fullmatch(name):
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


# -- what the engine is sent ------------------------------------------------------------------------------
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


# -- outcomes ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ContainerExit:
    """How the main container ended. ``code`` None and ``lost`` True when that cannot be known."""

    code: int | None
    oom_killed: bool = False
    lost: bool = False
    message: str | None = None


@dataclass(frozen=True)
class Adopted:
    """A main container of this node found on the engine (an earlier agent's, or still this one's)."""

    id: str
    name: str
    namespace: str
    attempt: str
    running: bool
    state: str
    """The engine's word: created, running, paused, exited, dead, ..."""


SUCCESS: Final = "success"
CUSTOMER: Final = "customer"
INFRASTRUCTURE: Final = "infrastructure"


@dataclass(frozen=True)
class Verdict:
    """An exit in the runner's terms: ``reason`` for AttemptFinished, and who it counts against:
    success, customer (``backoffLimit``) or infrastructure (``recovery.maxAttempts``)."""

    reason: str
    kind: str
    message: str | None


def classify(exit: ContainerExit) -> Verdict:
    """0 is Completed; an OOM kill is OOMKilled and any other exit Error (the customer's); a container
    or engine that vanished is Lost (the infrastructure's)."""
    if exit.lost or exit.code is None:
        return Verdict("Lost", INFRASTRUCTURE, exit.message or "the container was lost")
    if exit.code == 0:
        return Verdict("Completed", SUCCESS, None)
    if exit.oom_killed:
        return Verdict("OOMKilled", CUSTOMER, exit.message or "the program ran out of memory")
    described = f"the program {processes.describe_exit(exit.code)}"
    return Verdict("Error", CUSTOMER, f"{described}; {exit.message}" if exit.message else described)


class LaunchFailed(Exception):
    """The attempt could not start. ``reason`` is Error (the customer's: init command, image, command)
    or Lost (the node's: engine gone, a foreign container in the way); ``message`` says what to do."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


# Engine messages that are the job's doing (a bad image or command), not the node's.
_CUSTOMER_PULL = ("not found", "manifest unknown", "unauthorized", "denied", "invalid reference")
# (With an init process as PID 1 a missing program is an exit code and a log line instead.)
_CUSTOMER_START = ('exec: "', "executable file", "not found in $path", "exec format error", "chdir")


def _failure(error: DockerError, what: str, customer_hints: Sequence[str], fix: str) -> LaunchFailed:
    if isinstance(error, EngineUnavailable):
        return LaunchFailed("Lost", f"{what}: {error.message}")
    text = error.message.lower()
    if any(hint in text for hint in customer_hints):
        return LaunchFailed("Error", f"{what}: {error.message}; {fix}")
    return LaunchFailed("Lost", f"{what}: {error.message}")


# -- the runtime ------------------------------------------------------------------------------------------
class ContainerRuntime:
    """Runs attempts as containers of the engine behind ``api``, for node ``node``.

    ``ulimits``: given to every container (a sandbox setting; real hosts leave it empty). ``init_process``:
    a tiny init as PID 1 (``HostConfig.Init``). ``sidecar_grace_s``: how long sidecars get to stop after
    the program exits. ``engine_grace_s``: how long an engine that stops answering may take to come back
    before the containers it ran count as lost.
    """

    def __init__(
        self,
        api: DockerAPI,
        node: str,
        ulimits: Sequence[Ulimit] = (),
        *,
        init_process: bool = True,
        sidecar_grace_s: float = 10.0,
        engine_grace_s: float = 30.0,
        pull_timeout_s: float | None = 1800.0,
    ) -> None:
        self.api, self.node, self.ulimits = api, node, tuple(ulimits)
        self.init_process = init_process
        self.sidecar_grace_s = sidecar_grace_s
        self.engine_grace_s = engine_grace_s
        self.pull_timeout_s = pull_timeout_s
        # Containers this agent stopped or SIGKILLed: their 137 is ours, not an OOM kill.
        self._stopped: set[str] = set()

    def body(self, spec: ContainerSpec, role: Role, **kwargs: Any) -> dict[str, Any]:
        """The create body this runtime sends (see :func:`create_body`)."""
        return create_body(
            spec, self.node, role, ulimits=self.ulimits, init_process=self.init_process, **kwargs
        )

    # -- launching ----------------------------------------------------------------------------------------
    async def launch(self, spec: ContainerSpec) -> str:
        """Run the attempt (init command, sidecars, program); the main container's id.

        Idempotent by name: a main container of this attempt that already exists is adopted (started
        if it was only created, left alone if it runs or has exited, so a program never runs twice).
        Raises :class:`LaunchFailed`.
        """
        warning = egress_warning(spec)
        if warning:
            log.warning(warning, extra={"attempt": spec.attempt, "ns": spec.namespace})
        try:
            main = await self._existing(spec.name, spec, MAIN)
            if main is not None and main["State"]["Status"] != "created":
                return str(main["Id"])
            await self._ensure_images(spec)
            if main is None and spec.init_command is not None:
                await self._run_init(spec, spec.init_command)
            join = await self._start_sidecars(spec)
            cid = str(main["Id"]) if main else await self._create(spec.name, spec, MAIN, join=join)
            await self._start(cid, "the program")
            return cid
        except DockerError as e:  # what the steps did not classify themselves: the engine's trouble
            raise _failure(e, f"launching {spec.name}", (), "") from e

    async def _existing(self, name: str, spec: ContainerSpec, role: Role) -> dict[str, Any] | None:
        """The container ``name`` if it is this attempt's (by its labels); None if there is none."""
        try:
            info = await self.api.inspect(name)
        except NotFound:
            return None
        have = info.get("Config", {}).get("Labels") or {}
        want = {LABEL_NODE: self.node, LABEL_NAMESPACE: spec.namespace, LABEL_ATTEMPT: spec.attempt}
        want[LABEL_ROLE] = role
        if any(have.get(k) != v for k, v in want.items()):
            raise LaunchFailed(
                "Lost",
                f"a container named {name} exists that is not this attempt's {role} container "
                f"(labels {have}): remove it (`docker rm -f {name}`) or give the node a clean engine",
            )
        return info

    async def _create(self, name: str, spec: ContainerSpec, role: Role, **kwargs: Any) -> str:
        """Create, or adopt the one a concurrent or earlier launch created under the same name."""
        try:
            return await self.api.create(name, self.body(spec, role, **kwargs))
        except Conflict:
            info = await self._existing(name, spec, role)
            if info is None:  # removed again between the two calls: nothing to adopt, try once more
                return await self.api.create(name, self.body(spec, role, **kwargs))
            return str(info["Id"])

    async def _start(self, cid: str, what: str) -> None:
        try:
            await self.api.start(cid)
        except DockerError as e:
            raise _failure(
                e, f"{what} could not start", _CUSTOMER_START, "check the command and working directory"
            ) from e

    async def _ensure_images(self, spec: ContainerSpec) -> None:
        """Pull what is missing (IfNotPresent: pin a digest or a fresh tag to get a new image)."""
        for image in dict.fromkeys([spec.image, *(s.image for s in spec.sidecars if s.image)]):
            if await self.api.image_exists(image):
                continue
            try:
                await self.api.pull(image, spec.pull_auth, timeout_s=self.pull_timeout_s)
            except DockerError as e:
                raise _failure(
                    e, f"could not pull {image}", _CUSTOMER_PULL, "check the image name and imagePullSecrets"
                ) from e

    async def _run_init(self, spec: ContainerSpec, init: InitCommand) -> None:
        """Run the init command to completion, or adopt the run an earlier agent started."""
        info = await self._existing(init_name(spec), spec, INIT)
        if info is None:
            cid = await self._create(init_name(spec), spec, INIT)
            info = await self.api.inspect(cid)
        cid = str(info["Id"])
        status = info["State"]["Status"]
        if status == "created":
            await self._start(cid, "the initCommand")
            info = await self.api.inspect(cid)
        # The budget counts from the init container's own start, so an agent restart does not reset it.
        left = init.timeout_s - _seconds_since(info["State"].get("StartedAt"))
        try:
            async with asyncio.timeout(max(left, 0.0)):
                code = await self.api.wait(cid)
        except TimeoutError:
            self._stopped.add(cid)
            with contextlib.suppress(DockerError):
                await self.api.kill(cid)
            raise LaunchFailed(
                "Error", f"the initCommand did not finish within its timeout of {init.timeout_s:g}s"
            ) from None
        if code != 0:
            tail = await self.log_tail(cid)
            what = f"the initCommand {processes.describe_exit(code)}"
            raise LaunchFailed("Error", f"{what}; the last lines of its log:\n{tail}" if tail else what)

    async def _start_sidecars(self, spec: ContainerSpec) -> str | None:
        """Start every sidecar (again, if one has exited); the id whose network the others join."""
        owner: str | None = None
        for sidecar in spec.sidecars:
            name = sidecar_name(spec, sidecar)
            info = await self._existing(name, spec, SIDECAR)
            cid = (
                str(info["Id"])
                if info
                else await self._create(name, spec, SIDECAR, join=owner, sidecar=sidecar)
            )
            if info is None or not info["State"].get("Running"):
                await self._start(cid, f"sidecar {sidecar.name}")
            state = (await self.api.inspect(cid))["State"]
            if not state.get("Running") and state.get("ExitCode"):
                tail = await self.log_tail(cid)
                what = f"sidecar {sidecar.name} {processes.describe_exit(int(state['ExitCode']))}"
                raise LaunchFailed("Error", f"{what} before the program started; its log:\n{tail}")
            owner = owner or cid
        return owner

    # -- watching -----------------------------------------------------------------------------------------
    async def wait(self, cid: str) -> ContainerExit:
        """Until the main container has exited: how it ended. Then its sidecars are stopped.

        An engine that stops answering gets ``engine_grace_s`` to come back (the container may well
        still run); a container that vanishes, or an engine that stays away, is ``lost``.
        """
        rounds = 0
        while True:
            if rounds:
                await asyncio.sleep(min(0.1 * rounds, 2.0))  # an engine that keeps answering early
            rounds += 1
            try:
                code = await self.api.wait(cid)
            except NotFound:
                return ContainerExit(
                    None, lost=True, message="the container vanished: removed outside the agent"
                )
            except EngineUnavailable as e:
                if await self._engine_back():
                    continue
                return ContainerExit(None, lost=True, message=f"lost the container engine: {e.message}")
            try:
                info = await self.api.inspect(cid)
            except NotFound:
                message = f"the container exited with code {code} and was removed outside the agent"
                return ContainerExit(None, lost=True, message=message)
            except EngineUnavailable:
                continue  # the wait above decides how long to give it
            status = info["State"]["Status"]
            if status == "created":
                return ContainerExit(None, lost=True, message="the container was never started")
            if status in ("running", "paused", "restarting"):
                continue  # the engine answered early (restarted under us): wait again
            result = self._exit(cid, info)
            try:
                await self._stop_sidecars_of(info)
            except DockerError as e:  # the exit is known; sidecars left running are removed with it
                log.warning("the sidecars of %s were not stopped: %s", cid, e)
            return result

    def _exit(self, cid: str, info: Mapping[str, Any]) -> ContainerExit:
        state = info["State"]
        code = int(state.get("ExitCode", 0))
        limit = int((info.get("HostConfig") or {}).get("Memory") or 0)
        error = state.get("Error") or None
        if state.get("OOMKilled") and code != 0:
            return ContainerExit(code, oom_killed=True, message=_oom_message(limit, reported=True))
        # podman (cgroup v1 here) never reports OOMKilled: a SIGKILL nobody here sent, under a memory
        # limit, is taken for the OOM killer's.
        if code == SIGKILL_EXIT and limit and cid not in self._stopped:
            return ContainerExit(code, oom_killed=True, message=_oom_message(limit, reported=False))
        return ContainerExit(code, message=error)

    async def _engine_back(self) -> bool:
        """Is the engine answering again within ``engine_grace_s``? (Polled: nothing else tells.)"""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.engine_grace_s
        delay = 0.1
        while loop.time() < end:
            if await self.api.ping():
                return True
            await asyncio.sleep(min(delay, max(end - loop.time(), 0.0)))
            delay = min(delay * 2, 2.0)
        return await self.api.ping()

    # -- ending -------------------------------------------------------------------------------------------
    async def stop(self, cid: str, grace_s: float) -> bool:
        """SIGTERM the program, SIGKILL it after ``grace_s``, then stop its sidecars; False if it was
        not running (or is gone). EngineUnavailable if no engine answers."""
        self._stopped.add(cid)
        try:
            stopped = await self.api.stop(cid, grace_s)
            info = await self.api.inspect(cid)
        except NotFound:
            return False
        await self._stop_sidecars_of(info)
        return stopped

    async def signal(self, cid: str, sig: str) -> bool:
        """Send ``sig`` (``SIGUSR1``, ``SIGTERM``, ...) to the program, e.g. to make it checkpoint;
        False if it is not running."""
        if sig in ("SIGKILL", "KILL", "9"):
            self._stopped.add(cid)
        try:
            return await self.api.kill(cid, sig)
        except NotFound:
            return False

    async def remove(self, cid: str) -> None:
        """Remove the attempt's containers (program, init, sidecars) and their anonymous volumes."""
        try:
            info = await self.api.inspect(cid)
        except NotFound:
            return
        have = info.get("Config", {}).get("Labels") or {}
        if have.get(LABEL_NODE) != self.node or LABEL_ATTEMPT not in have or LABEL_NAMESPACE not in have:
            log.warning("not removing container %s: it is not an attempt of node %s", cid, self.node)
            return
        await self.remove_attempt(have[LABEL_NAMESPACE], have[LABEL_ATTEMPT])

    async def remove_attempt(self, namespace: str, attempt: str) -> None:
        """Remove every container of one attempt on this node; nothing if there are none."""
        found = await self.api.list_containers(
            {LABEL_NODE: self.node, LABEL_NAMESPACE: namespace, LABEL_ATTEMPT: attempt}
        )
        # Sidecars last: the first one owns the network namespace the others join, and podman refuses
        # to remove a container others still depend on.
        found.sort(key=lambda c: (c.get("Labels") or {}).get(LABEL_ROLE) == SIDECAR)
        for container in found:
            await self.api.remove(str(container["Id"]))
            self._stopped.discard(str(container["Id"]))

    async def _stop_sidecars_of(self, info: Mapping[str, Any]) -> None:
        have = (info.get("Config") or {}).get("Labels") or {}
        if LABEL_ATTEMPT not in have or LABEL_NAMESPACE not in have:
            return
        sidecars = await self.api.list_containers(
            {
                LABEL_NODE: self.node,
                LABEL_NAMESPACE: have[LABEL_NAMESPACE],
                LABEL_ATTEMPT: have[LABEL_ATTEMPT],
                LABEL_ROLE: SIDECAR,
            },
            all=False,
        )
        results = await asyncio.gather(
            *(self.api.stop(str(c["Id"]), self.sidecar_grace_s) for c in sidecars), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, NotFound):
                log.warning("a sidecar did not stop: %s", result)

    # -- after a restart ----------------------------------------------------------------------------------
    async def adoptable(self) -> list[Adopted]:
        """Every main container labelled with this node, running or not: a restarted agent waits for
        the running ones and collects the exit codes of those that finished while it was away."""
        found = await self.api.list_containers({LABEL_NODE: self.node, LABEL_ROLE: MAIN})
        adopted = []
        for c in found:
            have = c.get("Labels") or {}
            if LABEL_NAMESPACE not in have or LABEL_ATTEMPT not in have:
                continue
            names = c.get("Names") or [""]
            adopted.append(
                Adopted(
                    id=str(c["Id"]),
                    name=str(names[0]).lstrip("/"),
                    namespace=have[LABEL_NAMESPACE],
                    attempt=have[LABEL_ATTEMPT],
                    running=c.get("State") == "running",
                    state=str(c.get("State") or ""),
                )
            )
        return adopted

    async def attempts_on_node(self) -> set[tuple[str, str]]:
        """(namespace, attempt) of every container of this node, whatever its role: a restarted agent
        removes (:meth:`remove_attempt`) those it will neither adopt nor launch again, such as an init
        container whose main container was never created."""
        found = await self.api.list_containers({LABEL_NODE: self.node})
        pairs = ((c.get("Labels") or {}) for c in found)
        return {
            (p[LABEL_NAMESPACE], p[LABEL_ATTEMPT])
            for p in pairs
            if LABEL_NAMESPACE in p and LABEL_ATTEMPT in p
        }

    # -- logs ---------------------------------------------------------------------------------------------
    async def follow_logs(self, cid: str, path: Path) -> None:
        """Append the container's output to ``path`` until it exits, one line each:
        ``<time> <stdout|stderr> <text>`` (time: RFC 3339, UTC, nine fraction digits).

        While the container runs, lines are copied as the engine streams them, resuming where the file
        ends (its last time, skipping the lines already written), so an agent that restarts repeats
        none. Once it has exited the file is checked against the engine's complete log and repaired
        from the first line where they differ: podman's followed stream drops and mangles lines at high
        volume (podman issues #21914, #26206), its plain read does not. Returns when the container has
        exited (or is gone); raises EngineUnavailable if the engine stays away longer than
        ``engine_grace_s``. One follower per file at a time.
        """
        rounds = 0
        while True:
            if rounds:
                await asyncio.sleep(min(0.1 * rounds, 2.0))  # a stream that ended while the container runs
            rounds += 1
            try:
                info = await self.api.inspect(cid)
                if not info["State"].get("Running"):
                    await self._reconcile_logs(cid, path)
                    return
                await self._copy_logs(cid, path)
            except NotFound:
                return
            except EngineUnavailable:
                if not await self._engine_back():
                    raise

    async def _copy_logs(self, cid: str, path: Path) -> None:
        """Copy the followed stream until it ends, or until a moment after the container has exited:
        podman sometimes keeps a followed stream open after its container is gone (seen on a re-adopted
        container), and the plain read that follows repairs whatever the cut-off stream missed."""
        copying = asyncio.create_task(self._copy_stream(cid, path))
        exiting = asyncio.create_task(self.api.wait(cid))
        try:
            await asyncio.wait({copying, exiting}, return_when=asyncio.FIRST_COMPLETED)
            if not copying.done():
                await asyncio.wait({copying}, timeout=LOG_DRAIN_S)
        finally:
            for task in (copying, exiting):
                task.cancel()
            await asyncio.gather(exiting, return_exceptions=True)
        if not copying.cancelled() and copying.done():
            copying.result()  # the stream's own error (EngineUnavailable, NotFound) goes to the caller
        else:
            await asyncio.gather(copying, return_exceptions=True)

    async def _copy_stream(self, cid: str, path: Path) -> None:
        cursor = await asyncio.to_thread(LogCursor.resume, path)
        since = unix_time(cursor.since) if cursor.since else None
        stream = self.api.logs(cid, follow=True, timestamps=True, since=since)
        async with contextlib.aclosing(stream):
            async for batch in stream:
                fresh = cursor.admit(batch)
                if fresh:
                    await asyncio.to_thread(_append, path, "".join(render(line) for line in fresh))

    async def _reconcile_logs(self, cid: str, path: Path) -> None:
        stream = self.api.logs(cid, follow=False, timestamps=True)
        async with contextlib.aclosing(stream):
            await reconcile_log(path, stream)

    async def log_tail(self, cid: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of a container's output, for the message of a failure ("" if none)."""
        out: list[str] = []
        try:
            stream = self.api.logs(cid, timestamps=False, tail=lines)
            async with contextlib.aclosing(stream):
                async for batch in stream:
                    out.extend(line.text for line in batch)
        except DockerError:
            return ""
        return "\n".join(out[-lines:])


def _oom_message(limit: int, reported: bool) -> str:
    size = f"its memory limit of {_mib(limit)}" if limit else "the node's memory"
    evidence = "" if reported else " (the engine reported SIGKILL, exit code 137, under a memory limit)"
    return f"the program ran out of memory: it was killed for exceeding {size}{evidence}"


def _mib(n: int) -> str:
    return f"{n // 1024**2}Mi" if n % 1024**2 == 0 else f"{n} bytes"


def _seconds_since(stamp: str | None) -> float:
    if not stamp or stamp.startswith("0001-"):
        return 0.0
    try:
        when = dt.datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", stamp).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, time.time() - when.timestamp())


# -- the log file -----------------------------------------------------------------------------------------
def render(line: LogLine) -> str:
    """One line of the attempt's log file."""
    return f"{line.time} {line.stream} {line.text}\n"


@dataclass
class LogCursor:
    """Where a log file ends, so a new read of the engine's log continues it without repeating lines.

    ``since`` is the time of the file's last line and ``seen`` how many lines at its end carry exactly
    that time (podman's times are whole seconds, so there may be thousands). The engine is asked for
    lines from ``since`` on (its ``since`` includes it); until a later time appears, lines older than
    ``since`` are dropped and the first ``seen`` at ``since`` skipped. After that every line is new.
    """

    since: str | None = None
    seen: int = 0
    _skip: int = 0
    _resuming: bool = True

    @classmethod
    def resume(cls, path: Path, block: int = 65536) -> LogCursor:
        """The cursor of the file at ``path`` (blocking: run it in a thread). A last line torn by a
        kill mid-write is cut off; the engine sends it again."""
        try:
            f = path.open("rb+")
        except FileNotFoundError:
            return cls()
        with f:
            end = _cut_torn_tail(f, block)
            newest: bytes | None = None
            seen, pos, carry = 0, end, b""
            # Backwards, a block at a time, counting the run of lines at the last line's time.
            while pos > 0:
                start = max(0, pos - block)
                f.seek(start)
                lines = (f.read(pos - start) + carry).split(b"\n")
                carry = lines.pop(0) if start > 0 else b""  # may be the tail of an earlier line
                for line in reversed(lines):
                    if not line:
                        continue
                    stamp = line.split(b" ", 1)[0]
                    if newest is not None and stamp != newest:
                        return cls.at(newest.decode("ascii", errors="replace"), seen)
                    newest, seen = stamp, seen + 1
                pos = start
        return cls.at(newest.decode("ascii", errors="replace"), seen) if newest else cls()

    @classmethod
    def at(cls, since: str, seen: int) -> LogCursor:
        return cls(since=since, seen=seen, _skip=seen)

    def admit(self, lines: Sequence[LogLine]) -> list[LogLine]:
        """The lines of a batch that the file does not have yet."""
        fresh = []
        for line in lines:
            if self._resuming and self.since is not None and line.time is not None:
                if line.time < self.since:
                    continue
                if line.time == self.since and self._skip > 0:
                    self._skip -= 1
                    continue
                if line.time > self.since:
                    self._resuming = False
            fresh.append(line)
        return fresh


def _cut_torn_tail(f: BinaryIO, block: int) -> int:
    """Truncate ``f`` after its last newline (a line torn by a kill mid-write); the new size."""
    size = f.seek(0, os.SEEK_END)
    pos = size
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        newline = f.read(pos - start).rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        pos = start
    else:
        keep = 0
    if keep < size:
        f.truncate(keep)
    return keep


class LogFile:
    """The attempt's log file read line by line against the engine's log, and cut where they part.

    Blocking: every method runs in a thread. ``skip_before(t)`` passes the lines older than the engine's
    first line (kept: an engine that rotates its log no longer has them); ``take(n)`` reads the next
    lines; ``cut(k)`` truncates the file before the ``k``-th line of the last take (or after it, for
    ``k`` equal to its length), so appending continues from there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: BinaryIO | None = None
        self._offsets: list[int] = []  # where each line of the last take starts, and where it ended
        self._peeked: tuple[int, bytes] | None = None

    def open(self) -> None:
        self.path.touch()
        self._f = self.path.open("rb+")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def _next(self) -> tuple[int, bytes]:
        assert self._f is not None
        if self._peeked is not None:
            line, self._peeked = self._peeked, None
            return line
        offset = self._f.tell()
        return offset, self._f.readline()

    def skip_before(self, stamp: str) -> None:
        bound = stamp.encode()
        while True:
            offset, line = self._next()
            if not line or line.split(b" ", 1)[0] >= bound:
                self._peeked = (offset, line)
                return

    def take(self, n: int) -> list[bytes]:
        lines: list[bytes] = []
        self._offsets = []
        for _ in range(n):
            offset, line = self._next()
            if not line:
                self._peeked = (offset, line)
                break
            self._offsets.append(offset)
            lines.append(line)
        assert self._f is not None
        self._offsets.append(self._peeked[0] if self._peeked else self._f.tell())
        return lines

    def cut(self, k: int) -> None:
        assert self._f is not None
        self._f.truncate(self._offsets[k])
        self._peeked = (self._offsets[k], b"")  # nothing more to read: the rest is appended

    def cut_rest(self) -> None:
        """After the engine's last line: drop whatever the file still has."""
        assert self._f is not None
        offset, line = self._next()
        if line:
            self._f.truncate(offset)


async def reconcile_log(path: Path, batches: AsyncIterator[list[LogLine]]) -> None:
    """Make ``path`` end exactly as an exited container's complete log (``batches``): compare line by
    line, cut the file where they part (or where it ends) and append the rest. Lines older than the
    log's first (an engine that rotated them away) are kept. Safe to kill at any line: a new run
    compares again."""
    file = LogFile(path)
    await asyncio.to_thread(file.open)
    try:
        first, appending = True, False
        async for batch in batches:
            rendered = [render(line).encode() for line in batch]
            if first and batch and batch[0].time:
                await asyncio.to_thread(file.skip_before, batch[0].time)
            first = False
            if not appending:
                have = await asyncio.to_thread(file.take, len(rendered))
                same = _common_prefix(have, rendered)
                if same == len(rendered):
                    continue
                await asyncio.to_thread(file.cut, same)
                appending, rendered = True, rendered[same:]
            await asyncio.to_thread(_append_bytes, path, b"".join(rendered))
        if not (first or appending):  # a log with no lines at all (rotated away) cuts nothing
            await asyncio.to_thread(file.cut_rest)
    finally:
        await asyncio.to_thread(file.close)


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


def _append_bytes(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def _common_prefix(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
