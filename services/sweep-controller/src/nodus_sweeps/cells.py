"""Which Jobs are a Sweep's cells, what a taken cell's name is reported as, and when a Sweep has nothing
left to do: rules over objects and the jobs informer's memory, no I/O.

The sweep controller reads Jobs from an informer (:mod:`nodus_kit.informing`) with two indexes, worked
out once per change of a Job rather than on every pass: every Job named as a cell (``<sweep>-<index>``)
under its slot, ``<namespace>/<sweep>`` (:func:`by_slot`), and the Jobs a Sweep of that name controls
under its uid as well (:func:`by_cell`). A pass over a 1,000-cell Sweep then finds its cells, and any Job
that holds one of their names, without reading every Job or checking every Job's references.

Ownership is Kubernetes' ControllerRef (``metav1.GetControllerOf``), never labels: a cell of the Sweep with
uid U is the Job named ``<sweep>-<i>`` whose controller ownerReference (the first with ``controller:
true``) is ``kind: Sweep``, ``name: <sweep>``, ``uid: U`` (:func:`owned`). The labels (``nodus.dev/sweep``,
``nodus.dev/cell``) are for people and selectors; anyone who may write Jobs can set them, so they decide
nothing here. The slot holds every Job with a cell's name, labelled or not, so that a name taken by a Job
the Sweep does not control (one a user created first, one of an earlier Sweep of the same name) is known
without a request (:func:`taken`), and its delete wakes the Sweep up, which then creates its own cell. The
condition, reason and messages that report a taken name are worked out here too (:func:`taken_condition`,
:func:`taken_summary`).
"""

from __future__ import annotations

import functools

from nodus_kit.informing import Informer
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import Condition, OwnerReference
from nodus_schema.sweeps import SWEEP_LABEL, Sweep, SweepCell

SWEEP_GROUP = "nodus.dev"
NAME_TAKEN = "CellNameTaken"
"""The reason (and condition type) of a Sweep one of whose cells' names is held by a Job it does not own."""
LISTED = 10
"""Cells named in a message at most."""
SLOTS = "slot"
"""The jobs informer's index of every Job named as a cell, by slot (:func:`by_slot`)."""
CELLS = "cell"
"""The jobs informer's index of the Jobs a Sweep of their slot controls, by slot and uid (:func:`by_cell`)."""


@functools.lru_cache(maxsize=1 << 16)  # the informer asks four times per change of a Job
def slot_of(name: str) -> tuple[str, int] | None:
    """(Sweep name, index) of a Job named as a cell, ``<sweep>-<index>``; None for any other name.

    The index is the last ``-`` segment, decimal without leading zeros (``a-1-2`` is cell 2 of Sweep
    ``a-1``; ``a-01`` is no cell's name)."""
    sweep, dash, digits = name.rpartition("-")
    if not (sweep and dash and digits.isascii() and digits.isdigit()) or str(int(digits)) != digits:
        return None
    return sweep, int(digits)


def slot_value(namespace: str, sweep: str) -> str:
    """The index value of the Jobs with the cells' names of Sweep ``sweep`` (a name holds no ``/``)."""
    return f"{namespace}/{sweep}"


def cell_value(namespace: str, sweep: str, uid: str) -> str:
    """The index value of the cells of the Sweep ``sweep`` with ``uid``."""
    return f"{namespace}/{sweep}/{uid}"


def by_slot(job: Job) -> tuple[str, ...]:
    """Indexer: a Job named as a cell files under its Sweep's slot, whoever controls it; others nowhere."""
    slot = slot_of(job.metadata.name or "")
    return (slot_value(job.metadata.namespace or "", slot[0]),) if slot is not None else ()


def by_cell(job: Job) -> tuple[str, ...]:
    """Indexer: a Job named as a cell whose controller is a Sweep of that name files under that Sweep's
    uid. Worked out once per change, so a pass finds its cells without checking every Job's references."""
    slot = slot_of(job.metadata.name or "")
    uid = sweep_controller_uid(job, slot[0]) if slot is not None else None
    return (cell_value(job.metadata.namespace or "", slot[0], uid),) if slot is not None and uid else ()


def controller_of(job: Job) -> OwnerReference | None:
    """The Job's controller ownerReference: the first with ``controller: true``, as metav1.GetControllerOf."""
    for ref in job.metadata.owner_references:
        if ref.controller:
            return ref
    return None


def sweep_controller_uid(job: Job, sweep: str) -> str | None:
    """The uid of the Sweep named ``sweep`` that controls ``job``; None if its controller is anything else
    (none, another kind, a Sweep of another name)."""
    ref = controller_of(job)
    if ref is None or ref.kind != "Sweep" or ref.name != sweep or not ref.uid:
        return None
    if ref.api_version.partition("/")[0] != SWEEP_GROUP:
        return None
    return ref.uid


def controlled_by(job: Job, sweep: str, uid: str | None) -> bool:
    """Whether the Sweep ``sweep`` with ``uid`` controls ``job`` (the only Jobs it ever acts on)."""
    return bool(uid) and sweep_controller_uid(job, sweep) == uid


def related(job: Job) -> bool:
    """A Job that says it belongs to a Sweep, by label or by any ownerReference (such a Job's changes
    always wake the Sweep its name is a cell of; any other only a Sweep the controller knows)."""
    return SWEEP_LABEL in job.metadata.labels or any(o.kind == "Sweep" for o in job.metadata.owner_references)


def owned(jobs: Informer[Job], key: tuple[str, str], uid: str | None) -> dict[str, Job]:
    """The cells of the Sweep ``key`` with ``uid``, by name: the Jobs with its cells' names that it
    controls. A same-named Sweep created after a delete never adopts the old one's cells."""
    if not uid:
        return {}
    return {j.metadata.name or "": j for j in jobs.by_index(CELLS, cell_value(*key, uid))}


def taken(jobs: Informer[Job], key: tuple[str, str], uid: str | None) -> dict[str, Job]:
    """The Jobs that hold a cell's name of the Sweep ``key`` with ``uid`` without being its cells, by
    name: no controller, another controller, or an earlier Sweep of the same name."""
    slot = jobs.by_index(SLOTS, slot_value(*key))
    if uid and len(slot) == len(jobs.by_index(CELLS, cell_value(*key, uid))):
        return {}  # every Job of the slot is a cell (the usual case: no walk)
    return {j.metadata.name or "": j for j in slot if not uid or sweep_controller_uid(j, key[1]) != uid}


def dependents(jobs: Informer[Job], key: tuple[str, str]) -> list[Job]:
    """The Jobs with the cells' names of Sweep ``key`` that a Sweep of that name controls (any uid)."""
    return [j for j in jobs.by_index(SLOTS, slot_value(*key)) if sweep_controller_uid(j, key[1]) is not None]


def cost_final(job: Job | None) -> bool:
    return bool(job and job.status.cost and job.status.cost.final)


def settled(sweep: Sweep, jobs: Informer[Job]) -> bool:
    """Whether a pass over ``sweep`` would do nothing, so the controller's resync can leave it out.

    True only for a Sweep whose status ended (phase final, for the generation it is at, cost final)
    and whose cells the view holds exactly as its rows say: one Job per row, each its own cell, ended,
    with a final cost, in the phase and at the cost its row shows, and no other Job with a cell's name.
    Anything else is left to a pass (which then does nothing, or what is due): a cell deleted or changed
    while no leader watched, a name taken or past the last cell, a cell never created (a Cancelled
    Sweep's). A change of the Sweep or of one of its cells queues it whatever this says.
    """
    st, meta = sweep.status, sweep.metadata
    if st.phase not in TERMINAL_PHASES or st.observed_generation != meta.generation:
        return False
    if not (st.cost is not None and st.cost.final and st.completion_time):
        return False
    key = (meta.namespace or "", meta.name or "")
    cells = owned(jobs, key, meta.uid)
    if not (len(cells) == len(st.cells) == len(jobs.by_index(SLOTS, slot_value(*key)))):
        return False
    return all(_as_row(cells.get(row.object) if row.object else None, row) for row in st.cells)


def _as_row(job: Job | None, row: SweepCell) -> bool:
    """The cell ``job`` ended, with a final cost, and its row says so."""
    if job is None:
        return False
    st = job.status
    done = st.phase in TERMINAL_PHASES and st.phase == row.phase
    return done and st.cost is not None and bool(st.cost.final) and st.cost.total_usd == row.cost_usd


def taken_sentence(sweep: Sweep, job: Job) -> str:
    """Who holds a cell's name: ``the Job lr-1 is not this Sweep's (it has no controller)``."""
    ref = controller_of(job)
    if ref is None:
        whose = "it has no controller"
    elif ref.kind == "Sweep" and ref.name == sweep.metadata.name:
        whose = f"its controller is the Sweep {ref.name} of uid {ref.uid}, an earlier Sweep of this name"
    else:
        whose = f"its controller is the {ref.kind} {ref.name} of uid {ref.uid}"
    return f"the Job {job.metadata.name} is not this Sweep's ({whose})"


def taken_fix(jobs: list[Job]) -> str:
    """``delete or rename the Job lr-1, or rename the Sweep``."""
    names = ", ".join(j.metadata.name or "" for j in jobs[:LISTED]) + (", ..." if len(jobs) > LISTED else "")
    return f"delete or rename the Job{'s' if len(jobs) > 1 else ''} {names}, or rename the Sweep"


def taken_summary(sweep: Sweep, taken: dict[int, Job], *, of: int | None = None) -> str:
    """``1 cell not created, its name taken by a Job this Sweep does not own: #1 (lr-1); delete or rename
    the Job lr-1, or rename the Sweep`` (``of``: ``1 of 6 cells``)."""
    order = sorted(taken)
    k = len(order)
    which = ", ".join(f"#{i} ({taken[i].metadata.name})" for i in order[:LISTED])
    more = ", ..." if k > LISTED else ""
    count = f"{k} of {of} cells" if of is not None else f"{k} cell{'s' if k > 1 else ''}"
    held = "its name taken by a Job" if k == 1 else "their names taken by Jobs"
    fix = taken_fix([taken[i] for i in order])
    return f"{count} not created, {held} this Sweep does not own: {which}{more}; {fix}"


def taken_condition(sweep: Sweep, taken: dict[int, Job], *, had: bool) -> Condition | None:
    """``CellNameTaken``: True while a cell's name is held by a Job the Sweep does not own (which, and
    why, in the message); False once none is, for a Sweep that had it; absent on every other Sweep."""
    if not taken:
        if not had:
            return None
        return Condition(
            type=NAME_TAKEN,
            status="False",
            reason="CellNamesFree",
            message="every cell's name is free or held by this Sweep's own cell",
            observed_generation=sweep.metadata.generation,
        )
    order = sorted(taken)
    told = [f"#{i}: {taken_sentence(sweep, taken[i])}" for i in order[:LISTED]]
    more = f"; and {len(order) - LISTED} more" if len(order) > LISTED else ""
    return Condition(
        type=NAME_TAKEN,
        status="True",
        reason=NAME_TAKEN,
        message=f"{'; '.join(told)}{more}; {taken_fix([taken[i] for i in order])}",
        observed_generation=sweep.metadata.generation,
    )
