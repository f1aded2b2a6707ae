"""Matrix expansion: the cell order and naming the design brief fixes, and each cell's Job."""

from __future__ import annotations

import msgspec

from nodus_schema.defaulting import default_job
from nodus_schema.examples import minimal_sweep
from nodus_schema.expanding import cell_count, cell_job, expand
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import Placement
from nodus_schema.sweeps import CELL_LABEL, SWEEP_LABEL, Sweep, SweepMatrix
from nodus_schema.validating import validate_job


def sweep_with(matrix: SweepMatrix, repetitions: int = 1) -> Sweep:
    s = minimal_sweep()
    template = s.spec.template
    spec = msgspec.structs.replace(template.spec, placement=Placement(regions=["us", "eu"]))
    return msgspec.structs.replace(
        s,
        metadata=msgspec.structs.replace(s.metadata, uid="u-1"),
        spec=msgspec.structs.replace(
            s.spec,
            matrix=matrix,
            repetitions=repetitions,
            template=msgspec.structs.replace(template, spec=spec),
        ),
    )


def test_order_is_gpu_then_region_then_sorted_params_then_repetition() -> None:
    s = sweep_with(
        SweepMatrix(gpu=["H100:1", "A100:1"], regions=["us", "eu"], params={"LR": ["1", "2"], "BS": ["8"]}),
        repetitions=2,
    )
    cells = expand(s)
    assert len(cells) == cell_count(s) == 2 * 2 * 2 * 1 * 2
    first = cells[:3]
    assert [(c.gpu_text, c.region, c.params, c.repetition) for c in first] == [
        ("H100:1", "us", (("BS", "8"), ("LR", "1")), 0),
        ("H100:1", "us", (("BS", "8"), ("LR", "1")), 1),
        ("H100:1", "us", (("BS", "8"), ("LR", "2")), 0),
    ]
    assert cells[8].gpu_text == "A100:1" and cells[4].region == "eu"
    assert [c.index for c in cells] == list(range(16))


def test_empty_dimensions_keep_the_template() -> None:
    s = sweep_with(SweepMatrix())
    [cell] = expand(s)
    job = cell_job(s, cell)
    assert job.spec == s.spec.template.spec


def test_cell_job_applies_gpu_region_params_and_ownership() -> None:
    s = sweep_with(SweepMatrix(gpu=["L4:1"], regions=["eu"], params={"LR": ["0.1"]}))
    job = cell_job(s, expand(s)[0])
    assert job.metadata.name == f"{s.metadata.name}-0"
    assert job.metadata.labels[SWEEP_LABEL] == s.metadata.name and job.metadata.labels[CELL_LABEL] == "0"
    assert job.metadata.owner_references[0].uid == "u-1" and job.metadata.owner_references[0].kind == "Sweep"
    assert job.spec.resources is not None and job.spec.resources.gpu == GPURequest(type=["L4"], count=1)
    assert job.spec.placement is not None and job.spec.placement.regions == ["eu"]
    assert {e.name: e.value for e in job.spec.env}["NODUS_PARAM_LR"] == "0.1"
    assert validate_job(default_job(job)) == []  # a cell Job is a valid Job


def test_gpu_text_is_the_string_form_with_its_count_and_what_has_none() -> None:
    nvlink = GPURequest(type=["H100"], count=8, exact=True, interconnect="NVLink", min_memory="80Gi")
    s = sweep_with(
        SweepMatrix(
            gpu=[
                "H100",
                GPURequest(type=["H100", "A100"], count=8),
                nvlink,
                GPURequest(type=["L4"], interconnect="Any"),
            ]
        )
    )
    assert [c.gpu_text for c in expand(s)] == [
        "H100:1",
        "H100,A100:8",
        "H100:8 (exact, interconnect NVLink, minMemory 80Gi)",
        "L4:1",  # interconnect Any is the default: the same request as "L4:1"
    ]
