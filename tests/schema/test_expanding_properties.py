"""Matrix expansion and the Sweep's matrix rules, as properties over random matrices (hypothesis).

A matrix here has 0-16 GPU values mixing the string and object forms, 0-N regions out of the template's
(any, where the template names none), 0-4 params with 1-5 values and 1-64 repetitions, drawn so that the
product stays within the cell cap. What is checked against an independent ``itertools.product`` in the
documented order (gpu, region, params with names sorted and values as given, repetition innermost):
the count, the order, every combination exactly once, and each cell's Job. The refusals (17 GPU values,
repetitions 0 and 65, a region that widens the template's, a matrix over the cap) are properties too.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.examples import minimal_job_spec
from nodus_schema.expanding import PARAM_PREFIX, Cell, cell_count, cell_job, cell_job_name, expand
from nodus_schema.fielding import CauseType, FieldError
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import PHASES, EnvVar, Placement
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.sweeps import (
    CELL_LABEL,
    SWEEP_LABEL,
    WIDEST_COST_USD,
    WIDEST_OBJECT,
    WIDEST_UNITS_PER_SECOND,
    WIDEST_WALL_SECONDS,
    Sweep,
    SweepCell,
    SweepMatrix,
    SweepSpec,
    SweepTemplate,
    count_cells,
    widest_cells_bytes,
)
from nodus_schema.validating import (
    ALLOWED_GPU_COUNTS,
    MAX_CELLS,
    MAX_SWEEP_NAME,
    validate_job,
    validate_sweep,
)
from nodus_schema.wire import API_VERSION

# Every example expands and checks up to MAX_CELLS cells; hypothesis' default deadline (200 ms) is about
# the work, not a bug, so it is off.
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

GPU_TYPES = ("H100", "A100", "L4", "B200", "H200", "MI300X", "h100-sxm-80g", "a100-80g")
REGIONS = ("us", "eu", "asia", "apac", "sa", "me")
TEMPLATE_ENV = EnvVar(name="KEEP_ME", value="from the template")


@dataclass(frozen=True)
class Case:
    """A Sweep and, beside it, what its matrix means, written independently of the code under test."""

    sweep: Sweep
    gpus: list[GPURequest]  # the request each matrix GPU value stands for, in matrix order
    regions: list[str]
    params: dict[str, list[str]]
    repetitions: int


def _key(req: GPURequest) -> tuple[object, ...]:
    """What makes two GPU values the same request (validation refuses duplicates): defaults as written."""
    return (
        tuple(sorted(req.type)),
        req.count or 1,
        bool(req.exact),
        req.interconnect or "Any",
        req.min_memory,
    )


@st.composite
def gpu_values(draw: st.DrawFn) -> tuple[GPURequest | str, GPURequest]:
    """A matrix GPU value as written (the "H100,A100:2" form or an object) and the request it stands for."""
    types = draw(st.lists(st.sampled_from(GPU_TYPES), min_size=1, max_size=3, unique=True))
    if draw(st.booleans()):
        count = draw(st.sampled_from(ALLOWED_GPU_COUNTS))
        return f"{','.join(types)}:{count}", GPURequest(type=types, count=count)
    req = GPURequest(
        type=types,
        count=draw(st.sampled_from((None, *ALLOWED_GPU_COUNTS))),
        exact=draw(st.sampled_from((None, True))),
        interconnect=draw(st.sampled_from((None, "NVLink"))),
        min_memory=draw(st.sampled_from((None, "80Gi"))),
    )
    return req, req


param_names = st.from_regex(r"[A-Z0-9_]{1,10}", fullmatch=True)
# Values are free text (the program reads them from its env); short, so no Sweep grows near the size rule.
param_values = st.text(max_size=12)


@st.composite
def sweep_names(draw: st.DrawFn) -> str:
    return draw(st.from_regex(rf"[a-z]([-a-z0-9]{{0,{MAX_SWEEP_NAME - 2}}}[a-z0-9])?", fullmatch=True))


@st.composite
def cases(draw: st.DrawFn, limit: int = MAX_CELLS) -> Case:
    """A valid Sweep whose matrix expands to at most ``limit`` cells: each dimension takes what the
    dimensions before it leave of the limit."""
    budget = limit
    written = draw(
        st.lists(gpu_values(), max_size=min(16, budget), unique_by=lambda v: _key(v[1])),
    )
    budget //= max(len(written), 1)
    template_regions = draw(st.lists(st.sampled_from(REGIONS), max_size=4, unique=True))
    regions = draw(
        st.lists(
            st.sampled_from(template_regions or REGIONS),
            max_size=min(budget, len(template_regions or REGIONS)),
            unique=True,
        )
    )
    budget //= max(len(regions), 1)
    params: dict[str, list[str]] = {}
    for name in draw(st.lists(param_names, max_size=4, unique=True)):
        values = draw(st.lists(param_values, min_size=1, max_size=max(1, min(5, budget)), unique=True))
        params[name] = values
        budget //= len(values)
    repetitions = draw(st.integers(min_value=1, max_value=max(1, min(64, budget))))
    # A template without placement and one with an empty region list both allow any region.
    keep_placement = bool(template_regions) or draw(st.booleans())
    placement = Placement(regions=template_regions) if keep_placement else None
    template = msgspec.structs.replace(minimal_job_spec(), placement=placement, env=[TEMPLATE_ENV])
    sweep = Sweep(
        metadata=ObjectMeta(
            name=draw(sweep_names()), namespace="team-a", uid="uid-of-the-sweep", labels={"team": "a"}
        ),
        spec=SweepSpec(
            matrix=SweepMatrix(gpu=[w for w, _ in written], regions=regions, params=params),
            repetitions=repetitions,
            template=SweepTemplate(kind="Job", spec=template),
        ),
    )
    return Case(sweep, [req for _, req in written], regions, params, repetitions)


def reference(case: Case) -> list[tuple[GPURequest | None, str | None, tuple[tuple[str, str], ...], int]]:
    """Cell i's (gpu, region, params, repetition), straight from the documented order."""
    names = sorted(case.params)
    gpus: list[GPURequest | None] = [*case.gpus] or [None]
    regions: list[str | None] = [*case.regions] or [None]
    combos = itertools.product(
        gpus,
        regions,
        itertools.product(*(case.params[n] for n in names)),
        range(case.repetitions),
    )
    return [(gpu, region, tuple(zip(names, values, strict=True)), rep) for gpu, region, values, rep in combos]


def _combination(cell: Cell) -> tuple[object, ...]:
    gpu = None if cell.gpu is None else _key(cell.gpu)
    return (gpu, cell.region, cell.params, cell.repetition)


# ---------------------------------------------------------------------------------------------------------
# Expansion
# ---------------------------------------------------------------------------------------------------------


@PROPERTY
@given(cases())
def test_count_is_the_product_of_the_non_empty_dimensions(case: Case) -> None:
    sizes = [len(case.gpus), len(case.regions), *(len(v) for v in case.params.values())]
    expected = math.prod(s for s in sizes if s) * case.repetitions
    assert len(expand(case.sweep)) == expected
    assert count_cells(case.sweep.spec) == cell_count(case.sweep) == expected


@PROPERTY
@given(cases())
def test_order_is_gpu_region_sorted_params_repetition(case: Case) -> None:
    cells = expand(case.sweep)
    assert [c.index for c in cells] == list(range(len(cells)))
    assert [(c.gpu, c.region, c.params, c.repetition) for c in cells] == reference(case)


@PROPERTY
@given(cases())
def test_every_combination_appears_exactly_once(case: Case) -> None:
    cells = expand(case.sweep)
    seen = Counter(_combination(c) for c in cells)
    assert set(seen.values()) == {1}
    every = {
        (None if g is None else _key(g), r, p, rep) for g, r, p, rep in reference(case)
    }  # the full cross product, as a set
    assert set(seen) == every


@PROPERTY
@given(cases())
def test_gpu_text_tells_every_gpu_value_apart(case: Case) -> None:
    texts = {c.gpu_text for c in expand(case.sweep)}
    assert len(texts) == max(len(case.gpus), 1)
    assert (texts == {None}) == (not case.gpus)


# ---------------------------------------------------------------------------------------------------------
# Each cell's Job
# ---------------------------------------------------------------------------------------------------------


def _check_cell_job(case: Case, cell: Cell) -> None:
    sweep, template = case.sweep, case.sweep.spec.template.spec
    name = sweep.metadata.name or ""
    job = cell_job(sweep, cell)
    meta = job.metadata
    assert meta.name == cell_job_name(name, cell.index) == f"{name}-{cell.index}"
    assert meta.namespace == sweep.metadata.namespace
    assert meta.labels == {"team": "a", SWEEP_LABEL: name, CELL_LABEL: str(cell.index)}
    assert meta.owner_references == [
        OwnerReference(
            api_version=API_VERSION,
            kind="Sweep",
            name=name,
            uid="uid-of-the-sweep",
            controller=True,
            block_owner_deletion=True,
        )
    ]
    spec = job.spec
    # GPU: the cell's, or the template's where the matrix sweeps none.
    assert spec.resources is not None and template.resources is not None
    assert spec.resources.gpu == (cell.gpu if case.gpus else template.resources.gpu)
    assert msgspec.structs.replace(spec.resources, gpu=template.resources.gpu) == template.resources
    # Region: narrowed to the cell's one, or the template's placement untouched.
    if case.regions:
        assert spec.placement is not None and spec.placement.regions == [cell.region]
    else:
        assert spec.placement == template.placement
    # Params: NODUS_PARAM_<NAME> after the template's own env, which is kept.
    params = [EnvVar(name=PARAM_PREFIX + n, value=v) for n, v in cell.params]
    assert spec.env == [TEMPLATE_ENV, *params]
    assert {e.name: e.value for e in spec.env if (e.name or "").startswith(PARAM_PREFIX)} == {
        PARAM_PREFIX + n: v for n, v in cell.params
    }
    # Nothing else of the template changes.
    rest = msgspec.structs.replace(
        spec, resources=template.resources, placement=template.placement, env=template.env
    )
    assert rest == template


@PROPERTY
@given(cases())
def test_each_cell_job_carries_its_cell(case: Case) -> None:
    for cell in expand(case.sweep):
        _check_cell_job(case, cell)


@PROPERTY
@given(cases())
def test_the_sweep_and_its_first_and_last_cell_jobs_are_valid(case: Case) -> None:
    assert validate_sweep(case.sweep) == []
    assert validate_sweep(default_sweep(case.sweep)) == []
    cells = expand(case.sweep)
    for cell in {cells[0].index: cells[0], cells[-1].index: cells[-1]}.values():
        assert validate_job(default_job(cell_job(case.sweep, cell))) == []


@PROPERTY
@given(cases(), st.data())
def test_an_empty_dimension_keeps_the_templates_value(case: Case, data: st.DataObject) -> None:
    """Emptying any one dimension leaves that part of every cell Job as the template has it."""
    dimension = data.draw(st.sampled_from(("gpu", "regions", "params")))
    empty: dict[str, object] = {"gpu": [], "regions": [], "params": {}}
    matrix = msgspec.structs.replace(case.sweep.spec.matrix, **{dimension: empty[dimension]})
    sweep = msgspec.structs.replace(case.sweep, spec=msgspec.structs.replace(case.sweep.spec, matrix=matrix))
    template = sweep.spec.template.spec
    for cell in expand(sweep):
        spec = cell_job(sweep, cell).spec
        if dimension == "gpu":
            assert cell.gpu is None and spec.resources == template.resources
        elif dimension == "regions":
            assert cell.region is None and spec.placement == template.placement
        else:
            assert cell.params == () and spec.env == template.env


# ---------------------------------------------------------------------------------------------------------
# The status rows' size bound
# ---------------------------------------------------------------------------------------------------------


@PROPERTY
@given(cases())
def test_widest_cells_bytes_is_the_size_of_the_widest_rows(case: Case) -> None:
    """The bound the cap and the size rule rest on is exact for the matrix: the JSON of every row with the
    cell's gpu, region and params and the widest values the controller can copy in."""
    rows = [
        SweepCell(
            index=c.index,
            repetition=c.repetition,
            gpu=c.gpu_text,
            region=c.region,
            params=dict(c.params),
            object="x" * WIDEST_OBJECT,
            phase=max(PHASES, key=len),
            cost_usd=WIDEST_COST_USD,
            units_per_second="9" * WIDEST_UNITS_PER_SECOND,
            wall_seconds=WIDEST_WALL_SECONDS,
            lost_gpu_seconds=WIDEST_WALL_SECONDS,
            recovery_usd=WIDEST_COST_USD,
        )
        for c in expand(case.sweep)
    ]
    assert widest_cells_bytes(case.sweep.spec) == len(msgspec.json.encode(rows))


# ---------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------


def _errors(sweep: Sweep) -> list[FieldError]:
    """The errors as sent and after defaulting: the gateway validates the defaulted object, and both must
    name the user's own field."""
    sent, defaulted = validate_sweep(sweep), validate_sweep(default_sweep(sweep))
    assert {(e.field, e.reason) for e in sent} == {(e.field, e.reason) for e in defaulted}
    return sent


def _with(case: Case, **changes: object) -> Sweep:
    spec = case.sweep.spec
    matrix_changes = {k: v for k, v in changes.items() if k in ("gpu", "regions", "params")}
    spec = msgspec.structs.replace(spec, matrix=msgspec.structs.replace(spec.matrix, **matrix_changes))
    if "repetitions" in changes:
        spec = msgspec.structs.replace(spec, repetitions=changes["repetitions"])
    if "template_regions" in changes:
        placement = Placement(regions=changes["template_regions"])  # type: ignore[arg-type]
        template = msgspec.structs.replace(spec.template.spec, placement=placement)
        spec = msgspec.structs.replace(spec, template=msgspec.structs.replace(spec.template, spec=template))
    return msgspec.structs.replace(case.sweep, spec=spec)


@PROPERTY
@given(cases(limit=1), st.lists(gpu_values(), min_size=17, max_size=17, unique_by=lambda v: _key(v[1])))
def test_seventeen_gpu_values_are_refused(
    case: Case, written: list[tuple[GPURequest | str, GPURequest]]
) -> None:
    errors = _errors(_with(case, gpu=[w for w, _ in written]))
    assert [e.field for e in errors if e.reason == CauseType.TOO_MANY] == ["spec.matrix.gpu"]


@PROPERTY
@given(cases(), st.sampled_from((0, 65)))
def test_repetitions_outside_1_to_64_are_refused(case: Case, repetitions: int) -> None:
    errors = _errors(_with(case, repetitions=repetitions))
    assert ("spec.repetitions", CauseType.INVALID) in {(e.field, e.reason) for e in errors}


@PROPERTY
@given(
    st.lists(st.sampled_from(REGIONS), min_size=1, max_size=5, unique=True),
    st.lists(st.sampled_from(REGIONS), min_size=1, max_size=6, unique=True),
    cases(limit=1),
)
def test_a_region_outside_the_templates_is_refused_at_its_index(
    template_regions: list[str], regions: list[str], case: Case
) -> None:
    errors = _errors(_with(case, regions=regions, template_regions=template_regions))
    refused = {e.field: e for e in errors if e.field.startswith("spec.matrix.regions")}
    outside = {f"spec.matrix.regions[{i}]" for i, r in enumerate(regions) if r not in template_regions}
    assert set(refused) == outside
    for e in refused.values():
        assert e.reason == CauseType.NOT_SUPPORTED and "placement.regions" in e.message


@PROPERTY
@given(cases(limit=64), st.integers(min_value=0, max_value=200))
def test_a_matrix_over_the_cap_is_refused_with_its_count(case: Case, extra: int) -> None:
    """One more param with just enough values to pass the cap (and a few more): refused on the matrix with
    the count, its factors and the cap; nothing else is said about its size."""
    base = count_cells(case.sweep.spec)
    values = [f"v{i}" for i in range(MAX_CELLS // base + 1 + extra)]
    sweep = _with(case, params={**case.params, "ZZ_OVER_CAP_": values})
    cells = count_cells(sweep.spec)
    assert cells > MAX_CELLS
    errors = [e for e in _errors(sweep) if e.field == "spec.matrix"]
    assert [e.reason for e in errors] == [CauseType.TOO_MANY]
    (error,) = errors
    assert f"{cells} cells" in error.message and f"{len(values)} ZZ_OVER_CAP_" in error.message
    assert f"at most {MAX_CELLS}" in error.message
