"""The ``docker`` runtime (:class:`nodus_agent.runtimes.Runtime`) over :mod:`nodus_agent.containers`.

This module turns a StartAttempt into a :class:`~nodus_agent.containerspec.ContainerSpec`: the Job's image,
command and args (Kubernetes' ENTRYPOINT/CMD rule), the env contract with ``/nodus/...`` paths, the
attempt's folders mounted (inputs read-only), Secrets mounted read-only at ``/nodus/secrets/<name>``, a
ServiceAccount's token and CA read-only at ``/nodus/serviceaccount`` (ADR-0037),
the checkout of ``spec.source`` and the Volume mounts bound at their paths (ADR-0036: in the init container
and the sidecars too; the checkout is the working directory unless ``workingDir`` is set), the Job's CPU
and memory floors as limits, this node's GPUs, the egress policy, the init command and
sidecars, and the registry credentials of ``imagePullSecrets``. Containers carry the node's and the
attempt's labels, so an agent that restarts finds them and reports their real ends (ADR-0018).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import msgspec

from nodus_agent.attemptdir import AttemptDir, Record
from nodus_agent.containerexits import ContainerExit, LaunchFailed
from nodus_agent.containers import ContainerRuntime
from nodus_agent.containerspec import (
    INPUTS_PATH,
    OUTPUTS_PATH,
    REPORT_PATH,
    STATE_PATH,
    ContainerSpec,
    EgressPolicy,
    GpuMode,
    InitCommand,
    Mount,
    Sidecar,
    attempt_mounts,
)
from nodus_agent.dockerapi import DockerError, RegistryAuth
from nodus_agent.granting import Grants
from nodus_agent.identifying import PROGRAM_PATH as ACCOUNT_PATH
from nodus_agent.runtimes import Exit, Launch, LaunchError, Running
from nodus_schema.configs import Secret
from nodus_schema.messages import StartAttempt
from nodus_schema.quantities import parse_bytes, parse_duration

log = logging.getLogger(__name__)

SECRETS_PATH = "/nodus/secrets"
INIT_TIMEOUT_S = 30 * 60.0  # the reference's ceiling for initCommand.timeout, the default here
EGRESS: dict[str, EgressPolicy] = {"Deny": "Deny", "AllowList": "AllowList", "Open": "Open"}


@dataclass
class _Container:
    cid: str
    follower: asyncio.Task[None] | None = None

    @property
    def ident(self) -> str:
        return self.cid


class DockerRuntime:
    name = "docker"

    def __init__(
        self,
        containers: ContainerRuntime,
        *,
        gpu_ids: Sequence[str] = (),
        gpu_mode: GpuMode = "device-requests",
        grants: Grants | None = None,
    ) -> None:
        """``gpu_ids``: this node's GPUs (empty on a fake inventory: no device is requested)."""
        self.containers = containers
        self.gpu_ids = tuple(gpu_ids)
        self.gpu_mode: GpuMode = gpu_mode if gpu_ids else "none"
        self.grants = grants  # the run's Secrets, for imagePullSecrets

    def paths(self, adir: AttemptDir) -> dict[str, str]:
        return {
            "NODUS_REPORT": REPORT_PATH,
            "NODUS_OUTPUTS": OUTPUTS_PATH,
            "NODUS_STATE": STATE_PATH,
            "NODUS_INPUTS": INPUTS_PATH,
            "NODUS_SECRETS": SECRETS_PATH,
        }

    async def launch(self, launch: Launch) -> Running:
        try:
            await asyncio.to_thread(_mount_points, launch)
            spec = await self.spec(launch)
        except ValueError as e:
            raise LaunchError("Error", str(e)) from None
        except OSError as e:  # this host's disk
            raise LaunchError("Lost", f"could not make mount points in {launch.dir.inputs}: {e}") from None
        try:
            cid = await self.containers.launch(spec)
        except LaunchFailed as e:
            raise LaunchError(e.reason, e.message) from None
        except DockerError as e:
            raise LaunchError("Lost", str(e)) from None
        return self._follow(cid, launch.dir.log)

    async def spec(self, launch: Launch) -> ContainerSpec:
        """The container of ``launch`` (ValueError for what the Job asks that cannot be expressed)."""
        msg = launch.msg
        mounts: list[Mount] = list(attempt_mounts(launch.dir))
        if launch.secret_files:
            mounts.append(Mount(launch.dir.secrets, SECRETS_PATH, read_only=True))
        if launch.identity is not None:
            mounts.append(Mount(launch.identity.folder, ACCOUNT_PATH, read_only=True))
        # After the attempt's own: a Volume input at /nodus/inputs/<name> lands inside the inputs' bind.
        mounts.extend(Mount(m.host, m.target, read_only=m.read_only) for m in launch.plan.mounts)
        env = launch.env
        if launch.plan.source_path is not None:
            env = {**env, "NODUS_SRC": launch.plan.source_path}
        if launch.identity is not None:
            env = {**env, **launch.identity.env(ACCOUNT_PATH)}
        policy = msg.network.egress.policy if msg.network and msg.network.egress else None
        resources = msg.resources
        return ContainerSpec(
            name=container_name(msg),
            namespace=msg.namespace,
            attempt=msg.attempt,
            image=msg.image or "",
            command=tuple(msg.command),
            args=tuple(msg.args),
            env=env,
            working_dir=msg.working_dir or launch.plan.working_dir,
            labels={"nodus.dev/job": msg.job, "nodus.dev/index": str(msg.index)},
            gpu_ids=self.gpu_ids,
            gpu_mode=self.gpu_mode,
            cpus=_cpus(resources.cpu) if resources else None,
            memory_bytes=parse_bytes(resources.memory) if resources and resources.memory else None,
            mounts=tuple(mounts),
            egress=EGRESS.get(policy or "Open", "Open"),
            egress_allow=tuple(msg.network.egress.allow) if msg.network and msg.network.egress else (),
            host_network=msg.gang is not None,
            pull_auth=await self._pull_auth(msg),
            init_command=_init(msg),
            sidecars=tuple(_sidecar(s, env) for s in msg.sidecars),
        )

    def remember(self, record: Record, running: Running) -> Record:
        assert isinstance(running, _Container)
        return msgspec.structs.replace(record, container=running.cid)

    async def wait(self, running: Running) -> Exit:
        assert isinstance(running, _Container)
        return _exit(await self.containers.wait(running.cid))

    async def signal(self, running: Running, sig: signal.Signals) -> None:
        assert isinstance(running, _Container)
        with contextlib.suppress(DockerError):
            await self.containers.signal(running.cid, sig.name)

    async def stop(self, running: Running, grace_s: float) -> Exit:
        assert isinstance(running, _Container)
        with contextlib.suppress(DockerError):
            await self.containers.stop(running.cid, grace_s)
        return await self.wait(running)

    async def release(self, running: Running) -> None:
        assert isinstance(running, _Container)
        if running.follower is not None:
            # The follower ends with the container's output; bounded, so a stuck stream cannot hold the
            # attempt's finish.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, DockerError):
                await asyncio.wait_for(running.follower, 10)
        with contextlib.suppress(DockerError):
            await self.containers.remove(running.cid)

    async def reattach(self, adir: AttemptDir, record: Record, grace_s: float) -> Running | None:
        if record.container is None:
            return None
        try:
            found = {a.id: a for a in await self.containers.adoptable()}
        except DockerError as e:
            log.warning("cannot list containers to re-adopt (%s): the attempt is reported Lost", e)
            return None
        if record.container not in found:
            return None
        # Running or exited meanwhile: either way its wait() tells how it ends (or ended).
        return self._follow(record.container, adir.log)  # the follower resumes after the last line kept

    def _follow(self, cid: str, log_path: Path) -> _Container:
        follower = asyncio.create_task(self.containers.follow_logs(cid, log_path), name=f"logs:{cid[:12]}")
        return _Container(cid, follower)

    async def _pull_auth(self, msg: StartAttempt) -> RegistryAuth | None:
        if not msg.image_pull_secrets or self.grants is None:
            return None
        registry = _registry(msg.image or "")
        for name in msg.image_pull_secrets:
            try:
                secret: Secret = await (await self.grants.of(msg)).secrets.get(msg.namespace, name)
            except Exception:
                raise ValueError(f"imagePullSecrets: Secret {msg.namespace}/{name} cannot be read") from None
            auth = registry_auth(secret, registry)
            if auth is not None:
                return auth
        raise ValueError(f"imagePullSecrets: none of {msg.image_pull_secrets} has credentials for {registry}")


def _mount_points(launch: Launch) -> None:
    """The folder each mount under /nodus/inputs is bound on, made on the host: the inputs' own bind is
    read-only, so the engine could not make it inside the container (blocking)."""
    for m in launch.plan.mounts:
        if m.target.startswith(INPUTS_PATH + "/"):
            rest = m.target[len(INPUTS_PATH) + 1 :].strip("/").split("/")
            if ".." in rest:
                raise ValueError(f"mount path {m.target!r} climbs out of {INPUTS_PATH}")
            launch.dir.inputs.joinpath(*rest).mkdir(parents=True, exist_ok=True)


def container_name(msg: StartAttempt) -> str:
    return f"nodus-{msg.namespace}-{msg.attempt}"


def registry_auth(secret: Secret, registry: str) -> RegistryAuth | None:
    """Credentials for ``registry`` from a Secret holding ``.dockerconfigjson`` (Kubernetes'
    kubernetes.io/dockerconfigjson) or ``username``/``password`` keys."""
    data = {k: _b64(v) for k, v in secret.data.items()}
    if ".dockerconfigjson" in data:
        try:
            auths = json.loads(data[".dockerconfigjson"]).get("auths", {})
        except (ValueError, AttributeError):
            return None
        for server, entry in auths.items():
            host = server.removeprefix("https://").removeprefix("http://").split("/")[0]
            if host != registry:
                continue
            user, password = entry.get("username"), entry.get("password")
            if not user and entry.get("auth"):
                user, _, password = _b64(entry["auth"]).partition(":")
            if user:
                return RegistryAuth(username=user, password=password or "", server_address=server)
        return None
    if "username" in data and "password" in data:
        return RegistryAuth(username=data["username"], password=data["password"], server_address=registry)
    return None


def _registry(image: str) -> str:
    first = image.split("/")[0]
    return first if "/" in image and ("." in first or ":" in first or first == "localhost") else "docker.io"


def _b64(value: str) -> str:
    try:
        return base64.b64decode(value).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return ""


def _cpus(value: str | None) -> Decimal | None:
    if not value:
        return None
    try:
        return Decimal(value[:-1]) / 1000 if value.endswith("m") else Decimal(value)
    except InvalidOperation:
        raise ValueError(f"resources.cpu {value!r} is not a quantity of CPUs") from None


def _init(msg: StartAttempt) -> InitCommand | None:
    init = msg.init_command
    if init is None or not init.command:
        return None
    timeout = parse_duration(init.timeout).total_seconds() if init.timeout else INIT_TIMEOUT_S
    return InitCommand(command=tuple(init.command), timeout_s=timeout)


def _sidecar(s: object, env: dict[str, str]) -> Sidecar:
    from nodus_schema.jobs import Sidecar as SidecarSpec

    assert isinstance(s, SidecarSpec)
    own = {v.name: v.value or "" for v in s.env if v.name and v.value_from is None}
    return Sidecar(name=s.name or "sidecar", command=tuple(s.command), env={**env, **own}, image=s.image)


def _exit(e: ContainerExit) -> Exit:
    return Exit(code=e.code, oom_killed=e.oom_killed, lost=e.lost, message=e.message)
