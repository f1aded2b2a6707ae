"""The env contract of a running program (design brief), for the local-process runner.

What the program sees, from weakest to strongest (a later layer wins):

1. a minimal base from the agent's own environment: ``PATH``, ``HOME``, ``LANG`` (nothing else leaks:
   the agent's NATS URL or credentials are not the program's business);
2. the job's ``env`` list, literal values only. This is where ``NODUS_PARAM_<NAME>`` arrives: the sweep
   controller writes a cell's parameters into its Job's env;
3. the contract itself, which a job cannot override: ``NODUS_JOB``, ``NODUS_NAMESPACE``,
   ``NODUS_ATTEMPT``, ``NODUS_INDEX`` and ``JOB_COMPLETION_INDEX`` (the same number, the second for
   programs written for Kubernetes Indexed Jobs), ``NODUS_REPORT``, ``NODUS_OUTPUTS``, ``NODUS_STATE``,
   ``NODUS_INPUTS``, ``NODUS_NODE`` and ``NODUS_OFFERING``.

Paths: a local process gets the attempt directory's own ``outputs/``, ``state/`` and ``inputs/``; the
container runtime will mount those same directories at ``/nodus/outputs``, ``/nodus/state`` and
``/nodus/inputs`` and set the variables to those paths, so a program that reads the variables runs
unchanged under both.
"""

from __future__ import annotations

import os

from nodus_agent.attemptdir import AttemptDir
from nodus_agent.settings import AgentSettings
from nodus_schema.messages import StartAttempt

BASE = ("PATH", "HOME", "LANG")

NO_COMMAND = "a local-process runner needs spec.command; images come with the container runtime"


def refusal(msg: StartAttempt) -> str | None:
    """Why this runner cannot run the attempt at all (reported as Lost: another runtime could), or None."""
    if not msg.command:
        return NO_COMMAND
    for var in msg.env:
        if var.value_from is not None:
            return (
                f"env {var.name}: valueFrom (secret references) is not supported by the node agent yet; "
                "use a literal value"
            )
    return None


def build_env(msg: StartAttempt, adir: AttemptDir, settings: AgentSettings) -> dict[str, str]:
    env = {k: os.environ[k] for k in BASE if k in os.environ}
    env.setdefault("PATH", os.defpath)
    for var in msg.env:
        if var.name:
            env[var.name] = var.value or ""  # Kubernetes: a variable without a value is the empty string
    index = str(msg.index)
    env.update(
        NODUS_JOB=msg.job,
        NODUS_NAMESPACE=msg.namespace,
        NODUS_ATTEMPT=msg.attempt,
        NODUS_INDEX=index,
        JOB_COMPLETION_INDEX=index,
        NODUS_REPORT=str(adir.report),
        NODUS_OUTPUTS=str(adir.outputs),
        NODUS_STATE=str(adir.state),
        NODUS_INPUTS=str(adir.inputs),
        NODUS_NODE=settings.node,
        NODUS_OFFERING=settings.offering,
    )
    return env


def argv(msg: StartAttempt) -> list[str]:
    return [*msg.command, *msg.args]
