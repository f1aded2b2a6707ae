"""The Pipeline's rules (issue #22, nodus_schema.pipelinerules): a DAG of Job and Sweep stages whose
outputs flow through fromStage and whose best cells flow through fromBest; every mistake a cause on its
field."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from nodus_schema.fielding import CauseType
from nodus_schema.pipelinerules import find_cycle, validate_pipeline
from nodus_schema.pipelines import Pipeline

JOB = {"image": "x", "resources": {"gpu": "L4:1"}}
DATA_IN = [{"name": "data", "fromStage": {"stage": "prepare", "output": "data"}}]
MODEL_IN = [{"name": "m", "fromStage": {"stage": "train", "output": "model"}}]
FLOW: dict[str, Any] = {
    "apiVersion": "nodus.dev/v1",
    "kind": "Pipeline",
    "metadata": {"name": "flow", "namespace": "p"},
    "spec": {
        "maxCostUSD": "5",
        "stages": [
            {
                "name": "prepare",
                "template": {"job": {**JOB, "outputs": [{"name": "data", "path": "/nodus/outputs/data"}]}},
            },
            {
                "name": "grid",
                "dependsOn": ["prepare"],
                "template": {
                    "sweep": {
                        "matrix": {"params": {"LR": ["1", "2"]}},
                        "template": {
                            "spec": {
                                **JOB,
                                "inputs": [
                                    {"name": "data", "fromStage": {"stage": "prepare", "output": "data"}}
                                ],
                            }
                        },
                    }
                },
            },
            {
                "name": "train",
                "dependsOn": ["grid"],
                "fromBest": {"stage": "grid", "by": "Throughput"},
                "template": {"job": {**JOB, "outputs": [{"name": "model", "path": "/nodus/outputs/model"}]}},
            },
            {
                "name": "evaluate",
                "dependsOn": ["train"],
                "template": {
                    "job": {
                        **JOB,
                        "inputs": [{"name": "m", "fromStage": {"stage": "train", "output": "model"}}],
                    }
                },
            },
        ],
    },
}


def errors(body: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {e.field: (str(e.reason), e.message) for e in validate_pipeline(msgspec.convert(body, Pipeline))}


def changed(**edits: Any) -> dict[str, Any]:
    body = copy.deepcopy(FLOW)
    for index, change in edits.items():
        body["spec"]["stages"][int(index.removeprefix("s"))].update(change)
    return body


def test_the_four_stage_flow_is_valid() -> None:
    assert errors(FLOW) == {}


def test_a_cycle_is_named() -> None:
    found = errors(changed(s0={"dependsOn": ["evaluate"]}))
    reason, message = found["spec.stages[0].dependsOn"]
    assert reason == CauseType.INVALID and "prepare -> evaluate -> train -> grid -> prepare" in message


def test_an_unknown_stage_in_depends_on_or_from_stage_is_not_found() -> None:
    found = errors(changed(s2={"dependsOn": ["grid", "ghost"]}))
    assert found["spec.stages[2].dependsOn[1]"][0] == CauseType.NOT_FOUND
    body = copy.deepcopy(FLOW)
    body["spec"]["stages"][3]["template"]["job"]["inputs"][0]["fromStage"]["stage"] = "ghost"
    assert errors(body)["spec.stages[3].template.job.inputs[0].fromStage.stage"][0] == CauseType.NOT_FOUND


def test_an_output_the_stage_does_not_declare_is_not_found_with_what_it_has() -> None:
    body = copy.deepcopy(FLOW)
    body["spec"]["stages"][3]["template"]["job"]["inputs"][0]["fromStage"]["output"] = "weights"
    reason, message = errors(body)["spec.stages[3].template.job.inputs[0].fromStage.output"]
    assert reason == CauseType.NOT_FOUND and "'model'" in message


def test_from_stage_and_from_best_name_a_dependency() -> None:
    found = errors(changed(s3={"dependsOn": ["grid"]}))  # reads train, no longer depends on it
    assert "add 'train' to dependsOn" in found["spec.stages[3].template.job.inputs[0].fromStage.stage"][1]
    found = errors(changed(s2={"dependsOn": ["prepare"]}))
    assert "dependsOn" in found["spec.stages[2].fromBest.stage"][1]
    found = errors(changed(s2={"fromBest": {"stage": "prepare", "by": "Speed"}, "dependsOn": ["prepare"]}))
    assert found["spec.stages[2].fromBest.stage"][0] == CauseType.INVALID  # a Job has no best cell
    assert found["spec.stages[2].fromBest.by"][0] == CauseType.NOT_SUPPORTED


def test_a_stage_has_exactly_one_template_and_no_state_of_its_own() -> None:
    both = {"job": JOB, "sweep": {"template": {"spec": JOB}}}
    assert "spec.stages[0].template" in errors(changed(s0={"template": both}))
    assert "spec.stages[0].template" in errors(changed(s0={"template": {}}))
    found = errors(changed(s0={"template": {"job": {**JOB, "state": "Suspended"}}}))
    assert found["spec.stages[0].template.job.state"][0] == CauseType.FORBIDDEN


def test_a_stage_may_not_take_a_cells_name_and_names_are_unique() -> None:
    found = errors(changed(s3={"name": "grid-1"}))
    assert "cell 1 of Sweep stage 'grid'" in found["spec.stages[3].name"][1]
    assert "spec.stages[3].name" in errors(changed(s3={"name": "train"}))


def test_from_stage_outside_a_pipeline_stays_refused_inside_it_is_checked() -> None:
    body = copy.deepcopy(FLOW)
    body["spec"]["stages"][0]["template"]["job"]["inputs"] = [
        {"name": "x", "fromStage": {"stage": "prepare", "output": "data"}}
    ]
    found = errors(body)
    assert "does not depend on it" in found["spec.stages[0].template.job.inputs[0].fromStage.stage"][1]


@given(st.integers(2, 8), st.data())
def test_find_cycle_finds_a_cycle_exactly_when_there_is_one(n: int, data: st.DataObject) -> None:
    names = [f"s{i}" for i in range(n)]
    # Edges only to earlier stages: a DAG. One back edge to a later stage closes a cycle.
    edges = {
        name: data.draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else []
        for i, name in enumerate(names)
    }
    assert find_cycle(edges) is None
    chain = {names[k]: [names[k - 1]] for k in range(1, n)}
    chain[names[0]] = [names[n - 1]]
    cycle = find_cycle(chain)
    assert cycle is not None and cycle[0] == cycle[-1] and len(cycle) == n + 1
