"""Where an attempt's program runs: the runtime interface the runner drives, and the ``process`` runtime.

The runner (:mod:`nodus_agent.running`) decides *what* happens to an attempt (prepare, start, watch,
checkpoint, stop, finish, report); a runtime only knows *how* to start, wait for, signal and stop one
program on this host, and how to find it again after the agent restarts:

* ``process`` (here): a local process in its own session (a stop reaches everything it forked), for
  bare hosts and the local stack; the program sees the attempt directory's own paths and, on a GPU
  host, only the node's GPUs (``CUDA_VISIBLE_DEVICES``). It enforces no CPU or memory limit (that takes
  cgroups: use the docker runtime where a Job's limits must hold). An agent that restarts cannot wait
  for a process that is not its child, so it stops it and reports the attempt Lost.
  It has no mount namespace either, so a mount (ADR-0036) is a symbolic link: one under
  ``/nodus/inputs`` at ``$NODUS_INPUTS/<rest>``, any other at ``$NODUS_MOUNTS/<path without its leading
  />`` (``NODUS_MOUNTS`` is ``<attempt dir>/mounts``). The checkout of ``spec.source`` is ``NODUS_SRC``
  and the program's working directory unless ``workingDir`` says otherwise (an absolute one at or
  around a mount's path is taken under ``NODUS_MOUNTS``). A run with a ServiceAccount (ADR-0037) finds its
  token and CA in ``NODUS_SA_DIR`` (``<attempt dir>/serviceaccount``; ``NODUS_CA`` is its ``ca.crt``).
* ``docker`` (:mod:`nodus_agent.containers`): a container through the Docker Engine API, the attempt
  directories mounted at ``/nodus/...`` and each mount of the plan bound at its path; a restarted agent
  re-adopts the running container and reports its real exit code.
* ``simulate`` is the simulated fleet's (:mod:`nodus_agent.simulating`), which has no programs at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec

from nodus_agent import processes
from nodus_agent.attemptdir import AttemptDir, Record
from nodus_agent.identifying import Identity
from nodus_agent.mountplan import Mount, MountPlan
from nodus_schema.messages import StartAttempt

INPUTS_PATH = "/nodus/inputs"


@dataclass(frozen=True)
class Launch:
    """Everything a runtime needs to start one attempt's program."""

    msg: StartAttempt
    dir: AttemptDir
    argv: list[str]
    env: dict[str, str]
    """The whole environment of the program, secret values included (never logged)."""
    working_dir: str | None
    secret_files: dict[str, Path] = field(default_factory=dict)
    """Secret name -> the directory holding one file per key (mounted at /nodus/secrets/<name>)."""
    plan: MountPlan = field(default_factory=MountPlan)
    """The checkout of spec.source and the Volume mounts (ADR-0036), and the working directory they imply."""
    identity: Identity | None = None
    """The run's ServiceAccount folder and URL (ADR-0037; its token is in ``env``), or None."""


@dataclass(frozen=True)
class Exit:
    """How a program ended: ``code`` as a shell reports it (128 + N for a signal N)."""

    code: int | None
    oom_killed: bool = False
    lost: bool = False
    """The program vanished with no exit code to tell (container removed, engine gone): infrastructure."""
    message: str | None = None


class LaunchError(Exception):
    """The program could not start. ``reason`` is what the attempt reports: ``Error`` (the customer's:
    a missing command, an image that does not exist) or ``Lost`` (this host's: the engine is down)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Running(Protocol):
    """A started program, as its runtime knows it."""

    @property
    def ident(self) -> str: ...


class Runtime(Protocol):
    name: str

    def paths(self, adir: AttemptDir) -> dict[str, str]:
        """The env contract's paths as the program sees them (NODUS_INPUTS, ..., NODUS_SECRETS)."""
        ...

    async def launch(self, launch: Launch) -> Running:
        """Start the program (idempotent where the runtime can be); LaunchError if it cannot."""
        ...

    def remember(self, record: Record, running: Running) -> Record:
        """The record with what finds this program again after a restart (a pid, a container id)."""
        ...

    async def wait(self, running: Running) -> Exit: ...

    async def signal(self, running: Running, sig: signal.Signals) -> None:
        """Deliver ``sig`` to the program (the checkpoint contract's SIGUSR1); no error if it is gone."""
        ...

    async def stop(self, running: Running, grace_s: float) -> Exit:
        """SIGTERM, SIGKILL after ``grace_s``; how it ended."""
        ...

    async def release(self, running: Running) -> None:
        """After the exit: leave nothing behind (the process group's stragglers, the container)."""
        ...

    async def reattach(self, adir: AttemptDir, record: Record, grace_s: float) -> Running | None:
        """After an agent restart: the program of ``record`` if it still runs and can be watched again;
        None once it is gone (stopped here if it ran but cannot be watched)."""
        ...


# ---------------------------------------------------------------------------------------------------------
# process
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Process:
    proc: asyncio.subprocess.Process

    @property
    def ident(self) -> str:
        return str(self.proc.pid)


class ProcessRuntime:
    """Local processes (:mod:`nodus_agent.processes`): each program leads its own session."""

    name = "process"

    def __init__(self, cwd: Path, gpu_ids: tuple[str, ...] | None = None) -> None:
        """``gpu_ids``: the GPUs this node offers (CUDA_VISIBLE_DEVICES); None on a fake inventory, where
        the variable is left as the agent has it."""
        self.cwd = cwd
        self.gpu_ids = gpu_ids

    def paths(self, adir: AttemptDir) -> dict[str, str]:
        return {
            "NODUS_REPORT": str(adir.report),
            "NODUS_OUTPUTS": str(adir.outputs),
            "NODUS_STATE": str(adir.state),
            "NODUS_INPUTS": str(adir.inputs),
            "NODUS_SECRETS": str(adir.secrets),
        }

    async def launch(self, launch: Launch) -> Running:
        if launch.msg.image and not launch.msg.command:
            raise LaunchError(
                "Lost", "the process runtime runs spec.command; this host has no container runtime"
            )
        if not launch.argv:
            raise LaunchError("Error", "spec.command is empty: the process runtime needs a command")
        try:
            links = await asyncio.to_thread(link_mounts, launch.dir, launch.plan)
        except (OSError, ValueError) as e:
            raise LaunchError("Lost", f"could not link the mounts into {launch.dir.root}: {e}") from None
        cwd = self._cwd(launch, links)
        env = {**launch.env, **mount_env(launch.dir, launch.plan, links)}
        if launch.identity is not None:  # the folder where it is: a local process has no /nodus
            env.update(launch.identity.env(str(launch.identity.folder)))
        if self.gpu_ids is not None:
            # The GPUs the node offers, by UUID (stable where indexes are not: CUDA may order them by
            # speed); "" hides every GPU from a node that offers none.
            env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(self.gpu_ids)}
        try:
            proc = await processes.spawn(launch.argv, env, Path(cwd), launch.dir.log)
        except OSError as e:
            # The customer's command (a typo, a missing working directory): an Error, counted against
            # backoffLimit as Kubernetes counts a container that fails to start.
            raise LaunchError("Error", f"could not start {launch.argv[0]!r}: {e}") from None
        return _Process(proc)

    def _cwd(self, launch: Launch, links: dict[str, Path]) -> Path:
        """``workingDir`` (relative to the runtime's folder, or an absolute path on the host), unless it is
        at or around a mount's path: then where that is linked. Without one, the checkout if any."""
        wanted = launch.working_dir
        if wanted is None:
            return launch.plan.source_host or self.cwd
        if wanted.startswith("/"):
            clean = posixpath.normpath(wanted)
            for target in links:
                if clean == target or clean.startswith(target + "/") or target.startswith(clean + "/"):
                    return launch.dir.mounts / clean.lstrip("/")
        return self.cwd / wanted

    def remember(self, record: Record, running: Running) -> Record:
        assert isinstance(running, _Process)
        pid = running.proc.pid
        return _replace(record, pid=pid, pid_start_ticks=processes.start_ticks(pid))

    async def wait(self, running: Running) -> Exit:
        assert isinstance(running, _Process)
        return Exit(processes.exit_code(await running.proc.wait()))

    async def signal(self, running: Running, sig: signal.Signals) -> None:
        assert isinstance(running, _Process)
        # The main process only (docs/checkpoints.md): its children (data loader workers) may not handle
        # SIGUSR1, whose default action ends a process.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(running.proc.pid, sig)

    async def stop(self, running: Running, grace_s: float) -> Exit:
        assert isinstance(running, _Process)
        return Exit(processes.exit_code(await processes.terminate(running.proc, grace_s)))

    async def release(self, running: Running) -> None:
        assert isinstance(running, _Process)
        processes.sweep_group(running.proc.pid)

    async def reattach(self, adir: AttemptDir, record: Record, grace_s: float) -> Running | None:
        # Not our child: no exit code could ever be read. Stop it; the attempt is reported Lost and the
        # scheduler's replacement resumes from the checkpoint sooner than waiting for an orphan would.
        if record.pid is not None:
            await processes.terminate_pid(record.pid, record.pid_start_ticks, grace_s)
        return None


def link_path(adir: AttemptDir, target: str) -> Path:
    """Where the process runtime links a mount of ``target``: under the attempt's inputs for
    ``/nodus/inputs/...``, else under its ``mounts/`` folder; ValueError for a path that climbs."""
    clean = posixpath.normpath(target)
    if not clean.startswith("/") or clean == "/" or ".." in clean.split("/") or clean != target.rstrip("/"):
        raise ValueError(f"mount path {target!r} must be absolute and normalised")
    if clean.startswith(INPUTS_PATH + "/"):
        return adir.inputs.joinpath(*clean[len(INPUTS_PATH) + 1 :].split("/"))
    return adir.mounts.joinpath(*clean.lstrip("/").split("/"))


def link_mounts(adir: AttemptDir, plan: MountPlan) -> dict[str, Path]:
    """A link per mount (blocking; again from scratch for a relaunch): program path -> the link."""
    links: dict[str, Path] = {}
    for mount in plan.mounts:
        link = link_path(adir, mount.target)
        _link(link, mount)
        links[posixpath.normpath(mount.target)] = link
    return links


def _link(link: Path, mount: Mount) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        # An empty mount point (the docker runtime's kind) gives way; anything else is data to keep.
        if any(link.iterdir()):
            raise ValueError(f"{link} exists and is not empty: it cannot stand for the mount {mount.target}")
        shutil.rmtree(link)
    link.symlink_to(mount.host, target_is_directory=True)


def mount_env(adir: AttemptDir, plan: MountPlan, links: dict[str, Path]) -> dict[str, str]:
    """``NODUS_MOUNTS`` when some mount lies outside /nodus/inputs, ``NODUS_SRC`` with a checkout."""
    env: dict[str, str] = {}
    if any(link.is_relative_to(adir.mounts) for link in links.values()):
        env["NODUS_MOUNTS"] = str(adir.mounts)
    if plan.source_host is not None:
        env["NODUS_SRC"] = str(plan.source_host)
    return env


def _replace(record: Record, **changes: object) -> Record:
    return msgspec.structs.replace(record, **changes)
