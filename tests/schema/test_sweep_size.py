"""A Sweep at the cell cap, its status full, fits one bus message (ADR-0025); one that could not is refused.

A Sweep is stored as one KV value, status and all, and nats-server refuses a message over its
``max_payload`` (1 MiB; the stack does not change it). The Sweeps here are the worst realistic ones at
:data:`MAX_CELLS`: long param values, GPU values in both forms with qualifiers, the longest Sweep name (so
63-character cell names), every row filled as the controller fills it, and the conditions, cost, best and
estimate a finished capped Sweep carries. They are measured, stored in and read back from a real
nats-server's ``sweeps`` bucket; a Sweep whose rows could outgrow a message is refused at validation.
"""

from __future__ import annotations

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_kit.storing import ObjectStore
from nodus_schema.costs import (
    BlockingReason,
    Cost,
    CostSegments,
    DurationBand,
    Estimate,
    EstimateWarning,
    PlacementPreview,
    StartupEstimate,
    USDBand,
)
from nodus_schema.defaulting import default_sweep
from nodus_schema.examples import full_job_spec
from nodus_schema.expanding import cell_job_name, expand
from nodus_schema.fielding import CauseType
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import Placement, Resources
from nodus_schema.meta import Condition, ObjectMeta
from nodus_schema.sweeps import (
    Sweep,
    SweepBest,
    SweepCell,
    SweepMatrix,
    SweepSpec,
    SweepStatus,
    SweepTemplate,
    count_cells,
)
from nodus_schema.validating import (
    BUS_MAX_PAYLOAD,
    MAX_CELLS,
    MAX_SWEEP_BYTES,
    MAX_SWEEP_NAME,
    STATUS_BESIDES_CELLS,
    validate_sweep,
    widest_sweep_bytes,
)

LONG_NAME = "hyperparameter-search-llama-70b-instruct-finetune-q3-" + "x" * 10
NAME = LONG_NAME[:MAX_SWEEP_NAME]
TIME = "2026-11-30T10:05:00Z"


def _matrix_at_the_cap() -> tuple[SweepMatrix, int]:
    """4 GPU values x 2 regions x 4 models x 4 learning rates x 2 optimizers x 4 repetitions = 1024."""
    gpus: list[GPURequest | str] = [
        "H100-SXM-80G,H200-SXM-141G:8",
        GPURequest(type=["B200-SXM-180G", "H200-SXM-141G"], count=8, exact=True, interconnect="NVLink"),
        GPURequest(type=["A100-SXM-80G"], count=8, min_memory="80Gi"),
        "MI300X,H100-PCIE-80G:8",
    ]
    params = {
        "MODEL_NAME_OR_PATH": [
            "meta-llama/Llama-3.1-70B-Instruct",
            "mistralai/Mixtral-8x22B-Instruct-v0.1",
            "Qwen/Qwen2.5-72B-Instruct",
            "s3://acme-models/checkpoints/llama-70b/step-120000",
        ],
        "LEARNING_RATE": ["0.00001", "0.00002", "0.00005", "0.0001"],
        "OPTIMIZER": ["adamw_torch_fused", "paged_adamw_8bit"],
    }
    return SweepMatrix(gpu=gpus, regions=["us", "asia"], params=params), 4


def _template() -> SweepTemplate:
    spec = full_job_spec()  # a realistic full template: inputs, outputs, env, recovery, a gang
    spec.resources = Resources(cpu="32", memory="256Gi", gpu="H100:8")  # where the matrix sweeps no GPUs
    spec.placement = Placement(regions=["us", "eu", "asia"])
    return SweepTemplate(kind="Job", spec=spec)


def _row(sweep: Sweep, index: int) -> SweepCell:
    """A finished cell's row at realistic widths: a cost in the thousands, a 28-digit mean throughput."""
    return SweepCell(
        index=index,
        repetition=index % 4,
        object=cell_job_name(sweep.metadata.name or "", index),
        phase="Succeeded",
        cost_usd=f"{12345 + index}.678901",
        units_per_second=f"{812 + index}.1234567890123456789012345",
        wall_seconds=2_592_000 + index,
    )


def _full_status(sweep: Sweep) -> SweepStatus:
    """The status a finished, capped, estimated Sweep carries, every part filled."""
    rows = []
    m = sweep.spec.matrix
    for cell in expand(sweep):
        row = _row(sweep, cell.index)
        rows.append(
            msgspec.structs.replace(
                row,
                repetition=cell.repetition,
                gpu=cell.gpu_text if m.gpu else None,
                region=cell.region if m.regions else None,
                params=dict(cell.params),
            )
        )
    failed = ", ".join(f"#{i}" for i in range(1000, 1010))
    conditions = [
        Condition(
            type="Failed",
            status="True",
            reason="CellsFailed",
            message=f"10 of {len(rows)} cells failed: {failed}",
            last_transition_time=TIME,
            observed_generation=3,
        ),
        Condition(
            type="ProjectedOverCap",
            status="True",
            reason="ProjectedOverCap",
            message=(
                "at the mean of 1014 finished cells ($12345.678901 each), the 10 cells left need about "
                "$123456.789010; $1234.567890 is left under maxCostUSD $12600000.000000"
            ),
            last_transition_time=TIME,
            observed_generation=3,
        ),
    ]
    usd = "12640000.123456"
    cost = Cost(
        total_usd=usd,
        held_usd="98765.432100",
        limit_usd="12600000.000000",
        rate_usd_per_hour="2345.678901",
        funded_until_time=TIME,
        final=True,
        by_segment=CostSegments(
            boot_usd=usd,
            running_usd=usd,
            restore_usd=usd,
            teardown_usd=usd,
            covered_by_nodus=["Boot", "Running", "Restore", "Teardown"],
        ),
    )
    band = USDBand(p50=usd, p90=usd)
    durations = DurationBand(p50="4m30s", p90="12m15s")
    estimate = Estimate(
        assembly_bound_usd=usd,
        concurrent_hold_usd=usd,
        cost_usd=band,
        overhead_usd=band,
        gang_hold_usd=usd,
        hold_usd=usd,
        minimum_charge_usd="0.050000",
        pricebook_version="2026-11-30.3",
        rate_usd_per_hour="2345.678901",
        valid_until=TIME,
        topology="2x8",
        startup=StartupEstimate(cold=durations, warm=durations),
        placement_preview=PlacementPreview(
            explain="cheapest of 12 fitting offerings: h200-sxm-141g-x8-asia at $31.92/h; " * 4,
            interruptible=False,
            offering="h200-sxm-141g-x8-asia",
            region_class="asia",
            warm_reuse=True,
        ),
        blocking_reasons=[
            BlockingReason(
                code=code,
                message="the first hold of $9876.543210 does not fit: $1234.567890 is left " * 2,
                fix="Raise spec.maxCostUSD, grant credits (`nodus credits grant`), or lower maxParallel.",
            )
            for code in ("InsufficientCredits", "BudgetExceeded", "MaxCostReached")
        ],
        warnings=[
            EstimateWarning(code=code, message="no warm capacity in asia; a cold start takes 4m30s-12m15s")
            for code in ("ColdStart", "InterruptibleSelected")
        ],
    )
    return SweepStatus(
        cells=rows,
        best=SweepBest(by_cost=0, by_throughput=len(rows) - 1),
        completion_time=TIME,
        start_time=TIME,
        conditions=conditions,
        cost=cost,
        estimate=estimate,
        message=f"10 of {len(rows)} cells failed: {failed}",
        observed_generation=3,
        phase="Failed",
        reason="CellsFailed",
    )


def sweep_at_the_cap(matrix: SweepMatrix | None = None, repetitions: int | None = None) -> Sweep:
    default_matrix, default_reps = _matrix_at_the_cap()
    sweep = Sweep(
        metadata=ObjectMeta(
            name=NAME,
            namespace="team-research",
            labels={"team": "research", "project": "llama-70b-finetune"},
            annotations={"nodus.dev/stop-early": "true"},
        ),
        spec=SweepSpec(
            matrix=matrix or default_matrix,
            repetitions=repetitions or default_reps,
            max_cost_usd="12600000",
            max_parallel=256,
            template=_template(),
        ),
    )
    return default_sweep(sweep)


def _size(obj: object) -> int:
    return len(msgspec.json.encode(obj))


@pytest.mark.parametrize(
    ("matrix", "repetitions"),
    [
        (None, None),
        # Every GPU value the matrix takes, each repeated the most times: the other way to reach the cap.
        (SweepMatrix(gpu=[f"H100-SXM-80G,TYPE-{i:02d}-X:8" for i in range(16)]), 64),
    ],
    ids=["long params", "16 gpu x 64 repetitions"],
)
def test_a_full_status_at_the_cap_fits_one_message(
    matrix: SweepMatrix | None, repetitions: int | None
) -> None:
    sweep = sweep_at_the_cap(matrix, repetitions)
    assert count_cells(sweep.spec) == MAX_CELLS
    assert validate_sweep(sweep) == []
    full = msgspec.structs.replace(sweep, status=_full_status(sweep))
    size = _size(full)
    # With margin: well inside what a Sweep may take, which leaves room for headers and store fields.
    assert size <= 0.6 * MAX_SWEEP_BYTES < MAX_SWEEP_BYTES < BUS_MAX_PAYLOAD
    # The bound validation uses is never below the real thing, here or at any width the rows can take.
    assert size <= widest_sweep_bytes(sweep)
    besides_cells = _size(msgspec.structs.replace(full.status, cells=[]))
    assert besides_cells <= STATUS_BESIDES_CELLS // 4


def test_the_old_cap_of_10000_cells_could_not_fit() -> None:
    """Why the cap is 1,024 (ADR-0025): 10,000 rows like these are several messages' worth."""
    sweep = sweep_at_the_cap()
    per_row = _size(_full_status(sweep).cells) / MAX_CELLS
    assert 10_000 * per_row > 3 * BUS_MAX_PAYLOAD
    assert 2 * MAX_CELLS * per_row > 0.75 * MAX_SWEEP_BYTES  # and twice the cap would leave little margin


def test_long_param_values_that_would_outgrow_a_message_are_refused() -> None:
    """Few enough cells, but each row repeats its long params: refused at spec.matrix, with the sizes."""
    matrix = SweepMatrix(params={"PROMPT": [f"{i:04d} " + "p" * 1500 for i in range(32)]})
    sweep = sweep_at_the_cap(matrix, 32)  # 1024 cells of 1.5 KB of params each
    errors = [e for e in validate_sweep(sweep) if e.field == "spec.matrix"]
    assert [e.reason for e in errors] == [CauseType.TOO_LONG]
    (error,) = errors
    assert f"must be at most {MAX_SWEEP_BYTES}" in error.message and "1024 cells" in error.message
    assert (
        f"{widest_sweep_bytes(sweep)} bytes" in error.message and "shorten the param values" in error.message
    )
    # The same values over fewer cells fit.
    assert validate_sweep(sweep_at_the_cap(matrix, 8)) == []


def test_the_size_rule_counts_the_rest_of_the_object() -> None:
    """Metadata is stored in the same value: big annotations leave less room for rows."""
    matrix = SweepMatrix(params={"PROMPT": [f"{i:04d} " + "p" * 500 for i in range(32)]})
    sweep = sweep_at_the_cap(matrix, 32)
    assert validate_sweep(sweep) == []
    big = {
        f"example.com/note-{i}": "n" * 60_000 for i in range(4)
    }  # 240 KB, under the 256 KiB of annotations
    noted = msgspec.structs.replace(sweep, metadata=msgspec.structs.replace(sweep.metadata, annotations=big))
    assert [(e.field, e.reason) for e in validate_sweep(noted)] == [("spec.matrix", CauseType.TOO_LONG)]


async def test_the_bus_limit_is_what_the_rule_assumes_and_the_sweep_round_trips(
    nc: NATS, unique: str
) -> None:
    """Against the real nats-server: its max_payload is BUS_MAX_PAYLOAD, and the Sweep at the cap is
    created and then written with its full status (as the controller writes it) and read back whole."""
    assert nc.max_payload == BUS_MAX_PAYLOAD
    sweeps = ObjectStore(nc, "sweeps", Sweep)
    sweep = sweep_at_the_cap()
    sweep = msgspec.structs.replace(sweep, metadata=msgspec.structs.replace(sweep.metadata, namespace=unique))
    created = await sweeps.create(sweep)
    status = _full_status(created)
    written = await sweeps.update(msgspec.structs.replace(created, status=status))
    got = await sweeps.get(unique, NAME)
    assert got.status == status and len(got.status.cells) == MAX_CELLS
    assert got.metadata.resource_version == written.metadata.resource_version
