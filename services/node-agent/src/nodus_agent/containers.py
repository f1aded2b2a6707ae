"""The container runtime of the node agent: an attempt as containers of a Docker Engine API (ADR-0018).

The runner hands :meth:`ContainerRuntime.launch` a :class:`~nodus_agent.containerspec.ContainerSpec` and
gets a container id back; :meth:`~ContainerRuntime.wait` returns how it ended,
:meth:`~ContainerRuntime.follow_logs` copies its output into the attempt's log file,
:meth:`~ContainerRuntime.stop`, :meth:`~ContainerRuntime.signal` and :meth:`~ContainerRuntime.remove` end
it, and :meth:`~ContainerRuntime.adoptable` lists what an earlier agent on this node left running.

What an attempt's containers are (init, sidecars, main; their labels) is :mod:`nodus_agent.containerspec`,
what the engine is sent :mod:`nodus_agent.containerbodies`, how they end :mod:`nodus_agent.containerexits`
and their log file :mod:`nodus_agent.containerlogs`; this module drives the engine. Names are
deterministic and every step looks at what exists before it acts, so a launch is idempotent and safe to
kill at any line: an agent that restarts (or a duplicate StartAttempt) adopts the containers it finds
(starting one that was only created) rather than failing on the name or running the program twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodus_agent import containerlogs, processes
from nodus_agent.configuring import Ulimit
from nodus_agent.containerbodies import create_body
from nodus_agent.containerexits import (
    CUSTOMER_PULL,
    CUSTOMER_START,
    SIGKILL_EXIT,
    ContainerExit,
    LaunchFailed,
    launch_failure,
    oom_message,
)
from nodus_agent.containerlogs import LOG_TAIL_LINES
from nodus_agent.containerspec import (
    INIT,
    LABEL_ATTEMPT,
    LABEL_NAMESPACE,
    LABEL_NODE,
    LABEL_ROLE,
    MAIN,
    SIDECAR,
    ContainerSpec,
    InitCommand,
    Role,
    egress_warning,
    init_name,
    sidecar_name,
)
from nodus_agent.dockerapi import Conflict, DockerAPI, DockerError, EngineUnavailable, NotFound
from nodus_kit.backingoff import Backoff

log = logging.getLogger(__name__)


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
            raise launch_failure(e, f"launching {spec.name}", (), "") from e

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
            raise launch_failure(
                e, f"{what} could not start", CUSTOMER_START, "check the command and working directory"
            ) from e

    async def _ensure_images(self, spec: ContainerSpec) -> None:
        """Pull what is missing (IfNotPresent: pin a digest or a fresh tag to get a new image)."""
        for image in dict.fromkeys([spec.image, *(s.image for s in spec.sidecars if s.image)]):
            if await self.api.image_exists(image):
                continue
            try:
                await self.api.pull(image, spec.pull_auth, timeout_s=self.pull_timeout_s)
            except DockerError as e:
                raise launch_failure(
                    e, f"could not pull {image}", CUSTOMER_PULL, "check the image name and imagePullSecrets"
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
            return ContainerExit(code, oom_killed=True, message=oom_message(limit, reported=True))
        # podman (cgroup v1 here) never reports OOMKilled: a SIGKILL nobody here sent, under a memory
        # limit, is taken for the OOM killer's.
        if code == SIGKILL_EXIT and limit and cid not in self._stopped:
            return ContainerExit(code, oom_killed=True, message=oom_message(limit, reported=False))
        return ContainerExit(code, message=error)

    async def _engine_back(self) -> bool:
        """Is the engine answering again within ``engine_grace_s``? (Polled: nothing else tells.)"""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.engine_grace_s
        pauses = Backoff(base=0.1, cap=2.0).pauses()
        while loop.time() < end:
            if await self.api.ping():
                return True
            await asyncio.sleep(min(next(pauses), max(end - loop.time(), 0.0)))
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
        """Append the container's output to ``path`` until it exits, then reconcile the file with the
        engine's log (:func:`nodus_agent.containerlogs.follow`); raises EngineUnavailable if the engine
        stays away longer than ``engine_grace_s``."""
        await containerlogs.follow(self.api, cid, path, self._engine_back)

    async def log_tail(self, cid: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of a container's output, for the message of a failure ("" if none)."""
        return await containerlogs.tail(self.api, cid, lines)


def _seconds_since(stamp: str | None) -> float:
    if not stamp or stamp.startswith("0001-"):
        return 0.0
    try:
        when = dt.datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", stamp).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, time.time() - when.timestamp())
