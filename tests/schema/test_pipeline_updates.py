"""The update rule of a Pipeline (issue #22, nodus_schema.updating): its stages never change after create;
spec.maxCostUSD may be raised and spec.state changed (Cancelled is final)."""

from __future__ import annotations

from typing import Any

import msgspec

from nodus_schema.pipelines import Pipeline
from nodus_schema.updating import validate_pipeline_update, validate_update


def pipeline(**spec: Any) -> Pipeline:
    job = {"image": "x", "resources": {"gpu": "H100:1"}}
    stages = [
        {"name": "a", "template": {"job": job}},
        {
            "name": "b",
            "dependsOn": ["a"],
            "template": {"sweep": {"maxParallel": 2, "template": {"spec": job}}},
        },
    ]
    return msgspec.convert({"metadata": {"name": "p"}, "spec": {"stages": stages, **spec}}, Pipeline)


def causes(old: Pipeline, new: Pipeline) -> dict[str, str]:
    return {e.field: e.message for e in validate_pipeline_update(old, new)}


def test_cap_and_state_may_change() -> None:
    old = pipeline(maxCostUSD="10")
    assert validate_update(old, pipeline(maxCostUSD="20", state="Suspended")) == []
    assert "can only be raised" in causes(old, pipeline(maxCostUSD="5"))["spec.maxCostUSD"]
    assert "cannot be removed" in causes(old, pipeline())["spec.maxCostUSD"]
    cancelled = pipeline(state="Cancelled")
    assert "Cancelled is final" in causes(cancelled, pipeline(state="Running"))["spec.state"]


def test_the_stages_never_change_and_the_cause_names_the_field() -> None:
    old = pipeline()
    new = pipeline()
    sweep = new.spec.stages[1].template.sweep
    assert sweep is not None
    sweep.max_parallel = 3
    new.spec.stages[1].depends_on = []
    found = causes(old, new)
    message = "Forbidden: field is immutable; after create only spec.maxCostUSD, spec.state may change"
    assert found == {
        "spec.stages[1].dependsOn": message,
        "spec.stages[1].template.sweep.maxParallel": message,
    }
    shorter = pipeline()
    shorter.spec.stages.pop()
    assert set(causes(old, shorter)) == {"spec.stages"}


def test_a_template_written_another_way_is_no_change() -> None:
    new = pipeline()
    job = new.spec.stages[0].template.job
    assert job is not None
    job.resources = msgspec.convert({"gpu": {"type": ["H100"], "count": 1}}, type(job.resources))
    assert validate_pipeline_update(pipeline(), new) == []
