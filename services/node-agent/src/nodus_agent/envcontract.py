"""The env contract of a running program (design brief), for every runtime.

What the program sees, from weakest to strongest (a later layer wins):

1. a minimal base from the agent's own environment: ``PATH``, ``HOME``, ``LANG`` (nothing else leaks:
   the agent's NATS URL or credentials are not the program's business);
2. the job's ``env`` list: literal values here, ``valueFrom.secretKeyRef`` values added by the runner
   (:mod:`nodus_agent.secrets`). This is where ``NODUS_PARAM_<NAME>`` arrives: the sweep controller
   writes a cell's parameters into its Job's env;
3. the contract itself, which a job cannot override: ``NODUS_JOB``, ``NODUS_NAMESPACE``,
   ``NODUS_ATTEMPT``, ``NODUS_INDEX`` and ``JOB_COMPLETION_INDEX`` (the same number, the second for
   programs written for Kubernetes Indexed Jobs), ``NODUS_REPORT``, ``NODUS_OUTPUTS``, ``NODUS_STATE``,
   ``NODUS_INPUTS``, ``NODUS_NODE`` and ``NODUS_OFFERING``; and for a member of a gang (a distributed
   Job, ADR-0016) :func:`gang_env`: ``NODUS_RANK``, ``NODUS_WORLD_SIZE``, ``NODUS_MASTER_ADDR``, ... and the
   usual variables of its launcher (``MASTER_ADDR``, ``WORLD_SIZE``, ``RANK``, ...; the table is in
   ``docs/gangs.md``).

Paths: a local process gets the attempt directory's own ``outputs/``, ``state/`` and ``inputs/``; the
container runtime will mount those same directories at ``/nodus/outputs``, ``/nodus/state`` and
``/nodus/inputs`` and set the variables to those paths, so a program that reads the variables runs
unchanged under both.

Code and data (ADR-0036), set by the runtime from the run's mount plan:

* ``NODUS_SRC``: the checkout of ``spec.source`` (git or an uploaded blob) where the program sees it: its
  path in a container (``/nodus/src``, or ``git.path``/``workingDir``), the attempt's ``src/`` folder for
  a local process. It is the working directory unless ``workingDir`` is set.
* ``NODUS_MOUNTS`` (process runtime only, which has no mount namespace): a folder where each mount
  outside ``/nodus/inputs`` is a link at its path without the leading ``/`` (a Volume at ``/data/x`` is
  ``$NODUS_MOUNTS/data/x``); a Volume or Workspace input is a link at ``$NODUS_INPUTS/<name>`` as in a
  container. A container sees every mount at its own path and gets no ``NODUS_MOUNTS``.

A Job with ``spec.serviceAccountName`` (ADR-0037, :mod:`nodus_agent.identifying`) also gets
``NODUS_TOKEN`` (with the secret values: masked in its logs), and from the runtime ``NODUS_URL``,
``NODUS_SA_DIR`` (``/nodus/serviceaccount`` in a container) and ``NODUS_CA`` (its ``ca.crt``, when the
gateway's certificate needs one): what the ``nodus`` CLI and the SDK read, with the project from
``NODUS_NAMESPACE``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from nodus_agent.attemptdir import AttemptDir
from nodus_agent.settings import AgentSettings
from nodus_schema.messages import StartAttempt

BASE = ("PATH", "HOME", "LANG")

RAY_LAUNCHERS: Final = ("Ray", "Verl")

NO_COMMAND = "a local-process runner needs spec.command; images come with the container runtime"
NO_IMAGE = "the container runtime needs spec.image"


NO_EGRESS_DENY = (
    "network.egress.policy Deny: a local process runs on the host's network, which this node's process "
    "runtime cannot cut off; run the Job on a node with the docker runtime, or use policy Open"
)


def refusal(msg: StartAttempt, runtime: str = "process") -> str | None:
    """Why this agent's runtime cannot run the attempt at all (reported as Lost: another node's runtime
    could), or None."""
    if runtime == "process" and not msg.command:
        return NO_COMMAND
    egress = msg.network.egress if msg.network is not None else None
    if runtime == "process" and egress is not None and egress.policy == "Deny":
        return NO_EGRESS_DENY
    if runtime == "docker" and not msg.image:
        return NO_IMAGE
    return None


def build_env(
    msg: StartAttempt, adir: AttemptDir, settings: AgentSettings, paths: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The program's environment (secret values are added by the runner). ``paths``: the contract's
    paths as the runtime shows them to the program (a container's /nodus/...); the attempt directory's
    own folders by default (a local process)."""
    env = {k: os.environ[k] for k in BASE if k in os.environ}
    env.setdefault("PATH", os.defpath)
    for var in msg.env:
        if var.name and var.value_from is None:
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
    if paths:
        env.update(paths)
    env.update(gang_env(msg))
    return env


def gang_env(msg: StartAttempt) -> dict[str, str]:
    """The variables of a gang member (none for a plain run): the env contract's ``NODUS_*`` for every
    launcher, counted in members (one program per node), and the launcher's own, counted in processes
    (one per GPU) where the launcher counts so.

    | launcher | variables (besides ``NODUS_*``) |
    |---|---|
    | Plain | none |
    | Torchrun | ``MASTER_ADDR``, ``MASTER_PORT``, ``NNODES``, ``NODE_RANK``, ``NPROC_PER_NODE``,
      ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``, ``RANK``, and ``PET_NNODES``, ``PET_NODE_RANK``,
      ``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` (torchrun's own defaults) |
    | Deepspeed | ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``NNODES``, ``NODE_RANK``,
      ``NPROC_PER_NODE``, ``LOCAL_WORLD_SIZE`` |
    | Accelerate | ``MAIN_PROCESS_IP``, ``MAIN_PROCESS_PORT``, ``MACHINE_RANK``, ``NUM_MACHINES``,
      ``NUM_PROCESSES``, ``MASTER_ADDR``, ``MASTER_PORT`` |
    | Ray | ``RAY_ADDRESS`` (``<master>:<port>``), ``NODUS_RAY_ROLE`` (``head`` on rank 0, else ``worker``) |
    | Verl | Ray's, and ``NNODES``, ``N_GPUS_PER_NODE`` (``trainer.nnodes``, ``trainer.n_gpus_per_node``) |
    """
    if msg.node_rank is None or msg.nodes is None:
        return {}
    node_rank, nodes = msg.node_rank, msg.nodes
    per_node = msg.gpus_per_node or 1
    rank = msg.rank if msg.rank is not None else node_rank * per_node
    world = msg.world_size if msg.world_size is not None else nodes * per_node
    addr = msg.master_addr or ""
    port = str(msg.master_port) if msg.master_port is not None else ""
    launcher = msg.launcher or "Plain"
    env = {
        "NODUS_GANG": msg.gang or "",
        "NODUS_RANK": str(node_rank),
        "NODUS_WORLD_SIZE": str(nodes),
        "NODUS_GPUS_PER_NODE": str(per_node),
        "NODUS_MASTER_ADDR": addr,
        "NODUS_MASTER_PORT": port,
        "NODUS_LAUNCHER": launcher,
    }
    torch = {
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        "NNODES": str(nodes),
        "NODE_RANK": str(node_rank),
        "NPROC_PER_NODE": str(per_node),
        "LOCAL_WORLD_SIZE": str(per_node),
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
    }
    if launcher == "Torchrun":
        env.update(torch)
        # torchrun reads every option it is not given from PET_<OPTION>: a bare `torchrun train.py` joins.
        env.update(
            PET_NNODES=str(nodes),
            PET_NODE_RANK=str(node_rank),
            PET_NPROC_PER_NODE=str(per_node),
            PET_MASTER_ADDR=addr,
            PET_MASTER_PORT=port,
        )
    elif launcher == "Deepspeed":
        env.update(torch)
    elif launcher == "Accelerate":
        env.update(
            MAIN_PROCESS_IP=addr,
            MAIN_PROCESS_PORT=port,
            MACHINE_RANK=str(node_rank),
            NUM_MACHINES=str(nodes),
            NUM_PROCESSES=str(world),
            MASTER_ADDR=addr,
            MASTER_PORT=port,
        )
    elif launcher in RAY_LAUNCHERS:
        env.update(RAY_ADDRESS=f"{addr}:{port}", NODUS_RAY_ROLE="head" if node_rank == 0 else "worker")
        if launcher == "Verl":
            env.update(NNODES=str(nodes), N_GPUS_PER_NODE=str(per_node))
    return env


def argv(msg: StartAttempt) -> list[str]:
    return [*msg.command, *msg.args]
