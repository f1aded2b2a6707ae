"""What admission refuses because nothing downstream can honour it (pure rules): output and checkpoint paths
the node agent cannot collect, fields whose feature is not supported yet, metadata only Nodus sets
(owning.py), and names the catalog does not know (naming.py)."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest

from nodus_schema.catalog import Catalog, Offering, PriceBook, Variant
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.examples import full_job, full_sweep, minimal_job
from nodus_schema.fielding import CauseType, FieldError
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import (
    CheckpointPolicy,
    Egress,
    EnvVar,
    EnvVarSource,
    Job,
    JobOutput,
    Network,
    Placement,
    Recovery,
    Resources,
    SecretKeySelector,
    Sidecar,
)
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.naming import known_names, unknown_job_names, unknown_sweep_names
from nodus_schema.nodes import Node, NodeSpec
from nodus_schema.owning import is_server_label, server_owned_errors
from nodus_schema.sweeps import Sweep, SweepMatrix
from nodus_schema.validating import validate_job, validate_sweep

FORB, INV, NOTSUP = CauseType.FORBIDDEN, CauseType.INVALID, CauseType.NOT_SUPPORTED
NOT_YET = re.compile(r"Forbidden: .+ not supported yet \(.+\); .+ instead.*")


def errs_of(job: Job) -> list[FieldError]:
    sent = validate_job(job)
    assert {(e.field, e.reason) for e in sent} == {
        (e.field, e.reason) for e in validate_job(default_job(job))
    }
    return sent


def one(errs: list[FieldError], field: str) -> FieldError:
    hits = [e for e in errs if e.field == field]
    assert len(hits) == 1, f"{field}: {[str(e) for e in errs]}"
    return hits[0]


# -- output and checkpoint paths: only what the node agent collects -----------------------------------------

OUTPUT_PATHS = [
    ("/nodus/outputs/model.pt", None),
    ("/nodus/outputs", None),
    ("/nodus/state/metrics.csv", None),
    ("/nodus/state", None),
    ("/etc/hostname", FORB),
    ("/workspace/model", FORB),
    ("/nodus", FORB),
    ("/nodus/inputs/weights", FORB),
    ("/nodus/outputsx", FORB),
    ("model.pt", INV),
    ("/nodus/outputs/../../etc/passwd", INV),
    ("/nodus/outputs/a\x00b", INV),
    ("/nodus/outputs/a\nb", INV),
    ("/nodus/outputs/a\x7fb", INV),
    ("/nodus/outputs/", INV),
    ("/nodus/outputs/" + "a" * 4081, None),  # 4096 characters
    ("/nodus/outputs/" + "a" * 4082, CauseType.TOO_LONG),
    ("/proc/self/environ", FORB),
]


@pytest.mark.parametrize(("path", "reason"), OUTPUT_PATHS, ids=[repr(p[:40]) for p, _ in OUTPUT_PATHS])
def test_output_paths_are_what_the_node_agent_collects(path: str, reason: CauseType | None) -> None:
    job = minimal_job()
    job.spec.outputs = [JobOutput(name="out", path=path)]
    errs = errs_of(job)
    if reason is None:
        assert errs == []
        return
    assert one(errs, "spec.outputs[0].path").reason == reason


def test_an_output_outside_says_where_to_write_it() -> None:
    job = minimal_job()
    job.spec.outputs = [JobOutput(name="host", path="/etc/hostname")]
    message = one(errs_of(job), "spec.outputs[0].path").message
    assert "under /nodus/outputs or /nodus/state" in message
    assert "e.g. '/nodus/outputs/hostname'" in message


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/nodus/state/opt", None),
        ("/nodus/outputs/ckpt", None),
        ("/etc/myapp", FORB),
        ("/nodus/inputs", FORB),
    ],
)
def test_checkpoint_paths_are_what_the_node_agent_collects(path: str, reason: CauseType | None) -> None:
    job = minimal_job()
    job.spec.recovery = Recovery(checkpoint=CheckpointPolicy(paths=[path]))
    errs = errs_of(job)
    if reason is None:
        assert errs == []
    else:
        assert one(errs, "spec.recovery.checkpoint.paths[0]").reason == reason


def test_working_dir_refuses_control_characters() -> None:
    job = minimal_job()
    job.spec.working_dir = "/app\x00"
    assert one(errs_of(job), "spec.workingDir").reason == INV


# -- fields accepted in the reference's shape but not honoured: refused, saying what to use instead ---------

UNSUPPORTED: list[tuple[str, str, Any]] = [
    ("spec.imageRef", "image_ref", "ghcr.io/acme/train@sha256:" + "a" * 64),
    ("spec.network.egress.presets", "network", Network(egress=Egress(presets=["huggingface"]))),
    ("spec.sidecars[0].startupTimeout", "sidecars", [Sidecar(name="proxy", startup_timeout="1m")]),
    (
        "spec.sidecars[0].env[0].valueFrom",
        "sidecars",
        [
            Sidecar(
                name="proxy",
                env=[
                    EnvVar(
                        name="T", value_from=EnvVarSource(secret_key_ref=SecretKeySelector(name="s", key="k"))
                    )
                ],
            )
        ],
    ),
    (
        "spec.recovery.checkpoint.integration",
        "recovery",
        Recovery(checkpoint=CheckpointPolicy(integration="HFTrainer")),
    ),
]


@pytest.mark.parametrize(("field", "attr", "value"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_a_field_nodus_does_not_honour_is_refused_on_the_field(field: str, attr: str, value: Any) -> None:
    job = minimal_job()
    setattr(job.spec, attr, value)
    error = one(errs_of(job), field)
    assert error.reason == FORB and NOT_YET.fullmatch(error.message), error.message


@pytest.mark.parametrize(("field", "attr", "value"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_a_sweep_template_refuses_them_at_its_own_path(field: str, attr: str, value: Any) -> None:
    sweep = full_sweep()
    setattr(sweep.spec.template.spec, attr, value)
    wanted = field.replace("spec.", "spec.template.spec.", 1)
    for obj in (sweep, default_sweep(sweep)):
        hits = [e for e in validate_sweep(obj) if e.field == wanted]
        assert [e.reason for e in hits] == [FORB] and NOT_YET.fullmatch(hits[0].message)


@pytest.mark.parametrize(
    "when", ["2030-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "2026-11-30T05:00:00.5+02:00"]
)
def test_complete_by_time_is_honoured_so_admitted_even_in_the_past(when: str) -> None:
    """Issue #21: a finish-by hint for placement and checkpoint cadence; a past one is a warning of the
    estimate (DeadlinePassed), never a refusal."""
    job = minimal_job()
    job.spec.complete_by_time = when
    assert [e for e in errs_of(job) if e.field == "spec.completeByTime"] == []
    sweep = full_sweep()
    sweep.spec.template.spec.complete_by_time = when
    assert [e for e in validate_sweep(sweep) if e.field == "spec.template.spec.completeByTime"] == []


def test_a_from_stage_input_outside_a_pipeline_is_forbidden_saying_where_it_works() -> None:
    job = msgspec.convert(
        {
            "metadata": {"name": "j"},
            "spec": {"image": "x", "inputs": [{"name": "w", "fromStage": {"stage": "s", "output": "o"}}]},
        },
        Job,
    )
    found = one(errs_of(job), "spec.inputs[0].fromStage")
    assert found.reason == FORB and "only in a Pipeline's stage" in found.message


def test_a_scaledown_window_up_to_20m_and_integration_auto_or_none_are_honoured() -> None:
    for window in ("0s", "5m", "20m"):
        job = minimal_job()
        job.spec.scaledown_window = window
        job.spec.recovery = Recovery(checkpoint=CheckpointPolicy(integration="None"))
        assert errs_of(job) == [], window


def test_the_full_examples_set_nothing_refused() -> None:
    assert validate_job(full_job()) == [] and validate_sweep(full_sweep()) == []


# -- metadata only Nodus sets ----------------------------------------------------------------------------

SWEEP_REF = OwnerReference(api_version="nodus.dev/v1", kind="Sweep", name="lr", uid="u1", controller=True)


def test_a_create_may_set_no_nodus_label_nor_a_sweeps_controller_reference() -> None:
    meta = ObjectMeta(
        name="lr-0",
        labels={"nodus.dev/sweep": "lr", "team": "ml", "x.nodus.dev/y": "z"},
        owner_references=[msgspec.structs.replace(SWEEP_REF, controller=False), SWEEP_REF],
    )
    errs = server_owned_errors(meta)
    assert {(e.field, e.reason) for e in errs} == {
        ("metadata.labels[nodus.dev/sweep]", FORB),
        ("metadata.labels[x.nodus.dev/y]", FORB),
        ("metadata.ownerReferences[1].controller", FORB),
    }
    assert "example.com/sweep" in one(errs, "metadata.labels[nodus.dev/sweep]").message
    assert server_owned_errors(ObjectMeta(name="a", labels={"team": "ml", "nodus.devx/y": "z"})) == []


def test_a_create_may_not_claim_to_be_a_pipelines_stage() -> None:
    ref = OwnerReference(api_version="nodus.dev/v1", kind="Pipeline", name="flow", uid="u9", controller=True)
    errs = server_owned_errors(ObjectMeta(name="flow-train", owner_references=[ref]))
    found = one(errs, "metadata.ownerReferences[0].controller")
    assert found.reason == FORB and "stage of Pipeline 'flow'" in found.message
    plain = msgspec.structs.replace(ref, controller=False)
    assert server_owned_errors(ObjectMeta(name="flow-train", owner_references=[plain])) == []


def test_an_update_may_keep_what_nodus_set_and_nothing_else() -> None:
    stored = ObjectMeta(
        name="lr-0", labels={"nodus.dev/sweep": "lr", "nodus.dev/cell": "0"}, owner_references=[SWEEP_REF]
    )
    kept = msgspec.structs.replace(stored, labels={**stored.labels, "team": "ml"})
    assert server_owned_errors(kept, stored) == []
    orphaned = msgspec.structs.replace(stored, owner_references=[])
    assert server_owned_errors(orphaned, stored) == []  # as propagationPolicy=Orphan does
    changed = msgspec.structs.replace(stored, labels={"nodus.dev/sweep": "other", "nodus.dev/cell": "0"})
    assert [e.field for e in server_owned_errors(changed, stored)] == ["metadata.labels[nodus.dev/sweep]"]
    removed = msgspec.structs.replace(stored, labels={"nodus.dev/sweep": "lr"})
    assert [e.field for e in server_owned_errors(removed, stored)] == ["metadata.labels[nodus.dev/cell]"]
    other = msgspec.structs.replace(SWEEP_REF, name="other", uid="u2")
    moved = msgspec.structs.replace(stored, owner_references=[other])
    assert [e.field for e in server_owned_errors(moved, stored)] == ["metadata.ownerReferences[0].controller"]


def test_server_labels() -> None:
    assert is_server_label("nodus.dev/sweep") and is_server_label("a.nodus.dev/b")
    assert not is_server_label("team") and not is_server_label("example.com/nodus.dev")


# -- names the catalog does not know -----------------------------------------------------------------------

CATALOG = Catalog(
    pricebook_version="2026-11-30.1",
    variants=[
        Variant(id="H100-SXM-80G", family="H100", memory="80Gi", interconnect="NVLink"),
        Variant(id="H100-PCIE-80G", family="H100", memory="80Gi"),
        Variant(id="L4", family="L4", memory="24Gi"),
        Variant(id="B200-SXM-180G", family="B200", memory="180Gi"),
    ],
    offerings=[
        Offering(
            id="h100-sxm-80g-x1-us",
            variant="H100-SXM-80G",
            gpus_per_node=1,
            region_class="us",
            rate_micros_per_hour=1,
        ),
    ],
    pricebooks=[
        PriceBook(version="2026-11-30.1", offerings=[]),
        PriceBook(
            version="2026-09-01.1",
            offerings=[
                Offering(
                    id="l4-x1-eu", variant="L4", gpus_per_node=1, region_class="eu", rate_micros_per_hour=1
                )
            ],
        ),
    ],
)
NAMES = known_names(CATALOG)


def test_known_names_are_variants_families_any_books_regions_and_offerings() -> None:
    spec = minimal_job().spec
    spec.resources = Resources(gpu=GPURequest(type=["h100", "H100-SXM-80G", "B200"]))
    spec.placement = Placement(regions=["us", "eu"], offerings=["l4-x1-eu"])
    assert unknown_job_names(spec, NAMES) == []


def test_unknown_names_are_invalid_on_their_field_with_the_closest_known() -> None:
    spec = minimal_job().spec
    spec.resources = Resources(gpu=GPURequest(type=["H100", "H10O", "NOSUCHGPU"]))
    spec.placement = Placement(regions=["mars", "ue"], offerings=["h100-sxm-80g-x1-uss"])
    errs = unknown_job_names(spec, NAMES)
    assert {e.field for e in errs} == {
        "spec.resources.gpu.type[1]",
        "spec.resources.gpu.type[2]",
        "spec.placement.regions[0]",
        "spec.placement.regions[1]",
        "spec.placement.offerings[0]",
    }
    assert all(e.reason == NOTSUP for e in errs)
    assert 'did you mean "H100"?' in one(errs, "spec.resources.gpu.type[1]").message
    assert "known: B200, B200-SXM-180G, H100" in one(errs, "spec.resources.gpu.type[2]").message
    assert "known: eu, us" in one(errs, "spec.placement.regions[0]").message
    assert 'did you mean "h100-sxm-80g-x1-us"?' in one(errs, "spec.placement.offerings[0]").message


def test_exact_needs_a_variant_not_a_family() -> None:
    spec = minimal_job().spec
    spec.resources = Resources(gpu=GPURequest(type=["H100"], exact=True))
    (error,) = unknown_job_names(spec, NAMES)
    assert (error.field, error.reason) == ("spec.resources.gpu.type[0]", INV)
    assert "H100-SXM-80G, H100-PCIE-80G" in error.message


def test_a_sweeps_matrix_and_template_names_have_their_own_paths() -> None:
    sweep: Sweep = full_sweep()
    sweep.spec.matrix = SweepMatrix(
        gpu=["H100:1", "NOSUCHGPU:1", GPURequest(type=["L4", "X"])], regions=["us", "mars"]
    )
    sweep.spec.template.spec.placement = Placement(regions=["us", "moon"])
    fields = {e.field for e in unknown_sweep_names(sweep.spec, NAMES)}
    assert fields == {
        "spec.matrix.gpu[1].type[0]",
        "spec.matrix.gpu[2].type[1]",
        "spec.matrix.regions[1]",
        "spec.template.spec.placement.regions[1]",
    }


def test_the_nodes_regions_and_offerings_are_known_too() -> None:
    node = Node(metadata=ObjectMeta(name="n"), spec=NodeSpec(offering="lab-x1", region_class="lab"))
    spec = minimal_job().spec
    spec.placement = Placement(regions=["lab"], offerings=["lab-x1"])
    assert len(unknown_job_names(spec, NAMES)) == 2
    assert unknown_job_names(spec, known_names(CATALOG, [node])) == []
