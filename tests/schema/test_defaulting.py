"""Defaulting: every default, every write-time normalisation, new objects, idempotence."""

from __future__ import annotations

import msgspec
import pytest

from nodus_schema.defaulting import default_job, default_job_spec, default_sweep
from nodus_schema.examples import full_job, full_sweep, minimal_job, minimal_sweep
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import (
    CheckpointPolicy,
    Distributed,
    Egress,
    InitCommand,
    JobInput,
    JobOutput,
    JobSpec,
    Network,
    OutputInput,
    OutputSink,
    Recovery,
    Resources,
    SecretMount,
)
from nodus_schema.validating import validate_job


def _wire(obj: object) -> dict[str, object]:
    return msgspec.to_builtins(obj)  # type: ignore[no-any-return]


def _get(obj: object, path: str) -> object:
    """Read a wire path (``spec.placement.queueTimeout``) from the JSON form of ``obj``."""
    value: object = _wire(obj)
    for part in path.split("."):
        assert isinstance(value, dict), f"{path}: {part} is not under an object"
        value = value.get(part)
    return value


JOB_DEFAULTS = [
    ("spec.completions", 1),
    ("spec.parallelism", 1),
    ("spec.backoffLimit", 6),
    ("spec.state", "Running"),
    ("spec.resources.gpu", {"count": 1, "interconnect": "Any", "type": ["H100"]}),
    ("spec.placement.queueTimeout", "24h"),
    ("spec.placement.interruptible", "Never"),
    ("spec.placement.profile", "Balanced"),
    ("spec.recovery.continuity", "Checkpointed"),
    ("spec.recovery.maxAttempts", 3),
    ("spec.recovery.minProgressDuration", "2m"),
    ("spec.recovery.onInterruption", "Resume"),
    ("spec.recovery.checkpoint.format", "Snapshot"),
    ("spec.recovery.checkpoint.integration", "Auto"),
    ("spec.recovery.checkpoint.interval", "auto"),
    ("spec.recovery.checkpoint.maxSize", "1Ti"),
    ("spec.recovery.checkpoint.paths", ["/nodus/state"]),
    ("spec.recovery.checkpoint.retainAfterFinish", "168h"),
    ("spec.network.egress.policy", "Open"),
    # Left unset on purpose:
    ("spec.timeout", None),
    ("spec.ttlSecondsAfterFinished", None),
    ("spec.scaledownWindow", None),
    ("spec.maxCostUSD", None),
    ("spec.distributed", None),
]


@pytest.mark.parametrize(("path", "value"), JOB_DEFAULTS, ids=[p for p, _ in JOB_DEFAULTS])
def test_job_defaults(path: str, value: object) -> None:
    assert _get(default_job(minimal_job()), path) == value


GANG_DEFAULTS = [
    ("spec.distributed.startupTimeout", "15m"),
    ("spec.distributed.maxAssemblyRetries", 2),
    ("spec.distributed.launcher", "Plain"),
    ("spec.distributed.network", "Colocated"),
    ("spec.distributed.transport", "Direct"),
    ("spec.distributed.gpusPerNode", 8),
    ("spec.recovery.checkpoint.format", "Dcp"),
]


@pytest.mark.parametrize(("path", "value"), GANG_DEFAULTS, ids=[p for p, _ in GANG_DEFAULTS])
def test_gang_defaults(path: str, value: object) -> None:
    job = minimal_job()
    job.spec.resources = Resources(gpu="H100:8")
    job.spec.distributed = Distributed(nodes=2)
    assert _get(default_job(job), path) == value


def test_part_defaults() -> None:
    spec = JobSpec(
        image="i",
        outputs=[JobOutput(name="m", path="/m", sink=OutputSink(connection="pg", table="t"))],
        inputs=[JobInput(name="t", output=OutputInput(job="prep", name="tok"))],
        init_command=InitCommand(command=["true"]),
    )
    d = default_job_spec(spec)
    assert d.outputs[0].from_ranks == "Zero"
    assert d.outputs[0].sink is not None
    assert d.outputs[0].sink.mode == "Append"
    assert d.inputs[0].output is not None
    assert d.inputs[0].output.index == 0
    assert d.init_command is not None
    assert d.init_command.timeout == "30m"


def test_sweep_defaults() -> None:
    s = default_sweep(minimal_sweep())
    assert (s.spec.max_parallel, s.spec.repetitions, s.spec.state) == (4, 1, "Running")
    assert s.spec.template.kind == "Job"
    assert s.spec.template.spec.state is None, "cells follow the Sweep's state; the template keeps none"
    assert s.spec.template.spec.completions == 1


def test_user_values_are_kept() -> None:
    job = full_job()
    d = default_job(job)
    assert d.spec.recovery is not None
    assert d.spec.recovery.max_attempts == 5
    assert d.spec.recovery.checkpoint is not None
    assert d.spec.recovery.checkpoint.interval == "30m"
    assert d.spec.placement is not None
    assert d.spec.placement.interruptible == "Allow"
    assert d.spec.distributed is not None
    assert d.spec.distributed.launcher == "Torchrun"


# ---------------------------------------------------------------------------------------------------------
# New objects, idempotence
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [minimal_job, full_job], ids=["minimal", "full"])
def test_job_defaulting_is_idempotent_and_pure(build: object) -> None:
    assert callable(build)
    job = build()
    once = default_job(job)
    assert default_job(once) == once
    assert job == build(), "the input must not change"
    assert once is not job
    assert once.spec is not job.spec
    once.spec.command.append("--more")
    assert once.spec.resources is not None
    once.spec.resources.cpu = "64"
    assert job == build(), "the output shares nothing mutable with the input"


@pytest.mark.parametrize("build", [minimal_sweep, full_sweep], ids=["minimal", "full"])
def test_sweep_defaulting_is_idempotent_and_pure(build: object) -> None:
    assert callable(build)
    sweep = build()
    once = default_sweep(sweep)
    assert default_sweep(once) == once
    assert sweep == build()


# ---------------------------------------------------------------------------------------------------------
# Normalisations
# ---------------------------------------------------------------------------------------------------------


def test_active_deadline_seconds_folds_into_timeout() -> None:
    job = minimal_job()
    job.spec.active_deadline_seconds = 5400
    d = default_job(job)
    assert (d.spec.timeout, d.spec.active_deadline_seconds) == ("1h30m0s", None)


def test_active_deadline_seconds_that_agrees_is_dropped() -> None:
    job = minimal_job()
    job.spec.active_deadline_seconds, job.spec.timeout = 3600, "60m"
    d = default_job(job)
    assert (d.spec.timeout, d.spec.active_deadline_seconds) == ("60m", None)


def test_active_deadline_seconds_that_disagrees_stays_for_validation() -> None:
    job = minimal_job()
    job.spec.active_deadline_seconds, job.spec.timeout = 3600, "2h"
    d = default_job(job)
    assert (d.spec.timeout, d.spec.active_deadline_seconds) == ("2h", 3600)
    assert [e.field for e in validate_job(d)] == ["spec.activeDeadlineSeconds"]


def test_resources_nodes_moves_to_distributed() -> None:
    job = minimal_job()
    job.spec.resources = Resources(gpu="H100:4", nodes=2)
    d = default_job(job)
    assert d.spec.resources is not None
    assert d.spec.resources.nodes is None
    assert d.spec.distributed is not None
    assert (d.spec.distributed.nodes, d.spec.distributed.gpus_per_node) == (2, 4)
    assert d.spec.distributed.startup_timeout == "15m"


@pytest.mark.parametrize(
    ("nodes", "distributed"),
    [(12, None), (0, None), (3, Distributed(nodes=2)), (2, Distributed(total_gpus=16))],
    ids=["beyond beta cap", "zero", "conflicts with nodes", "conflicts with totalGPUs"],
)
def test_resources_nodes_that_is_invalid_stays_put(nodes: int, distributed: Distributed | None) -> None:
    job = minimal_job()
    job.spec.resources = Resources(gpu="H100:8", nodes=nodes)
    job.spec.distributed = distributed
    d = default_job(job)
    assert d.spec.resources is not None
    assert d.spec.resources.nodes == nodes
    assert "spec.resources.nodes" in {e.field for e in validate_job(d)}


def test_resources_nodes_one_is_kept() -> None:
    job = minimal_job()
    job.spec.resources = Resources(gpu="H100:1", nodes=1)
    d = default_job(job)
    assert d.spec.resources is not None
    assert d.spec.resources.nodes == 1
    assert d.spec.distributed is None


def test_bare_secret_names_become_secret_mounts() -> None:
    job = minimal_job()
    job.spec.secrets = ["hf", SecretMount(name="wandb", version=2), "Bad_Name"]
    d = default_job(job)
    assert d.spec.secrets == [SecretMount(name="hf"), SecretMount(name="wandb", version=2), "Bad_Name"]


def test_gpu_string_becomes_an_object_only_when_valid() -> None:
    job = minimal_job()
    job.spec.resources = Resources(gpu="H100,A100:2")
    d = default_job(job)
    assert d.spec.resources is not None
    assert d.spec.resources.gpu == GPURequest(type=["H100", "A100"], count=2, interconnect="Any")
    job.spec.resources = Resources(gpu="H100:3")
    d = default_job(job)
    assert d.spec.resources is not None
    assert d.spec.resources.gpu == "H100:3"
    assert [e.field for e in validate_job(d)] == ["spec.resources.gpu"]


def test_gpus_per_node_is_not_filled_against_the_user() -> None:
    job = minimal_job()
    job.spec.resources = Resources(gpu="H100:8")
    job.spec.distributed = Distributed(nodes=2, gpus_per_node=4)
    d = default_job(job)
    assert d.spec.distributed is not None
    assert d.spec.distributed.gpus_per_node == 4


def test_matrix_gpus_are_kept_as_written_and_template_gang_left_per_cell() -> None:
    sweep = full_sweep()
    sweep.spec.matrix.gpu = ["H100:8", GPURequest(type=["A100"], count=8)]
    d = default_sweep(sweep)
    assert d.spec.matrix.gpu == ["H100:8", GPURequest(type=["A100"], count=8)]
    dist = d.spec.template.spec.distributed
    assert dist is not None
    assert dist.gpus_per_node is None


def test_template_gang_without_matrix_gpus_gets_gpus_per_node() -> None:
    sweep = full_sweep()
    sweep.spec.matrix.gpu = []
    sweep.spec.template.spec.resources = Resources(gpu="H100:8")
    dist = default_sweep(sweep).spec.template.spec.distributed
    assert dist is not None
    assert dist.gpus_per_node == 8


def test_egress_with_allow_entries_defaults_to_allow_list() -> None:
    job = minimal_job()
    job.spec.network = Network(egress=Egress(presets=["huggingface"]))
    d = default_job(job)
    assert d.spec.network is not None
    assert d.spec.network.egress is not None
    assert d.spec.network.egress.policy == "AllowList"


def test_non_checkpointed_continuity_gets_no_checkpoint_policy() -> None:
    job = minimal_job()
    job.spec.recovery = Recovery(continuity="Restartable")
    d = default_job(job)
    assert d.spec.recovery is not None
    assert d.spec.recovery.checkpoint is None


def test_partial_checkpoint_policy_is_completed() -> None:
    job = minimal_job()
    job.spec.recovery = Recovery(checkpoint=CheckpointPolicy(paths=["/ckpt"], interval="15m"))
    cp = default_job(job).spec.recovery.checkpoint  # type: ignore[union-attr]
    assert cp is not None
    assert (cp.paths, cp.interval, cp.max_size, cp.retain_after_finish) == (["/ckpt"], "15m", "1Ti", "168h")
