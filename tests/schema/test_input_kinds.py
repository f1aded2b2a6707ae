"""Admission of input kinds: url, bucket, output, volume and fromWorkspace are accepted (ADR-0020,
ADR-0036); fromStage is refused outside a Pipeline's stage with a field error that says where it works;
every input has exactly one kind."""

from __future__ import annotations

import pytest

from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.examples import minimal_job, minimal_sweep
from nodus_schema.fielding import CauseType, FieldError
from nodus_schema.jobs import (
    BucketInput,
    JobInput,
    OutputInput,
    StageInput,
    URLInput,
    VolumeInput,
    WorkspaceInput,
)
from nodus_schema.validating import validate_job, validate_sweep

DIGEST = "ab" * 32
SUPPORTED = [
    JobInput(name="vocab", url=URLInput(url="https://example.com/vocab.txt", sha256=DIGEST)),
    JobInput(name="corpus", bucket=BucketInput(uri="s3://acme-data/corpus/", connection="acme-s3")),
    JobInput(name="tokenizer", output=OutputInput(job="prep", name="tokenizer", index=1)),
    JobInput(name="weights", volume=VolumeInput(name="llama", revision=3)),
    JobInput(name="home", from_workspace=WorkspaceInput(name="alice", path="llm")),
]
REFUSED = [
    ("fromStage", JobInput(name="features", from_stage=StageInput(stage="featurize", output="f"))),
]


def job_errors(inputs: list[JobInput]) -> list[list[FieldError]]:
    """The errors of a Job with these inputs, as sent and after defaulting (the gateway's order)."""
    job = minimal_job()
    job.spec.inputs = inputs
    return [validate_job(job), validate_job(default_job(job))]


def test_supported_kinds_are_admitted() -> None:
    assert job_errors(list(SUPPORTED)) == [[], []]


@pytest.mark.parametrize(("kind", "inp"), REFUSED, ids=[k for k, _ in REFUSED])
def test_stage_inputs_outside_a_pipeline_are_refused_saying_where_they_work(kind: str, inp: JobInput) -> None:
    for errors in job_errors([SUPPORTED[0], inp]):
        assert [(e.field, e.reason) for e in errors] == [(f"spec.inputs[1].{kind}", CauseType.FORBIDDEN)]
        message = errors[0].message
        assert "only in a Pipeline's stage" in message and "use an output input" in message


@pytest.mark.parametrize(("kind", "inp"), REFUSED, ids=[k for k, _ in REFUSED])
def test_a_sweep_template_refuses_them_at_its_own_path(kind: str, inp: JobInput) -> None:
    sweep = minimal_sweep()
    sweep.spec.template.spec.inputs = [inp]
    for errors in (validate_sweep(sweep), validate_sweep(default_sweep(sweep))):
        fields = [(e.field, e.reason) for e in errors]
        assert fields == [(f"spec.template.spec.inputs[0].{kind}", CauseType.FORBIDDEN)]


def test_an_input_without_a_kind_names_the_supported_ones() -> None:
    for errors in job_errors([JobInput(name="x")]):
        assert [(e.field, e.reason) for e in errors] == [("spec.inputs[0]", CauseType.REQUIRED)]
        assert "exactly one of volume, output, bucket, url or fromWorkspace" in errors[0].message


def test_an_input_with_two_kinds_is_refused_at_the_second() -> None:
    two = JobInput(
        name="x",
        url=URLInput(url="https://example.com/a"),
        output=OutputInput(job="prep", name="a"),
    )
    for errors in job_errors([two]):
        assert [(e.field, e.reason) for e in errors] == [("spec.inputs[0].url", CauseType.FORBIDDEN)]
        assert "exactly one source, and output is set" in errors[0].message


def test_a_refused_kind_beside_a_supported_one_reports_both_problems() -> None:
    both = JobInput(
        name="x", url=URLInput(url="https://example.com/a"), from_stage=StageInput(stage="s", output="o")
    )
    for errors in job_errors([both]):
        assert [(e.field, e.reason) for e in errors] == [
            ("spec.inputs[0].fromStage", CauseType.FORBIDDEN)
        ] * 2
        messages = " ".join(e.message for e in errors)
        assert "exactly one source" in messages
        assert "only in a Pipeline's stage" in messages


def test_revision_zero_of_a_volume_input_is_refused() -> None:
    zero = JobInput(name="w", volume=VolumeInput(name="llama", revision=0))
    for errors in job_errors([zero]):
        assert [(e.field, e.reason) for e in errors] == [
            ("spec.inputs[0].volume.revision", CauseType.INVALID)
        ]
