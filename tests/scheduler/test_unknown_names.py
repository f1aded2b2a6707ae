"""The scheduler's estimate tells a name its catalog does not know (the spec's mistake: field errors in
``EstimateReply.invalid``, which the gateway answers 422) from a known name nothing sells (a blocking
CapacityUnavailable, as before), with the shipped catalog and the live nodes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.estimating import estimate
from nodus_schema.catalog import Catalog
from nodus_schema.estimating import EstimateRequest
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import JobSpec, Placement, Resources
from nodus_schema.meta import ObjectMeta
from nodus_schema.nodes import Node, NodeSpec
from nodus_schema.sweeps import SweepMatrix, SweepSpec, SweepTemplate

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def job(
    gpu: GPURequest | str, regions: list[str] | None = None, offerings: list[str] | None = None
) -> EstimateRequest:
    spec = JobSpec(
        image="x",
        expected_duration="1h",
        resources=Resources(gpu=gpu),
        placement=Placement(regions=regions or [], offerings=offerings or []),
    )
    return EstimateRequest(namespace="p", kind="Job", job_spec=spec)


def test_unknown_names_get_field_errors_and_no_estimate(catalog: Catalog) -> None:
    reply = estimate(job(GPURequest(type=["NOSUCHGPU"]), ["mars"], ["nope"]), catalog, [], set(), NOW)
    assert {c.field for c in reply.invalid} == {
        "spec.resources.gpu.type[0]",
        "spec.placement.regions[0]",
        "spec.placement.offerings[0]",
    }
    assert all(c.reason == "FieldValueNotSupported" for c in reply.invalid)
    assert reply.estimate.blocking_reasons == [] and reply.slots == []


def test_a_known_name_nothing_sells_is_still_a_blocking_capacity_unavailable(catalog: Catalog) -> None:
    for request in (
        job("B200:1", ["us"]),
        job("MI300X:1", ["eu"]),
        job(GPURequest(type=["h100-sxm-80g"], count=2)),
    ):
        reply = estimate(request, catalog, [], set(), NOW)
        assert reply.invalid == []
        assert [r.code for r in reply.estimate.blocking_reasons] == ["CapacityUnavailable"]


def test_a_region_only_a_node_is_in_is_known(catalog: Catalog) -> None:
    node = Node(metadata=ObjectMeta(name="n"), spec=NodeSpec(offering="l4-x1-us", region_class="lab"))
    assert estimate(job("L4:1", ["lab"]), catalog, [], set(), NOW).invalid != []
    reply = estimate(job("L4:1", ["lab"]), catalog, [node], set(), NOW)
    assert (
        reply.invalid == [] and reply.estimate.blocking_reasons
    )  # known, and nothing in the book sells it there


def test_a_sweeps_matrix_names_are_checked(catalog: Catalog) -> None:
    sweep = SweepSpec(
        matrix=SweepMatrix(gpu=["L4:1", "NOSUCHGPU:1"], regions=["us", "mars"]),
        template=SweepTemplate(kind="Job", spec=JobSpec(image="x", expected_duration="1h")),
    )
    reply = estimate(EstimateRequest(namespace="p", kind="Sweep", sweep_spec=sweep), catalog, [], set(), NOW)
    assert {c.field for c in reply.invalid} == {"spec.matrix.gpu[1].type[0]", "spec.matrix.regions[1]"}
