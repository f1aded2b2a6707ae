"""Pipelines in the CLI (issue #22): their stages counted, their spend against the cap, the DAG drawn as a
tree (``nodus describe pipeline``), and the stage transitions ``nodus apply --wait`` prints.

A stage is read from the spec (its name, kind and ``dependsOn``: known from the create on) and from
``status.stages`` (phase, cost, wall time, child, the best cell it took: once the controller has seen it).
The tree puts each stage under the first stage it depends on, in the order of ``spec.stages``; a stage with
more dependencies says so with ``(also after: x, y)``. Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from nodus_cli.tables import NONE, table, usd, wall
from nodus_schema.pipelines import BestCell, BestChoice, Pipeline, StageStatus, stage_kind
from nodus_schema.quantities import usd_to_micros

STAGE_HEADERS: Final = ("STAGE", "KIND", "PHASE", "COST", "WALL", "OBJECT")
BRANCH: Final = "├─ "
LAST: Final = "└─ "
PIPE: Final = "│  "
SPACE: Final = "   "


@dataclass(frozen=True, slots=True)
class StageView:
    """One stage as the CLI shows it: the spec's shape with the status's numbers."""

    name: str
    kind: str
    depends_on: tuple[str, ...]
    phase: str | None
    cost_usd: str | None = None
    wall_seconds: int | None = None
    object: str | None = None
    message: str | None = None
    best_wanted: BestCell | None = None
    """The spec's ``fromBest``: which Sweep stage's best cell, by what."""
    best: BestChoice | None = None
    """The best cell the stage took, once it was created."""


def stage_views(p: Pipeline) -> list[StageView]:
    """Every stage, in the order of ``spec.stages``; a stage only the status knows comes last."""
    known = {s.name: s for s in p.status.stages}
    views: list[StageView] = []
    for stage in p.spec.stages:
        name = stage.name or "?"
        st = known.pop(name, None) or StageStatus(name=name)
        views.append(
            StageView(
                name=name,
                kind=st.kind or stage_kind(stage) or NONE,
                depends_on=tuple(stage.depends_on),
                phase=st.phase,
                cost_usd=st.cost_usd,
                wall_seconds=st.wall_seconds,
                object=st.object,
                message=st.message,
                best_wanted=stage.from_best,
                best=st.from_best,
            )
        )
    for st in known.values():
        views.append(
            StageView(
                name=st.name,
                kind=st.kind or NONE,
                depends_on=(),
                phase=st.phase,
                cost_usd=st.cost_usd,
                wall_seconds=st.wall_seconds,
                object=st.object,
                message=st.message,
                best=st.from_best,
            )
        )
    return views


def stages_done(p: Pipeline) -> tuple[int, int]:
    """(stages that succeeded, all stages): ``get pipelines``' STAGES column."""
    views = stage_views(p)
    return sum(1 for v in views if v.phase == "Succeeded"), len(views)


def spent(p: Pipeline) -> str:
    cost = p.status.cost
    return usd(cost.total_usd if cost else None)


def spend_text(p: Pipeline) -> str:
    """``$1.23 of the $5.00 cap (24.6%)``, exact (integer micro-dollars); ``$1.23, no cap`` without one."""
    cost = p.status.cost
    total = (cost.total_usd if cost else None) or "0"
    cap = p.spec.max_cost_usd
    if not cap:
        return f"${total}, no cap (spec.maxCostUSD is not set)"
    try:
        limit, used = usd_to_micros(cap), usd_to_micros(total)
    except ValueError:
        return f"${total} of the ${cap} cap"
    if limit <= 0:
        return f"${total} of the ${cap} cap"
    permille = used * 1000 // limit
    return f"${total} of the ${cap} cap ({permille // 10}.{permille % 10}%)"


def best_text(wanted: BestCell | None, chosen: BestChoice | None) -> str | None:
    """``best of grid by Throughput: cell 3 (LR=0.01, L4:1)``; before the stage is created, what it will
    take (``best of grid by Cost: not chosen yet``); None for a stage without ``fromBest``."""
    if chosen is not None:
        what = [f"{k}={v}" for k, v in sorted(chosen.params.items())]
        what += [x for x in (chosen.gpu, chosen.region) if x]
        cell = f"cell {chosen.cell}" if chosen.cell is not None else f"cell {chosen.object or '?'}"
        detail = f" ({', '.join(what)})" if what else ""
        return f"best of {chosen.stage or '?'} by {chosen.by or 'Cost'}: {cell}{detail}"
    if wanted is not None:
        return f"best of {wanted.stage or '?'} by {wanted.by or 'Cost'}: not chosen yet"
    return None


# ---------------------------------------------------------------------------------------------------------
# The DAG as a tree
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    lead: str
    """What comes before the stage's name: the tree's lines and its branch."""
    below: str
    """What comes before a line under the stage (its notes): the tree's lines."""
    view: StageView


def _parent(view: StageView, names: set[str]) -> str | None:
    first = view.depends_on[0] if view.depends_on else None
    return first if first in names and first != view.name else None


def _tree(views: list[StageView]) -> list[_Entry]:
    names = {v.name for v in views}
    children: dict[str | None, list[StageView]] = {}
    for v in views:
        children.setdefault(_parent(v, names), []).append(v)
    entries: list[_Entry] = []
    seen: set[str] = set()

    def walk(v: StageView, lead: str, cont: str) -> None:
        if v.name in seen:
            return
        seen.add(v.name)
        kids = [k for k in children.get(v.name, []) if k.name not in seen]
        entries.append(_Entry(lead, cont + (PIPE if kids else SPACE), v))
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            walk(kid, cont + (LAST if last else BRANCH), cont + (SPACE if last else PIPE))

    for root in children.get(None, []):
        walk(root, "", "")
    for v in views:  # stages on a cycle (the gateway refuses those): shown at the top rather than lost
        walk(v, "", "")
    return entries


def _notes(v: StageView) -> Iterator[str]:
    best = best_text(v.best_wanted, v.best)
    if best:
        yield best
    if v.message:
        yield v.message


def dag_lines(p: Pipeline) -> list[str]:
    """The stages as a tree under a header: each stage under the first it depends on, with its kind, phase,
    cost, wall time and child; then, under it, the best cell it took and its message."""
    entries = _tree(stage_views(p))
    if not entries:
        return ["no stages"]
    rows = []
    for e in entries:
        v = e.view
        also = f" (also after: {', '.join(v.depends_on[1:])})" if len(v.depends_on) > 1 else ""
        rows.append(
            [
                f"{e.lead}{v.name}{also}",
                v.kind,
                v.phase or "Pending",
                usd(v.cost_usd),
                wall(v.wall_seconds),
                v.object or NONE,
            ]
        )
    header, *lines = table(STAGE_HEADERS, rows).splitlines()
    out = [header]
    for e, line in zip(entries, lines, strict=True):
        out.append(line)
        out += [f"{e.below}{note}".rstrip() for note in _notes(e.view)]
    return out


# ---------------------------------------------------------------------------------------------------------
# Stage transitions (apply --wait)
# ---------------------------------------------------------------------------------------------------------


def stage_phases(p: Pipeline | None) -> dict[str, str | None]:
    return {v.name: v.phase for v in stage_views(p)} if p is not None else {}


def transitions(before: dict[str, str | None], after: Pipeline) -> list[str]:
    """A line per stage whose phase changed since ``before`` (a stage's name to its phase):
    ``stage train: Running -> Succeeded (job etl-train, 5m00s, $0.33)``."""
    lines = []
    for v in stage_views(after):
        was = before.get(v.name)
        if v.phase is None or v.phase == was:
            continue
        change = f"{was} -> {v.phase}" if was else v.phase
        detail = [f"{v.kind.lower()} {v.object}" if v.object else v.kind.lower()]
        if v.wall_seconds is not None:
            detail.append(wall(v.wall_seconds))
        if v.cost_usd:
            detail.append(usd(v.cost_usd))
        line = f"stage {v.name}: {change} ({', '.join(detail)})"
        if v.message and v.phase in ("Failed", "Skipped", "Cancelled", "Suspended"):
            line += f": {v.message}"
        lines.append(line)
    return lines
