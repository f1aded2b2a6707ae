"""What an estimate expects of warm capacity (``spec.scaledownWindow``, issue #21, ADR-0038): which nodes are
kept warm now, and for one slot how many of its runs start warm, how many start cold, and how many nodes
stay warm unused for a whole window after its last runs. Pure: the estimator passes what it read.

The expectation, for a slot of ``runs`` single-node runs of which at most ``limit`` go at once (a Job's
parallelism, a Sweep's maxParallel) on the ``fitting`` ready nodes that fit it (not kept for another
project):

* ``concurrency`` = min(limit, fitting) (``limit`` when no node fits now: the create would queue);
* with a window: the first ``concurrency`` runs start cold, less the project's nodes already warm
  (``own``); every later run reuses a node its predecessor kept (the nodes are the project's for the window
  while the queue drains), and ``concurrency`` nodes stay warm unused for a window at the end;
* without one: only the project's nodes already warm are reused, by the first runs, and nothing stays warm.

Gangs keep nothing warm (their nodes are placed together): a slot of more than one node is all cold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from nodus_scheduler.capacity import CapacityIndex
from nodus_scheduler.placing import Placement, demand_of, fitting_ready, place
from nodus_schema.attempts import ATTEMPT_TERMINAL, Attempt
from nodus_schema.catalog import Catalog
from nodus_schema.costs import EstimateWarning
from nodus_schema.estimating import SlotPlan
from nodus_schema.jobs import JobSpec
from nodus_schema.nodes import Node
from nodus_schema.quantities import micros_to_usd
from nodus_schema.warmth import scaledown_window

__all__ = ["WarmPlan", "kept_warm", "plan_warm", "warm_note"]


def kept_warm(attempts: Iterable[Attempt], now: datetime) -> dict[str, str]:
    """The nodes kept warm now, each with the project (namespace) it is kept for: finished runs whose window
    is open, not reused, on a node with no run."""
    now_ms = int(now.timestamp() * 1000)
    listed = list(attempts)
    reused = {(a.metadata.namespace or "", a.spec.warm_from) for a in listed if a.spec.warm_from}
    busy = {a.spec.node for a in listed if a.status.phase not in ATTEMPT_TERMINAL}
    out: dict[str, str] = {}
    for a in listed:
        st, ns = a.status, a.metadata.namespace or ""
        if st.warm_until_ms is None or st.warm_end_ms is not None or st.warm_until_ms <= now_ms:
            continue
        if (ns, a.metadata.name) in reused or a.spec.node in busy:
            continue
        out[a.spec.node] = ns
    return out


@dataclass(frozen=True, slots=True)
class WarmPlan:
    warm_starts: int = 0
    tails: int = 0
    window: timedelta = timedelta(0)
    concurrency: int = 1
    reuse_now: Placement | None = None
    """A node kept warm for the project that the first run would take now."""


def plan_warm(
    spec: JobSpec,
    catalog: Catalog,
    nodes: list[Node],
    warm: dict[str, str],
    namespace: str,
    now: datetime,
    *,
    runs: int,
    limit: int,
    gang: int = 1,
    open_index: CapacityIndex | None = None,
) -> WarmPlan:
    """The warm expectation of one slot (see the module docstring). ``open_index``: the nodes not kept warm
    for another project, already indexed (the estimate endpoint's, built once for many estimates)."""
    window = scaledown_window(spec)
    if gang > 1 or runs <= 0:
        return WarmPlan()
    # The project's warm nodes by name first: a walk of every node per estimate only when it has some.
    names = {name for name, project in warm.items() if project == namespace}
    own_nodes = [n for n in nodes if (n.metadata.name or "") in names] if names else []
    own = [p for n in own_nodes if isinstance(p := place(spec, [n], set(), catalog, now), Placement)]
    if open_index is None:
        open_to_us = [n for n in nodes if warm.get(n.metadata.name or "") in (None, namespace)]
        open_index = CapacityIndex.of(open_to_us, now=now)
    fitting = fitting_ready(open_index, demand_of(spec), catalog)
    concurrency = max(1, min(limit, fitting) if fitting else limit)
    reuse_now = min(own, key=lambda p: p.node.metadata.name or "") if own else None
    if window > timedelta(0):
        cold = min(runs, max(0, concurrency - len(own)))
        return WarmPlan(runs - cold, min(runs, concurrency), window, concurrency, reuse_now)
    return WarmPlan(min(len(own), runs, concurrency), 0, window, concurrency, reuse_now)


def warm_note(plans: list[SlotPlan], which: str) -> EstimateWarning:
    """WarmWindow: how many of the starts of ``which`` reuse warm capacity, and what the windows kept after
    the last runs may cost (each a whole window at the node's rate, as Teardown)."""
    starts = sum(p.warm_starts for p in plans)
    total = sum(p.nodes * p.completions * p.cells for p in plans)
    tails = sum(p.warm_tails for p in plans)
    first = plans[0]
    band = first.warm_boot
    text = (
        f"{starts} of {total} starts of {which} are expected to reuse warm capacity (container start only: "
        f"{band.p50 if band else '?'} p50, {band.p90 if band else '?'} p90)"
    )
    if tails and first.warm_window:
        text += (
            f"; scaledownWindow {first.warm_window} then keeps {tails} node(s) warm after the last runs, "
            f"billed as Teardown at {micros_to_usd(first.rate_micros_per_hour or 0)} USD/h per node until "
            "another run of the project reuses them, the window ends, or the Job is deleted"
        )
    return EstimateWarning(code="WarmWindow", message=text)
