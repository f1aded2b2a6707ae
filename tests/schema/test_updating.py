"""Update rules: the mutable fields may change, everything else is reported by its path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.examples import full_job, full_sweep, minimal_job
from nodus_schema.fielding import CauseType, FieldError
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import Job, Resources
from nodus_schema.sweeps import Sweep
from nodus_schema.updating import validate_job_update, validate_sweep_update, validate_update

Change = Callable[[Any], None]


def _fields(errors: list[FieldError]) -> list[str]:
    assert all(e.reason == CauseType.FORBIDDEN for e in errors)
    return [e.field for e in errors]


def _job_change(change: Change) -> list[FieldError]:
    old = default_job(full_job())
    new = default_job(full_job())
    change(new)
    return validate_update(old, new)


def _sweep_change(change: Change) -> list[FieldError]:
    old = default_sweep(full_sweep())
    new = default_sweep(full_sweep())
    change(new)
    return validate_update(old, new)


def _set(**fields: object) -> Change:
    def change(obj: Any) -> None:
        for path, value in fields.items():
            *parents, last = path.split("__")
            target = obj
            for p in parents:
                target = getattr(target, p)
            setattr(target, last, value)

    return change


JOB_MUTABLE = [
    ("parallelism", _set(spec__parallelism=4)),
    ("backoffLimit", _set(spec__backoff_limit=10)),
    ("timeout", _set(spec__timeout="24h")),
    ("maxCostUSD raised", _set(spec__max_cost_usd="500")),
    ("recovery.maxAttempts", _set(spec__recovery__max_attempts=10)),
    ("checkpoint.interval", _set(spec__recovery__checkpoint__interval="1h")),
    ("checkpoint.retainAfterFinish", _set(spec__recovery__checkpoint__retain_after_finish="24h")),
    ("ttlSecondsAfterFinished", _set(spec__ttl_seconds_after_finished=60)),
    ("state Suspended", _set(spec__state="Suspended")),
    ("state Cancelled", _set(spec__state="Cancelled")),
    ("labels", _set(metadata__labels={"team": "infra"})),
    ("annotations", _set(metadata__annotations={"note": "x"})),
    ("status", _set(status__phase="Running")),
    ("maxCostUSD same amount", _set(spec__max_cost_usd="250")),
]


@pytest.mark.parametrize("change", [c for _, c in JOB_MUTABLE], ids=[i for i, _ in JOB_MUTABLE])
def test_job_mutable_fields(change: Change) -> None:
    assert _job_change(change) == []


JOB_IMMUTABLE = [
    ("image", _set(spec__image="other:2"), "spec.image"),
    ("command", _set(spec__command=["python", "other.py"]), "spec.command[1]"),
    ("args length", _set(spec__args=["--epochs"]), "spec.args"),
    ("completions", _set(spec__completions=8), "spec.completions"),
    (
        "gpu count",
        _set(spec__resources__gpu=GPURequest(type=["H100"], count=4, interconnect="Any")),
        "spec.resources.gpu.count",
    ),
    ("input url", lambda j: setattr(j.spec.inputs[3].url, "url", "https://x.io/f"), "spec.inputs[3].url.url"),
    ("one more output", lambda j: j.spec.outputs.pop(), "spec.outputs"),
    ("placement regions", _set(spec__placement__regions=["us"]), "spec.placement.regions"),
    (
        "checkpoint maxSize",
        _set(spec__recovery__checkpoint__max_size="2Ti"),
        "spec.recovery.checkpoint.maxSize",
    ),
    ("recovery continuity", _set(spec__recovery__continuity="Restartable"), "spec.recovery.continuity"),
    ("metadata.name", _set(metadata__name="other"), "metadata.name"),
    ("metadata.namespace", _set(metadata__namespace="other"), "metadata.namespace"),
    ("metadata.uid", _set(metadata__uid="u-2"), "metadata.uid"),
    ("maxCostUSD lowered", _set(spec__max_cost_usd="249.99"), "spec.maxCostUSD"),
    ("maxCostUSD removed", _set(spec__max_cost_usd=None), "spec.maxCostUSD"),
]


@pytest.mark.parametrize(
    ("change", "path"), [r[1:] for r in JOB_IMMUTABLE], ids=[r[0] for r in JOB_IMMUTABLE]
)
def test_job_immutable_fields(change: Change, path: str) -> None:
    assert _fields(_job_change(change)) == [path]


def test_immutable_message_names_the_mutable_fields() -> None:
    (err,) = _job_change(_set(spec__image="other:2"))
    assert err.message.startswith("Forbidden: field is immutable")
    assert "spec.parallelism" in err.message


def test_every_changed_field_is_reported() -> None:
    errors = _job_change(
        _set(spec__image="x", spec__completions=8, spec__working_dir="/w", spec__max_cost_usd="1")
    )
    assert sorted(_fields(errors)) == ["spec.completions", "spec.image", "spec.maxCostUSD", "spec.workingDir"]


def test_a_cap_may_be_added_where_there_was_none() -> None:
    old = minimal_job()
    new = minimal_job()
    new.spec.max_cost_usd = "10"
    assert validate_update(old, new) == []


def test_raw_and_defaulted_forms_are_not_changes() -> None:
    old = minimal_job()
    new = default_job(minimal_job())
    new.spec.resources = Resources(gpu=GPURequest(type=["H100"], count=1))
    assert validate_update(old, new) == []


def test_cancelled_is_terminal() -> None:
    old: Job = default_job(minimal_job())
    old.spec.state = "Cancelled"
    for state in ("Running", "Suspended", None):
        new = default_job(minimal_job())
        new.spec.state = state
        assert _fields(validate_job_update(old, new)) == ["spec.state"], state
    again = default_job(minimal_job())
    again.spec.state = "Cancelled"
    assert validate_job_update(old, again) == []


SWEEP_MUTABLE = [
    ("maxParallel", _set(spec__max_parallel=16)),
    ("maxCostUSD raised", _set(spec__max_cost_usd="1000.01")),
    ("state", _set(spec__state="Suspended")),
    ("labels", _set(metadata__labels={"a": "b"})),
]


@pytest.mark.parametrize("change", [c for _, c in SWEEP_MUTABLE], ids=[i for i, _ in SWEEP_MUTABLE])
def test_sweep_mutable_fields(change: Change) -> None:
    assert _sweep_change(change) == []


SWEEP_IMMUTABLE = [
    ("repetitions", _set(spec__repetitions=3), "spec.repetitions"),
    ("matrix params", lambda s: s.spec.matrix.params.update(LR=["1"]), "spec.matrix.params[LR]"),
    ("matrix gpu", lambda s: s.spec.matrix.gpu.__setitem__(0, "B200:8"), "spec.matrix.gpu[0]"),
    ("template image", _set(spec__template__spec__image="x:1"), "spec.template.spec.image"),
    ("template parallelism", _set(spec__template__spec__parallelism=1), "spec.template.spec.parallelism"),
    ("maxCostUSD lowered", _set(spec__max_cost_usd="999"), "spec.maxCostUSD"),
]


@pytest.mark.parametrize(
    ("change", "path"), [r[1:] for r in SWEEP_IMMUTABLE], ids=[r[0] for r in SWEEP_IMMUTABLE]
)
def test_sweep_immutable_fields(change: Change, path: str) -> None:
    assert _fields(_sweep_change(change)) == [path]


def test_cancelled_sweep_is_terminal() -> None:
    old: Sweep = full_sweep()
    old.spec.state = "Cancelled"
    new = full_sweep()
    new.spec.state = "Running"
    assert _fields(validate_sweep_update(old, new)) == ["spec.state"]


def test_update_of_different_kinds_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        validate_update(full_job(), full_sweep())  # type: ignore[call-overload]
