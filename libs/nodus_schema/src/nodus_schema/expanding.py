"""A Sweep's matrix expanded into cells, and each cell's Job: the order and naming the design fixes.

Cell order: gpu values, then regions, then params (names sorted, values as given), repetition innermost.
An empty dimension keeps the template's value. Cell ``i`` is the Job ``<sweep>-<i>``, labelled
``nodus.dev/sweep`` and ``nodus.dev/cell`` and owned by the Sweep; its params reach the program as
``NODUS_PARAM_<NAME>``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import msgspec

from nodus_schema.gpus import GPURequest, as_gpu_request
from nodus_schema.jobs import EnvVar, Job, JobSpec, Placement, Resources
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.sweeps import CELL_LABEL, SWEEP_LABEL, Sweep, cell_gpu_text, count_cells
from nodus_schema.wire import API_VERSION

PARAM_PREFIX = "NODUS_PARAM_"


@dataclass(frozen=True, slots=True)
class Cell:
    index: int
    gpu: GPURequest | None
    region: str | None
    params: tuple[tuple[str, str], ...]
    repetition: int

    @property
    def gpu_text(self) -> str | None:
        """The cell's GPU as its status row shows it (``"H100:8"``), None where the matrix sweeps none."""
        return None if self.gpu is None else cell_gpu_text(self.gpu)


def cell_count(sweep: Sweep) -> int:
    return count_cells(sweep.spec)


def expand(sweep: Sweep) -> list[Cell]:
    m = sweep.spec.matrix
    gpus: list[GPURequest | None] = [as_gpu_request(g) for g in m.gpu] or [None]
    regions: list[str | None] = list(m.regions) or [None]
    names = sorted(m.params)
    value_lists = [m.params[n] for n in names]
    reps = range(sweep.spec.repetitions or 1)
    cells = []
    for i, (gpu, region, values, rep) in enumerate(
        itertools.product(gpus, regions, itertools.product(*value_lists), reps)
    ):
        cells.append(Cell(i, gpu, region, tuple(zip(names, values, strict=True)), rep))
    return cells


def cell_job_name(sweep_name: str, index: int) -> str:
    return f"{sweep_name}-{index}"


def cell_job(sweep: Sweep, cell: Cell) -> Job:
    """The Job a cell creates: the template with the cell's GPU, region and params applied."""
    spec: JobSpec = sweep.spec.template.spec
    if cell.gpu is not None:
        resources = spec.resources or Resources()
        spec = msgspec.structs.replace(spec, resources=msgspec.structs.replace(resources, gpu=cell.gpu))
    if cell.region is not None:
        placement = spec.placement or Placement()
        spec = msgspec.structs.replace(
            spec, placement=msgspec.structs.replace(placement, regions=[cell.region])
        )
    if cell.params:
        overridden = {PARAM_PREFIX + name for name, _ in cell.params}
        env = [e for e in spec.env if e.name not in overridden]
        env += [EnvVar(name=PARAM_PREFIX + name, value=value) for name, value in cell.params]
        spec = msgspec.structs.replace(spec, env=env)
    meta = sweep.metadata
    owner = OwnerReference(
        api_version=API_VERSION,
        kind="Sweep",
        name=meta.name or "",
        uid=meta.uid or "",
        controller=True,
        block_owner_deletion=True,
    )
    labels = {**meta.labels, SWEEP_LABEL: meta.name or "", CELL_LABEL: str(cell.index)}
    return Job(
        metadata=ObjectMeta(
            name=cell_job_name(meta.name or "", cell.index),
            namespace=meta.namespace,
            labels=labels,
            owner_references=[owner],
        ),
        spec=spec,
    )
