"""Builders of valid example objects, for tests across the repository and for the docs.

``minimal_*`` is what a user writes at the least: every other field takes its default. ``full_*`` sets
every part of the spec Nodus supports, valid before and after defaulting, so a test can break one field and
expect one error (the fields it refuses as not supported yet, such as volumes and source, are left out).
Each call returns fresh objects; change them freely.
"""

from __future__ import annotations

from nodus_schema.jobs import (
    BucketInput,
    CheckpointPolicy,
    Distributed,
    Egress,
    EnvVar,
    EnvVarSource,
    InitCommand,
    Job,
    JobInput,
    JobOutput,
    JobSpec,
    Network,
    OutputInput,
    OutputSink,
    Placement,
    Recovery,
    Resources,
    SecretKeySelector,
    SecretMount,
    Sidecar,
    URLInput,
)
from nodus_schema.meta import ObjectMeta
from nodus_schema.sweeps import Sweep, SweepMatrix, SweepSpec, SweepTemplate

__all__ = [
    "full_job",
    "full_job_spec",
    "full_sweep",
    "minimal_job",
    "minimal_job_spec",
    "minimal_sweep",
]

_DIGEST = "0" * 63 + "1"


def minimal_job_spec() -> JobSpec:
    """One H100 running one command in one image."""
    return JobSpec(
        image="ghcr.io/acme/train:1.0",
        command=["python", "train.py"],
        resources=Resources(gpu="H100:1"),
    )


def minimal_job(name: str = "train", namespace: str = "default") -> Job:
    return Job(metadata=ObjectMeta(name=name, namespace=namespace), spec=minimal_job_spec())


def minimal_sweep(name: str = "lr-sweep", namespace: str = "default") -> Sweep:
    """Two learning rates on the minimal Job: two cells."""
    return Sweep(
        metadata=ObjectMeta(name=name, namespace=namespace),
        spec=SweepSpec(
            matrix=SweepMatrix(params={"LR": ["0.1", "0.01"]}),
            template=SweepTemplate(kind="Job", spec=minimal_job_spec()),
        ),
    )


def _inputs() -> list[JobInput]:
    return [
        JobInput(name="weights", bucket=BucketInput(uri="s3://acme-data/llama/", connection="acme-s3")),
        JobInput(name="tokenizer", output=OutputInput(job="prep", name="tokenizer", index=0)),
        JobInput(name="corpus", bucket=BucketInput(uri="s3://acme-data/corpus.tar", connection="acme-s3")),
        JobInput(name="vocab", url=URLInput(url="https://example.com/vocab.txt", sha256=_DIGEST)),
    ]


def full_job_spec() -> JobSpec:
    """Every part of a JobSpec, set to valid values: a 2-node gang of H100:8 with inputs and outputs."""
    return JobSpec(
        image="ghcr.io/acme/train:1.0",
        command=["python", "train.py"],
        args=["--epochs", "3"],
        working_dir="/workspace",
        env=[
            EnvVar(name="MODE", value="full"),
            EnvVar(
                name="HF_TOKEN",
                value_from=EnvVarSource(secret_key_ref=SecretKeySelector(name="hf", key="token")),
            ),
        ],
        secrets=["hf", SecretMount(name="wandb", version=2)],
        image_pull_secrets=["ghcr"],
        connections=["acme-s3"],
        init_command=InitCommand(command=["pip", "install", "-e", "."], timeout="10m"),
        sidecars=[Sidecar(name="metrics", image="ghcr.io/acme/metrics:2")],
        completions=4,
        parallelism=2,
        backoff_limit=3,
        timeout="12h",
        expected_duration="6h",
        max_cost_usd="250.00",
        ttl_seconds_after_finished=86_400,
        scaledown_window="0s",
        resources=Resources(gpu="H100:8", cpu="32", memory="256Gi", disk="500Gi"),
        distributed=Distributed(nodes=2, launcher="Torchrun", network="Regional", transport="Auto"),
        inputs=_inputs(),
        outputs=[
            JobOutput(name="model", path="/nodus/outputs/model"),
            JobOutput(
                name="metrics.csv",
                path="/nodus/state/metrics.csv",
                from_ranks="All",
                sink=OutputSink(connection="acme-pg", table="public.metrics", mode="Replace"),
            ),
        ],
        placement=Placement(
            interruptible="Allow", profile="Cost", max_rate_usd_per_hour="40", regions=["us", "eu"]
        ),
        recovery=Recovery(
            continuity="Checkpointed",
            max_attempts=5,
            checkpoint=CheckpointPolicy(
                interval="30m", max_size="500Gi", paths=["/nodus/state", "/nodus/outputs/ckpt"]
            ),
        ),
        network=Network(egress=Egress(policy="Deny")),  # AllowList is refused until enforced (ADR-0018)
    )


def full_job(name: str = "train-full", namespace: str = "default") -> Job:
    return Job(
        metadata=ObjectMeta(name=name, namespace=namespace, labels={"team": "llm"}), spec=full_job_spec()
    )


def full_sweep(name: str = "full-sweep", namespace: str = "default") -> Sweep:
    """A Sweep over GPUs, regions, two parameters and repetitions, on the full template."""
    template = full_job_spec()
    template.resources = Resources(cpu="32", memory="256Gi")
    return Sweep(
        metadata=ObjectMeta(name=name, namespace=namespace),
        spec=SweepSpec(
            matrix=SweepMatrix(
                gpu=["H100:8", "A100:8"],
                regions=["us", "eu"],
                params={"LR": ["0.1", "0.01"], "BATCH": ["32", "64"]},
            ),
            max_cost_usd="1000",
            max_parallel=8,
            repetitions=2,
            template=SweepTemplate(kind="Job", spec=template),
        ),
    )
