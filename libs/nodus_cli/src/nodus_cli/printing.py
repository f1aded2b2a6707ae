"""How ``nodus get`` prints every kind: its columns (the default ones, and the ``-o wide`` extras), rows,
tables and ``-o name``.

The default columns are the gateway's Table columns (tabling.py: what ``kubectl get`` shows) with the CLI's
additions that tests and scripts already read (a Sweep's BEST, a Job's GPU and WALL); a phase carries its
reason in parentheses, as the gateway's priority-1 REASON column does in kubectl's ``-o wide``. ``-o wide``
adds where and at what price things run: node, GPU, region, rate, cost limits. Money is printed exactly as
the API spells it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from nodus_cli.kinds import (
    ATTEMPT,
    BUDGET,
    CONNECTION,
    JOB,
    NODE,
    OFFERING,
    PIPELINE,
    SECRET,
    SERVICE_ACCOUNT,
    SWEEP,
    VOLUME,
    WORKSPACE,
    Kind,
)
from nodus_cli.pipelines import spent as pipeline_spent
from nodus_cli.pipelines import stages_done
from nodus_cli.tables import (
    NONE,
    age,
    cells_done,
    gpu_text,
    phase_text,
    short_digest,
    size_text,
    spent,
    table,
    usd,
    wall,
)
from nodus_schema import Job, Sweep
from nodus_schema.attempts import Attempt
from nodus_schema.billing import Budget
from nodus_schema.configs import Connection, Secret
from nodus_schema.nodes import Node
from nodus_schema.offerings import Offering
from nodus_schema.pipelines import Pipeline
from nodus_schema.quantities import micros_to_usd
from nodus_schema.volumes import Volume, revision_of


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    cell: Callable[[Any], str]
    wide: bool = False
    """Only with ``-o wide``."""


def _rate(amount: str | None) -> str:
    return f"${amount}/h" if amount else NONE


def _yes(flag: bool | None) -> str:
    return "yes" if flag else "no"


def _name(obj: Any) -> str:
    return str(obj.metadata.name or NONE)


def _age(obj: Any) -> str:
    return age(obj.metadata.creation_timestamp)


NAME: Final = Column("NAME", _name)
AGE: Final = Column("AGE", _age)


# -- Sweeps ---------------------------------------------------------------------------------------------
def _sweep_gpu(s: Sweep) -> str:
    if s.spec.matrix.gpu:
        return ",".join(gpu_text(g) for g in s.spec.matrix.gpu)
    resources = s.spec.template.spec.resources
    return gpu_text(resources.gpu if resources else None)


def _sweep_regions(s: Sweep) -> str:
    if s.spec.matrix.regions:
        return ",".join(s.spec.matrix.regions)
    placement = s.spec.template.spec.placement
    return ",".join(placement.regions) if placement and placement.regions else NONE


def _best(which: str) -> Callable[[Sweep], str]:
    def cell(s: Sweep) -> str:
        best = s.status.best
        index = getattr(best, which) if best else None
        return f"#{index}" if index is not None else NONE

    return cell


SWEEP_COLUMNS: Final = (
    NAME,
    Column("PHASE", lambda s: phase_text(s.status.phase, s.status.reason)),
    Column("CELLS", lambda s: "{}/{}".format(*cells_done(s))),
    Column("SPENT", spent),
    Column("BEST", _best("by_cost")),
    AGE,
    Column("BEST-THROUGHPUT", _best("by_throughput"), wide=True),
    Column("RATE", lambda s: _rate(s.status.cost.rate_usd_per_hour if s.status.cost else None), wide=True),
    Column("GPU", _sweep_gpu, wide=True),
    Column("REGIONS", _sweep_regions, wide=True),
    Column("MAX-COST", lambda s: usd(s.spec.max_cost_usd), wide=True),
)


# -- Jobs -----------------------------------------------------------------------------------------------
def _job_gpu(j: Job) -> str:
    return gpu_text(j.spec.resources.gpu if j.spec.resources else None)


def _job_regions(j: Job) -> str:
    placement = j.spec.placement
    return ",".join(placement.regions) if placement and placement.regions else NONE


def _count(value: int | None) -> str:
    return str(value) if value is not None else NONE


JOB_COLUMNS: Final = (
    NAME,
    Column("PHASE", lambda j: phase_text(j.status.phase, j.status.reason)),
    Column("GPU", _job_gpu),
    Column("COMPLETIONS", lambda j: f"{j.status.succeeded or 0}/{j.spec.completions or 1}"),
    Column("WALL", lambda j: wall(j.status.wall_seconds)),
    Column("UNITS/S", lambda j: j.status.units_per_second or NONE),
    Column("SPENT", lambda j: usd(j.status.cost.total_usd if j.status.cost else None)),
    AGE,
    Column("RATE", lambda j: _rate(j.status.cost.rate_usd_per_hour if j.status.cost else None), wide=True),
    Column("REGIONS", _job_regions, wide=True),
    Column("ATTEMPTS", lambda j: _count(j.status.attempts), wide=True),
    Column("TOPOLOGY", lambda j: j.status.topology or NONE, wide=True),
    Column("MAX-COST", lambda j: usd(j.spec.max_cost_usd), wide=True),
)


# -- Pipelines (issue #22) ----------------------------------------------------------------------------------
def _estimate_p50(p: Pipeline) -> str:
    band = p.status.estimate.cost_usd if p.status.estimate else None
    return usd(band.p50 if band else None)


PIPELINE_COLUMNS: Final = (
    NAME,
    Column("STAGES", lambda p: "{}/{}".format(*stages_done(p))),
    Column("PHASE", lambda p: phase_text(p.status.phase, p.status.reason)),
    Column("COST", pipeline_spent),
    AGE,
    Column("RATE", lambda p: _rate(p.status.cost.rate_usd_per_hour if p.status.cost else None), wide=True),
    Column("ESTIMATE", _estimate_p50, wide=True),
    Column("MAX-COST", lambda p: usd(p.spec.max_cost_usd), wide=True),
)


# -- Budgets, Attempts, Nodes, Offerings, Connections, Secrets -----------------------------------------------
BUDGET_COLUMNS: Final = (
    NAME,
    Column("MONTHLY", lambda b: usd(b.spec.monthly_usd)),
    Column("USED", lambda b: usd(b.status.used_usd)),
    Column("MONTH", lambda b: b.status.month or NONE),
    Column(
        "SELECTOR",
        lambda b: ", ".join(f"{k}={v}" for k, v in sorted(b.spec.selector.items())) or "(every Job)",
    ),
    AGE,
)


def _attempt_wall(a: Attempt) -> str:
    millis = a.status.wall_millis
    return wall(millis // 1000) if millis is not None else NONE


def _attempt_interruptible(a: Attempt) -> str:
    placement = a.status.placement
    return _yes(placement.interruptible) if placement and placement.interruptible is not None else NONE


ATTEMPT_COLUMNS: Final = (
    NAME,
    Column("JOB", lambda a: a.spec.job),
    Column("INDEX", lambda a: str(a.spec.index)),
    Column("PHASE", lambda a: phase_text(a.status.phase, a.status.reason)),
    Column("NODE", lambda a: a.spec.node or NONE),
    Column("WALL", _attempt_wall),
    AGE,
    Column("GPU", lambda a: a.spec.gpu_variant or NONE, wide=True),
    Column("OFFERING", lambda a: a.spec.offering or NONE, wide=True),
    Column("REGION", lambda a: a.spec.region_class or NONE, wide=True),
    Column("RATE", lambda a: _rate(micros_to_usd(a.spec.rate_micros_per_hour)), wide=True),
    Column("INTERRUPTIBLE", _attempt_interruptible, wide=True),
    Column("EXIT", lambda a: _count(a.status.exit_code), wide=True),
)


def _node_gpus(n: Node) -> str:
    gpus = n.status.gpus
    return f"{sum(1 for g in gpus if g.healthy)}/{len(gpus)}" if gpus else NONE


NODE_COLUMNS: Final = (
    NAME,
    Column("PHASE", lambda n: n.status.phase or "Pending"),
    Column("OFFERING", lambda n: n.spec.offering or NONE),
    Column("REGION", lambda n: n.spec.region_class or NONE),
    Column("GPUS", _node_gpus),
    AGE,
    Column("GPU", lambda n: ",".join(sorted({g.variant for g in n.status.gpus})) or NONE, wide=True),
    Column("POOL", lambda n: n.spec.pool or NONE, wide=True),
    Column("INTERRUPTIBLE", lambda n: _yes(n.spec.interruptible), wide=True),
    Column("HEARTBEAT", lambda n: age(n.status.last_heartbeat_time), wide=True),
    Column("AGENT", lambda n: n.status.agent_version or NONE, wide=True),
)


def on_demand_rate(o: Offering) -> str | None:
    """The on-demand rate of an offering; None for one that sells interruptible capacity only."""
    return None if o.spec.interruptible else o.spec.rate_usd_per_hour


def interruptible_rate(o: Offering) -> str | None:
    """The interruptible rate; None for an offering that sells no interruptible capacity."""
    return o.spec.rate_usd_per_hour if o.spec.interruptible else o.spec.interruptible_rate_usd_per_hour


OFFERING_COLUMNS: Final = (
    NAME,
    Column("VARIANT", lambda o: o.spec.variant),
    Column("GPUS", lambda o: str(o.spec.gpus_per_node)),
    Column("REGION", lambda o: o.spec.region_class),
    Column("RATE", lambda o: _rate(on_demand_rate(o))),
    Column("INTERRUPTIBLE", lambda o: _rate(interruptible_rate(o))),
    Column("PROVIDER", lambda o: o.spec.provider, wide=True),
    Column("PRICEBOOK", lambda o: o.spec.pricebook_version, wide=True),
    Column("CPU", lambda o: o.spec.host.cpu if o.spec.host else NONE, wide=True),
    Column("MEMORY", lambda o: o.spec.host.memory if o.spec.host else NONE, wide=True),
)


def _connection_type(c: Connection) -> str:
    return c.spec.type or NONE


def _secret_keys(s: Secret) -> str:
    return str(len(s.data))


# -- Volumes and Workspaces (ADR-0036) -----------------------------------------------------------------------
def _latest_size(v: Volume) -> str:
    rev = revision_of(v, None)
    return size_text(rev.size_bytes) if rev else NONE


def _latest_digest(v: Volume) -> str:
    rev = revision_of(v, None)
    return short_digest(rev.digest) if rev else NONE


VOLUME_COLUMNS: Final = (
    NAME,
    Column("LATEST", lambda v: str(v.status.latest) if v.status.latest is not None else NONE),
    Column("SIZE", _latest_size),
    Column("WRITER", lambda v: v.status.writer.job if v.status.writer else NONE),
    AGE,
    Column("REVISIONS", lambda v: str(len(v.status.revisions)), wide=True),
    Column("DIGEST", _latest_digest, wide=True),
)
WORKSPACE_COLUMNS: Final = (
    NAME,
    Column("FILES", lambda w: str(w.status.files)),
    Column("SIZE", lambda w: size_text(w.status.size_bytes)),
    AGE,
    Column("UPDATED", lambda w: age(w.status.update_time), wide=True),
)


COLUMNS: Final[dict[str, tuple[Column, ...]]] = {
    SWEEP.kind: SWEEP_COLUMNS,
    JOB.kind: JOB_COLUMNS,
    BUDGET.kind: BUDGET_COLUMNS,
    ATTEMPT.kind: ATTEMPT_COLUMNS,
    NODE.kind: NODE_COLUMNS,
    OFFERING.kind: OFFERING_COLUMNS,
    CONNECTION.kind: (NAME, Column("TYPE", _connection_type), AGE),
    SECRET.kind: (NAME, Column("TYPE", lambda s: s.type), Column("KEYS", _secret_keys), AGE),
    VOLUME.kind: VOLUME_COLUMNS,
    WORKSPACE.kind: WORKSPACE_COLUMNS,
    SERVICE_ACCOUNT.kind: (NAME, Column("ROLE", lambda a: a.spec.role or NONE), AGE),
    PIPELINE.kind: PIPELINE_COLUMNS,
}


def columns(kind: Kind, *, wide: bool = False) -> tuple[Column, ...]:
    return tuple(c for c in COLUMNS.get(kind.kind, (NAME, AGE)) if wide or not c.wide)


def headers(kind: Kind, *, wide: bool = False) -> list[str]:
    return [c.header for c in columns(kind, wide=wide)]


def row(kind: Kind, obj: Any, *, wide: bool = False) -> list[str]:
    return [c.cell(obj) for c in columns(kind, wide=wide)]


def list_table(kind: Kind, objects: Sequence[Any], *, wide: bool = False) -> str:
    return table(headers(kind, wide=wide), [row(kind, o, wide=wide) for o in objects])


def names(kind: Kind, objects: Sequence[Any]) -> str:
    """``-o name``: ``sweep.nodus.dev/lr``, one a line, as kubectl prints them."""
    return "\n".join(kind.ref(o.metadata.name or "") for o in objects)


# The list views tests and other modules call by kind.
def sweeps_table(sweeps: Sequence[Sweep]) -> str:
    return list_table(SWEEP, sweeps)


def jobs_table(jobs: Sequence[Job]) -> str:
    return list_table(JOB, jobs)


def budgets_table(budgets: Sequence[Budget]) -> str:
    return list_table(BUDGET, budgets)
