"""The env contract of a gang member (ADR-0016, docs/gangs.md): NODUS_* for every launcher, and each
launcher's own variables, from the gang fields of a StartAttempt."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from nodus_agent.attemptdir import AttemptDir
from nodus_agent.envcontract import build_env, gang_env
from nodus_agent.settings import AgentSettings
from nodus_schema.jobs import EnvVar
from nodus_schema.messages import StartAttempt


def member(node_rank: int, launcher: str, *, nodes: int = 2, per_node: int = 8) -> StartAttempt:
    """What the scheduler sends member ``node_rank`` of a gang of ``nodes`` x ``per_node`` GPUs."""
    return StartAttempt(
        namespace="t",
        job="train",
        attempt=f"train-0123abcd-0-a1-m{node_rank}",
        index=0,
        attempt_no=1,
        node=f"n{node_rank}",
        command=["python", "train.py"],
        gang="train-0123abcd-0-a1",
        node_rank=node_rank,
        nodes=nodes,
        gpus_per_node=per_node,
        rank=node_rank * per_node,
        world_size=nodes * per_node,
        master_addr="n0",
        master_port=6379 if launcher in ("Ray", "Verl") else 29500,
        launcher=launcher,
    )


def test_a_plain_run_gets_no_gang_variables() -> None:
    plain = StartAttempt(namespace="t", job="j", attempt="j-1-0-a1", index=0, attempt_no=1, node="n0")
    assert gang_env(plain) == {}


def test_every_launcher_gets_the_nodus_contract_counted_in_members() -> None:
    for launcher in ("Plain", "Torchrun", "Ray", "Verl", "Accelerate", "Deepspeed"):
        env = gang_env(member(1, launcher))
        assert {k: v for k, v in env.items() if k.startswith("NODUS_") and k != "NODUS_RAY_ROLE"} == {
            "NODUS_GANG": "train-0123abcd-0-a1",
            "NODUS_RANK": "1",
            "NODUS_WORLD_SIZE": "2",
            "NODUS_GPUS_PER_NODE": "8",
            "NODUS_MASTER_ADDR": "n0",
            "NODUS_MASTER_PORT": "6379" if launcher in ("Ray", "Verl") else "29500",
            "NODUS_LAUNCHER": launcher,
        }


def test_plain_is_the_contract_only() -> None:
    assert all(k.startswith("NODUS_") for k in gang_env(member(0, "Plain")))


def test_torchrun_gets_torch_variables_and_its_own_defaults() -> None:
    env = gang_env(member(1, "Torchrun"))
    assert {k: env[k] for k in env if not k.startswith("NODUS_")} == {
        "MASTER_ADDR": "n0",
        "MASTER_PORT": "29500",
        "NNODES": "2",
        "NODE_RANK": "1",
        "NPROC_PER_NODE": "8",
        "LOCAL_WORLD_SIZE": "8",
        "WORLD_SIZE": "16",  # processes: nodes x GPUs per node
        "RANK": "8",  # the global rank of this node's first process
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "8",
        "PET_MASTER_ADDR": "n0",
        "PET_MASTER_PORT": "29500",
    }


def test_deepspeed_gets_the_torch_variables() -> None:
    env = gang_env(member(1, "Deepspeed"))
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"]) == (
        "n0",
        "29500",
        "16",
        "8",
    )
    assert (env["NNODES"], env["NODE_RANK"], env["LOCAL_WORLD_SIZE"]) == ("2", "1", "8")
    assert not any(k.startswith("PET_") for k in env)


def test_accelerate_gets_its_launch_options() -> None:
    env = gang_env(member(1, "Accelerate"))
    assert {k: env[k] for k in env if not k.startswith("NODUS_")} == {
        "MAIN_PROCESS_IP": "n0",
        "MAIN_PROCESS_PORT": "29500",
        "MACHINE_RANK": "1",
        "NUM_MACHINES": "2",
        "NUM_PROCESSES": "16",
        "MASTER_ADDR": "n0",
        "MASTER_PORT": "29500",
    }


@pytest.mark.parametrize("launcher", ["Ray", "Verl"])
def test_ray_and_verl_get_the_head_address_and_a_role(launcher: str) -> None:
    head, worker = gang_env(member(0, launcher)), gang_env(member(1, launcher))
    assert head["RAY_ADDRESS"] == worker["RAY_ADDRESS"] == "n0:6379"
    assert (head["NODUS_RAY_ROLE"], worker["NODUS_RAY_ROLE"]) == ("head", "worker")
    assert "MASTER_ADDR" not in worker and "WORLD_SIZE" not in worker
    if launcher == "Verl":
        assert (worker["NNODES"], worker["N_GPUS_PER_NODE"]) == ("2", "8")
    else:
        assert "NNODES" not in worker


def test_the_gang_variables_win_over_the_jobs_env(tmp_path: Path) -> None:
    settings = AgentSettings.from_env({"NODUS_AGENT_NODE": "n1", "NODUS_AGENT_WORKDIR": str(tmp_path)})
    start = msgspec.structs.replace(
        member(1, "Torchrun"),
        env=[EnvVar(name="MASTER_ADDR", value="elsewhere"), EnvVar(name="LR", value="0.1")],
    )
    env = build_env(start, AttemptDir(tmp_path, "t", start.attempt), settings)
    assert (env["MASTER_ADDR"], env["RANK"], env["NODUS_RANK"], env["LR"]) == ("n0", "8", "1", "0.1")
    assert env["NODUS_ATTEMPT"] == start.attempt and env["NODUS_INDEX"] == "0"


def test_the_process_runtime_refuses_egress_it_cannot_enforce() -> None:
    """A local process runs on the host's network: a Job that asks for none is refused (Lost: a node with
    the docker runtime can run it), never run with the network on."""
    from nodus_agent.envcontract import NO_EGRESS_DENY, refusal
    from nodus_schema.jobs import Egress, Network

    msg = StartAttempt(namespace="ns", job="j", attempt="a", index=0, attempt_no=1, node="n", command=["x"])
    deny = msgspec.structs.replace(msg, network=Network(egress=Egress(policy="Deny")))
    assert refusal(deny, "process") == NO_EGRESS_DENY
    assert refusal(msgspec.structs.replace(deny, image="busybox"), "docker") is None
    assert (
        refusal(msgspec.structs.replace(msg, network=Network(egress=Egress(policy="Open"))), "process")
        is None
    )
