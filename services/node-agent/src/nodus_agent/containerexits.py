"""How an attempt's containers ended, in the runner's terms: exits, verdicts and failed launches.

The runtime (:mod:`nodus_agent.containers`) reports a :class:`ContainerExit` or raises
:class:`LaunchFailed`; :func:`classify` says what the runner reports and who the end counts against (the
customer's ``backoffLimit`` or the infrastructure's ``recovery.maxAttempts``). Separate from the runtime:
these rules are pure, and the runner reads them without driving any container.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from nodus_agent import processes
from nodus_agent.dockerapi import DockerError, EngineUnavailable

SIGKILL_EXIT: Final = 137  # 128 + SIGKILL: what the OOM killer (and a stop past its grace) leaves


@dataclass(frozen=True)
class ContainerExit:
    """How the main container ended. ``code`` None and ``lost`` True when that cannot be known."""

    code: int | None
    oom_killed: bool = False
    lost: bool = False
    message: str | None = None


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
CUSTOMER_PULL: Final = ("not found", "manifest unknown", "unauthorized", "denied", "invalid reference")
# (With an init process as PID 1 a missing program is an exit code and a log line instead.)
CUSTOMER_START: Final = ('exec: "', "executable file", "not found in $path", "exec format error", "chdir")


def launch_failure(error: DockerError, what: str, customer_hints: Sequence[str], fix: str) -> LaunchFailed:
    """The engine's error in a launch step as a :class:`LaunchFailed`: the customer's (Error, with
    ``fix``) when its message carries one of ``customer_hints``, else the node's (Lost)."""
    if isinstance(error, EngineUnavailable):
        return LaunchFailed("Lost", f"{what}: {error.message}")
    text = error.message.lower()
    if any(hint in text for hint in customer_hints):
        return LaunchFailed("Error", f"{what}: {error.message}; {fix}")
    return LaunchFailed("Lost", f"{what}: {error.message}")


def oom_message(limit: int, reported: bool) -> str:
    """What the user is told about an OOM kill; ``reported`` False when it was only inferred."""
    size = f"its memory limit of {_mib(limit)}" if limit else "the node's memory"
    evidence = "" if reported else " (the engine reported SIGKILL, exit code 137, under a memory limit)"
    return f"the program ran out of memory: it was killed for exceeding {size}{evidence}"


def _mib(n: int) -> str:
    return f"{n // 1024**2}Mi" if n % 1024**2 == 0 else f"{n} bytes"
