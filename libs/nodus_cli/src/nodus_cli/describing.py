"""``nodus describe``: an object in readable sections (metadata, spec summary, status, conditions, cells)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from datetime import UTC, datetime

from nodus_cli.pipelines import dag_lines, spend_text, stages_done
from nodus_cli.tables import (
    NONE,
    age,
    best_lines,
    cell_table,
    cells_done,
    gpu_text,
    short_commit,
    short_digest,
    size_text,
    table,
    usd,
    wall,
)
from nodus_schema import Condition, Cost, Job, JobSpec, ObjectMeta, Sweep
from nodus_schema.attempts import Attempt, AttemptStatus, MountRecord, SourceRecord
from nodus_schema.billing import Budget
from nodus_schema.costs import DurationBand, USDBand
from nodus_schema.pipelines import Pipeline
from nodus_schema.validating import count_cells
from nodus_schema.volumes import Volume, Workspace

Field = tuple[str, str]


def _section(title: str, fields: Sequence[Field], indent: str = "  ") -> list[str]:
    shown = [(k, v) for k, v in fields if v not in ("", NONE)]
    if not shown:
        return [f"{title}:  {NONE}"]
    width = max(len(k) for k, _ in shown) + 2
    return [f"{title}:", *(f"{indent}{(k + ':').ljust(width)}{v}" for k, v in shown)]


def _pairs(mapping: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(mapping.items())) or NONE


def _meta(kind: str, meta: ObjectMeta) -> list[str]:
    created = meta.creation_timestamp
    rows: list[Field] = [
        ("Name", meta.name or NONE),
        ("Namespace", meta.namespace or NONE),
        ("Kind", kind),
        ("Labels", _pairs(meta.labels)),
        ("Annotations", _pairs(meta.annotations)),
        ("Created", f"{created} ({age(created)} ago)" if created else NONE),
        ("UID", meta.uid or NONE),
        ("Resource Version", meta.resource_version or NONE),
        ("Generation", str(meta.generation) if meta.generation is not None else NONE),
    ]
    if meta.owner_references:
        rows.append(("Owned By", ", ".join(f"{o.kind}/{o.name}" for o in meta.owner_references)))
    if meta.deletion_timestamp:
        rows.append(("Deleting Since", meta.deletion_timestamp))
    width = max(len(k) for k, _ in rows) + 2
    return [f"{(k + ':').ljust(width)}{v}" for k, v in rows if v != NONE or k in ("Name", "Namespace")]


def _conditions(conditions: list[Condition]) -> list[str]:
    if not conditions:
        return ["Conditions:  none yet"]
    rows = [
        [c.type, c.status, c.reason or NONE, age(c.last_transition_time), c.message or ""] for c in conditions
    ]
    body = table(("TYPE", "STATUS", "REASON", "AGE", "MESSAGE"), rows)
    return ["Conditions:", *("  " + line for line in body.splitlines())]


def _cost(cost: Cost | None) -> list[Field]:
    if cost is None:
        return [("Spent", NONE)]
    final = " (final)" if cost.final else ""
    return [
        ("Spent", usd(cost.total_usd) + final),
        ("Held", usd(cost.held_usd)),
        ("Limit", usd(cost.limit_usd)),
        ("Rate", f"{usd(cost.rate_usd_per_hour)}/h" if cost.rate_usd_per_hour else NONE),
    ]


def _job_spec_fields(spec: JobSpec) -> list[Field]:
    res = spec.resources
    placement = spec.placement
    command = shlex.join([*spec.command, *spec.args]) if spec.command or spec.args else NONE
    return [
        ("Image", spec.image or spec.image_ref or NONE),
        ("Command", command),
        ("GPU", gpu_text(res.gpu if res else None)),
        ("CPU / Memory", " / ".join(x for x in (res.cpu, res.memory) if x) if res else NONE),
        ("Nodes", str(spec.distributed.nodes) if spec.distributed and spec.distributed.nodes else NONE),
        ("Completions", str(spec.completions) if spec.completions is not None else NONE),
        ("Parallelism", str(spec.parallelism) if spec.parallelism is not None else NONE),
        ("Backoff Limit", str(spec.backoff_limit) if spec.backoff_limit is not None else NONE),
        ("Timeout", spec.timeout or NONE),
        ("Max Cost", usd(spec.max_cost_usd)),
        ("Regions", ", ".join(placement.regions) if placement and placement.regions else NONE),
        ("Interruptible", (placement.interruptible if placement else None) or NONE),
        ("Env", ", ".join(e.name or "?" for e in spec.env) or NONE),
        ("State", spec.state or NONE),
    ]


# -- code and data of Attempts (ADR-0036) --------------------------------------------------------------------
def source_text(src: SourceRecord | None) -> str:
    """``3f2a9c1b7d0e (main) https://github.com/acme/train.git``, or ``blob sha256:0123456789ab…``."""
    if src is None:
        return NONE
    if src.blob:
        return f"blob {short_digest(src.blob)}"
    ref = f" ({src.ref})" if src.ref else ""
    return f"{short_commit(src.commit) if src.commit else 'not checked out'}{ref} {src.repo or ''}".rstrip()


def mount_text(m: MountRecord) -> str:
    """``imagenet@3 at /data (read-only, cache hit, 1.2 GiB)``; a Workspace as ``workspace home at ...``."""
    what = f"workspace {m.name}" if m.kind == "Workspace" else f"{m.name}@{m.revision or '?'}"
    notes = ["read-only" if m.read_only else "writable"]
    if m.cache_hit is not None:
        notes.append("cache hit" if m.cache_hit else "cache miss")
    if m.size_bytes is not None:
        notes.append(size_text(m.size_bytes))
    if m.committed_revision is not None:
        notes.append(f"committed revision {m.committed_revision}")
    return f"{what} at {m.mount_path or NONE} ({', '.join(notes)})"


def _attempt_lines(attempts: Sequence[Attempt]) -> list[str]:
    if not attempts:
        return ["Attempts:  none yet"]
    lines = ["Attempts:"]
    for a in sorted(attempts, key=lambda a: (a.spec.index, a.spec.attempt, a.metadata.name or "")):
        phase = f"{a.status.phase} ({a.status.reason})" if a.status.reason else a.status.phase
        warm = f"  warm from {a.spec.warm_from}" if a.spec.warm_from else ""
        lines.append(f"  {a.metadata.name}  index {a.spec.index}  {phase}  node {a.spec.node or NONE}{warm}")
        lines.append(f"    source:  {source_text(a.status.source)}")
        lines += [f"    mount:   {mount_text(m)}" for m in a.status.mounts]
    return lines


def _kept_warm(st: AttemptStatus) -> str:
    """The warm window a finished run kept its node for (scaledownWindow, ADR-0038)."""
    if st.warm_since_ms is None or st.warm_until_ms is None:
        return NONE
    end = st.warm_end_ms if st.warm_end_ms is not None else st.warm_until_ms
    how = "ended early" if st.warm_end_ms is not None else "until"
    return f"{wall(max(0, st.warm_until_ms - st.warm_since_ms) // 1000)} window, {how} {_ms_time(end)}"


def _ms_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe_attempt(a: Attempt) -> str:
    spec, st = a.spec, a.status
    lines = _meta("Attempt", a.metadata)
    lines += _section(
        "Spec",
        [
            ("Job", spec.job),
            ("Index", str(spec.index)),
            ("Attempt", str(spec.attempt)),
            ("Node", spec.node or NONE),
            ("Offering", spec.offering or NONE),
            ("GPU", spec.gpu_variant or NONE),
            ("Warm From", spec.warm_from or NONE),
        ],
    )
    lines += _section(
        "Status",
        [
            ("Phase", st.phase),
            ("Reason", st.reason or NONE),
            ("Message", st.message or NONE),
            ("Exit Code", str(st.exit_code) if st.exit_code is not None else NONE),
            ("Wall", wall(st.wall_millis // 1000) if st.wall_millis is not None else NONE),
            ("Source", source_text(st.source)),
            ("Source Time", f"{st.source.millis} ms" if st.source and st.source.millis is not None else NONE),
            ("Kept Warm", _kept_warm(st)),
        ],
    )
    lines += ["Mounts:", *(f"  {mount_text(m)}" for m in st.mounts)] if st.mounts else ["Mounts:  none"]
    return "\n".join(lines)


def describe_volume(v: Volume) -> str:
    st = v.status
    lines = _meta("Volume", v.metadata)
    lines += _section("Spec", [("Description", v.spec.description or NONE)])
    writer = f"{st.writer.job} (uid {st.writer.uid})" if st.writer else NONE
    lines += _section("Status", [("Latest", str(st.latest) if st.latest else NONE), ("Writer", writer)])
    if not st.revisions:
        return "\n".join([*lines, "Revisions:  none yet (nodus volume push NAME DIR makes the first)"])
    rows = [
        [str(r.revision), short_digest(r.digest), size_text(r.size_bytes), r.creator, age(r.time)]
        for r in st.revisions
    ]
    body = table(("REVISION", "DIGEST", "SIZE", "CREATOR", "AGE"), rows)
    return "\n".join([*lines, "Revisions:", *("  " + line for line in body.splitlines())])


def describe_workspace(w: Workspace) -> str:
    st = w.status
    lines = _meta("Workspace", w.metadata)
    lines += _section("Spec", [("Description", w.spec.description or NONE)])
    lines += _section(
        "Status",
        [("Files", str(st.files)), ("Size", size_text(st.size_bytes)), ("Updated", st.update_time or NONE)],
    )
    return "\n".join(lines)


def cell_sources(attempts: Sequence[Attempt]) -> dict[str, str]:
    """A cell Job's name to the code its latest Attempt ran (short commit or blob)."""
    latest: dict[str, Attempt] = {}
    for a in attempts:
        seen = latest.get(a.spec.job)
        if a.status.source and (seen is None or a.spec.attempt >= seen.spec.attempt):
            latest[a.spec.job] = a
    return {job: _short_source(a.status.source) for job, a in latest.items()}


def _short_source(src: SourceRecord | None) -> str:
    if src is None:
        return NONE
    return short_digest(src.blob) if src.blob else short_commit(src.commit)


def describe_sweep(sweep: Sweep, attempts: Sequence[Attempt] | None = None) -> str:
    spec, status = sweep.spec, sweep.status
    matrix = spec.matrix
    dims = [f"gpu [{', '.join(gpu_text(g) for g in matrix.gpu)}]"] if matrix.gpu else []
    dims += [f"regions [{', '.join(matrix.regions)}]"] if matrix.regions else []
    dims += [f"{k} [{', '.join(v)}]" for k, v in sorted(matrix.params.items())]
    done, total = cells_done(sweep)
    lines = _meta("Sweep", sweep.metadata)
    lines += _section(
        "Spec",
        [
            ("Matrix", " x ".join(dims) or "no swept dimensions"),
            ("Repetitions", str(spec.repetitions or 1)),
            ("Cells", str(count_cells(spec))),
            ("Max Parallel", str(spec.max_parallel) if spec.max_parallel is not None else NONE),
            ("Max Cost", usd(spec.max_cost_usd)),
            ("State", spec.state or NONE),
        ],
    )
    lines += _section("Template", _job_spec_fields(spec.template.spec), indent="  ")
    lines += _section(
        "Status",
        [
            ("Phase", status.phase or "Pending"),
            ("Reason", status.reason or NONE),
            ("Message", status.message or NONE),
            ("Cells Done", f"{done}/{total}"),
            *_cost(status.cost),
            ("Started", status.start_time or NONE),
            ("Completed", status.completion_time or NONE),
            ("Observed Gen.", str(status.observed_generation) if status.observed_generation else NONE),
        ],
    )
    lines += _conditions(status.conditions)
    sources = cell_sources(attempts or []) or None
    lines += ["Cells:", *("  " + line for line in cell_table(sweep, sources).splitlines())]
    lines += ["  " + line for line in best_lines(sweep)]
    return "\n".join(lines)


def describe_job(job: Job, attempts: Sequence[Attempt] | None = None) -> str:
    st = job.status
    lines = _meta("Job", job.metadata)
    lines += _section("Spec", _job_spec_fields(job.spec))
    lines += _section(
        "Status",
        [
            ("Phase", st.phase or "Pending"),
            ("Reason", st.reason or NONE),
            ("Message", st.message or NONE),
            ("Active", str(st.active) if st.active is not None else NONE),
            ("Succeeded", f"{st.succeeded or 0}/{job.spec.completions or 1}"),
            ("Failed", str(st.failed) if st.failed is not None else NONE),
            ("Attempts", str(st.attempts) if st.attempts is not None else NONE),
            ("Topology", st.topology or NONE),
            ("Wall", wall(st.wall_seconds)),
            ("Units/s", st.units_per_second or NONE),
            *_cost(st.cost),
            ("Started", st.start_time or NONE),
            ("Completed", st.completion_time or NONE),
        ],
    )
    lines += _conditions(st.conditions)
    if attempts is not None:
        lines += _attempt_lines(attempts)
    return "\n".join(lines)


def describe_budget(budget: Budget) -> str:
    spec, st = budget.spec, budget.status
    lines = _meta("Budget", budget.metadata)
    lines += _section(
        "Spec",
        [
            ("Monthly", usd(spec.monthly_usd)),
            ("Selector", _pairs(spec.selector) if spec.selector else "every Job of the project"),
        ],
    )
    lines += _section(
        "Status",
        [
            ("Month", st.month or NONE),
            ("Used", usd(st.used_usd)),
            ("Observed Gen.", str(st.observed_generation) if st.observed_generation else NONE),
        ],
    )
    return "\n".join(lines)


# -- Pipelines (issue #22) -----------------------------------------------------------------------------------
def _band(band: USDBand | DurationBand | None, money: bool) -> str:
    if band is None or (band.p50 is None and band.p90 is None):
        return NONE
    sign = "$" if money else ""
    return f"p50 {sign}{band.p50 or '?'}  p90 {sign}{band.p90 or '?'}"


def describe_pipeline(p: Pipeline) -> str:
    """Metadata, the cap and the spend, the phase, the estimate, the DAG as a tree, then the conditions."""
    spec, st = p.spec, p.status
    succeeded, total = stages_done(p)
    lines = _meta("Pipeline", p.metadata)
    lines += _section(
        "Spec",
        [
            ("Stages", str(len(spec.stages))),
            ("Max Cost", usd(spec.max_cost_usd) if spec.max_cost_usd else "none (no shared cap)"),
            ("State", spec.state or NONE),
        ],
    )
    estimate = st.estimate
    warned = estimate.warnings if estimate else []
    warnings = [f"{w.code or '?'}: {w.message or ''}".rstrip() for w in warned]
    lines += _section(
        "Status",
        [
            ("Phase", st.phase or "Pending"),
            ("Reason", st.reason or NONE),
            ("Message", st.message or NONE),
            ("Stages Done", f"{succeeded}/{total} succeeded"),
            ("Spend", spend_text(p)),
            *_cost(st.cost)[1:],
            ("Started", st.start_time or NONE),
            ("Completed", st.completion_time or NONE),
            ("Observed Gen.", str(st.observed_generation) if st.observed_generation else NONE),
        ],
    )
    lines += _section(
        "Estimate",
        [
            ("Cost", _band(estimate.cost_usd if estimate else None, money=True)),
            ("Duration", _band(st.estimated_duration, money=False)),
            *(("Warning", w) for w in warnings),
        ],
    )
    lines += ["Stages:", *("  " + line for line in dag_lines(p))]
    lines += _conditions(st.conditions)
    return "\n".join(lines)
