"""Update rules: what may change after create (ValidateUpdate, in Kubernetes terms).

Everything in a spec is immutable after create except a short list per kind (the reference's words):

* Sweep: maxParallel, maxCostUSD (raise only) and state;
* Pipeline (issue #22): maxCostUSD (raise only) and state; its stages never change (the sweep controller
  creates each stage's child from them as admitted, as it creates a Sweep's cells from its matrix);
* Job: parallelism, backoffLimit, timeout (and its alias activeDeadlineSeconds), maxCostUSD (raise only),
  recovery.maxAttempts, recovery.checkpoint.interval and retainAfterFinish, ttlSecondsAfterFinished and state.

metadata.name, namespace and uid never change; labels and annotations may, as in Kubernetes. The status is
the controllers' and is not compared. These rules only judge the *change*: the gateway also runs
``validate_sweep``/``validate_job`` on the new object.

Decisions (the reference leaves them open):

* Both objects are defaulted before they are compared, so ``"H100:1"`` and ``{type: [H100], count: 1}``, or
  an omitted field and its default, are not changes.
* A cap (maxCostUSD) may not be removed once set: removal would be "raising it to infinity", but an apply of
  a manifest that merely forgets the field must not lift the only brake on spending. Setting a cap where there
  was none is allowed: it is the safe direction, and the way to stop a runaway spend.
* ``Cancelled`` is terminal: a cancelled Sweep or Job cannot go back to Running or Suspended.
"""

from __future__ import annotations

from typing import Final, overload

import msgspec

from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.fielding import ErrorList, FieldError, Path
from nodus_schema.jobs import Job
from nodus_schema.meta import ObjectMeta
from nodus_schema.pipelines import Pipeline, Stage, StageTemplate
from nodus_schema.quantities import parse_usd
from nodus_schema.sweeps import Sweep

__all__ = [
    "JOB_MUTABLE",
    "PIPELINE_MUTABLE",
    "SWEEP_MUTABLE",
    "validate_job_update",
    "validate_pipeline_update",
    "validate_sweep_update",
    "validate_update",
]

SWEEP_MUTABLE: Final = frozenset({"spec.maxParallel", "spec.maxCostUSD", "spec.state"})
JOB_MUTABLE: Final = frozenset(
    {
        "spec.parallelism",
        "spec.backoffLimit",
        "spec.timeout",
        "spec.activeDeadlineSeconds",
        "spec.maxCostUSD",
        "spec.recovery.maxAttempts",
        "spec.recovery.checkpoint.interval",
        "spec.recovery.checkpoint.retainAfterFinish",
        "spec.ttlSecondsAfterFinished",
        "spec.state",
    }
)

PIPELINE_MUTABLE: Final = frozenset({"spec.maxCostUSD", "spec.state"})

_CANCELLED: Final = "Cancelled"


def _immutable_message(mutable: frozenset[str]) -> str:
    return "field is immutable; after create only " + ", ".join(sorted(mutable)) + " may change"


def _diff(errs: ErrorList, path: Path, old: object, new: object, mutable: frozenset[str]) -> None:
    """Report every changed field outside ``mutable``, at the deepest path that names it."""
    if str(path) in mutable or old == new:
        return
    if isinstance(old, msgspec.Struct) and type(old) is type(new):
        for f in msgspec.structs.fields(old):
            _diff(errs, path.child(f.encode_name), getattr(old, f.name), getattr(new, f.name), mutable)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            _diff(errs, path.index(i), a, b, mutable)
    elif isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(old.keys() | new.keys()):
            _diff(errs, path.key(str(k)), old.get(k), new.get(k), mutable)
    else:
        errs.forbidden(path, _immutable_message(mutable))


def _metadata(errs: ErrorList, old: ObjectMeta, new: ObjectMeta) -> None:
    # An unset value in the update means "as stored" (the gateway fills name and namespace from the URL).
    for field, a, b in (
        ("name", old.name, new.name),
        ("namespace", old.namespace, new.namespace),
        ("uid", old.uid, new.uid),
    ):
        if b is not None and a != b:
            errs.forbidden(f"metadata.{field}", "field is immutable")


def _cost_cap(errs: ErrorList, path: str, old: str | None, new: str | None) -> None:
    if old is None or old == new:
        return  # adding a cap is allowed (see the module docstring)
    if new is None:
        errs.forbidden(path, f"a cap cannot be removed once set (it is {old}); raise it instead")
        return
    try:
        lower = parse_usd(new) < parse_usd(old)
    except ValueError:
        return  # validate_* reports the bad amount
    if lower:
        errs.forbidden(path, f"can only be raised: {new} is below the current cap {old}")


def _state(errs: ErrorList, path: str, old: str | None, new: str | None) -> None:
    if old == _CANCELLED and new != _CANCELLED:
        errs.forbidden(path, "Cancelled is final and cannot be undone; create a new object instead")


def validate_sweep_update(old: Sweep, new: Sweep) -> list[FieldError]:
    """What is wrong with changing ``old`` into ``new``, every problem at once."""
    old, new = default_sweep(old), default_sweep(new)
    errs = ErrorList()
    _metadata(errs, old.metadata, new.metadata)
    _diff(errs, Path("spec"), old.spec, new.spec, SWEEP_MUTABLE)
    _cost_cap(errs, "spec.maxCostUSD", old.spec.max_cost_usd, new.spec.max_cost_usd)
    _state(errs, "spec.state", old.spec.state, new.spec.state)
    return errs.as_list()


def validate_job_update(old: Job, new: Job) -> list[FieldError]:
    """What is wrong with changing ``old`` into ``new``, every problem at once."""
    old, new = default_job(old), default_job(new)
    errs = ErrorList()
    _metadata(errs, old.metadata, new.metadata)
    _diff(errs, Path("spec"), old.spec, new.spec, JOB_MUTABLE)
    _cost_cap(errs, "spec.maxCostUSD", old.spec.max_cost_usd, new.spec.max_cost_usd)
    _state(errs, "spec.state", old.spec.state, new.spec.state)
    return errs.as_list()


def _defaulted_stage(stage: Stage) -> Stage:
    """A stage with its template's defaults filled in, for comparing only: a Pipeline is stored as sent."""
    t = stage.template
    job = default_job(Job(spec=t.job)).spec if t.job is not None else None
    sweep = default_sweep(Sweep(spec=t.sweep)).spec if t.sweep is not None else None
    return msgspec.structs.replace(stage, template=StageTemplate(job=job, sweep=sweep))


def validate_pipeline_update(old: Pipeline, new: Pipeline) -> list[FieldError]:
    """What is wrong with changing ``old`` into ``new``, every problem at once: the stages are compared with
    their templates defaulted (``"H100:1"`` and its object form are the same stage)."""
    errs = ErrorList()
    _metadata(errs, old.metadata, new.metadata)
    if old.spec.stages != new.spec.stages:
        before = [_defaulted_stage(s) for s in old.spec.stages]
        after = [_defaulted_stage(s) for s in new.spec.stages]
        _diff(errs, Path("spec").child("stages"), before, after, PIPELINE_MUTABLE)
    _cost_cap(errs, "spec.maxCostUSD", old.spec.max_cost_usd, new.spec.max_cost_usd)
    _state(errs, "spec.state", old.spec.state, new.spec.state)
    return errs.as_list()


@overload
def validate_update(old: Sweep, new: Sweep) -> list[FieldError]: ...
@overload
def validate_update(old: Job, new: Job) -> list[FieldError]: ...
@overload
def validate_update(old: Pipeline, new: Pipeline) -> list[FieldError]: ...
def validate_update(old: Sweep | Job | Pipeline, new: Sweep | Job | Pipeline) -> list[FieldError]:
    """Dispatch on the kind: :func:`validate_sweep_update`, :func:`validate_job_update` or
    :func:`validate_pipeline_update`."""
    if isinstance(old, Sweep) and isinstance(new, Sweep):
        return validate_sweep_update(old, new)
    if isinstance(old, Job) and isinstance(new, Job):
        return validate_job_update(old, new)
    if isinstance(old, Pipeline) and isinstance(new, Pipeline):
        return validate_pipeline_update(old, new)
    raise TypeError(f"cannot update a {type(old).__name__} into a {type(new).__name__}")
