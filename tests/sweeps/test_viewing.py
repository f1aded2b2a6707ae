"""What the sweep reconciler reads its Sweeps and cells from, when it leaves a Sweep alone, and its write
throttle (pure: no message leaves the process).

The Sweeps come from the service's sweeps informer: what it holds decides which Sweep a pass works on, so
an older event (a list that raced a write, a redelivery) must never replace a newer Sweep, and a Sweep
seen deleted must not come back from an event older than its delete; the reconciler keeps the deleted
Sweep's uid, whose cells (and only those) it then collects. ``settled`` is what the controller's resync
skips: a finished Sweep whose cells the jobs informer holds exactly as its rows say.
"""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit.informing import Informer
from nodus_kit.storing import ObjectStore
from nodus_schema.costs import Cost
from nodus_schema.jobs import Job, JobStatus
from nodus_schema.meta import Condition, ObjectMeta, OwnerReference
from nodus_schema.sweeps import Sweep, SweepCell, SweepSpec, SweepStatus
from nodus_schema.wire import API_VERSION
from nodus_sweeps.cells import CELLS, SLOTS, by_cell, by_slot
from nodus_sweeps.reconciling import SweepReconciler, _urgent

KEY = ("ns", "s")


def _sweep(rv: int, uid: str = "u1", generation: int = 1, status: SweepStatus | None = None) -> Sweep:
    spec = msgspec.convert({"template": {"spec": {"image": "x"}}}, SweepSpec)
    meta = ObjectMeta(name="s", namespace="ns", uid=uid, generation=generation, resource_version=str(rv))
    return Sweep(metadata=meta, spec=spec, status=status or SweepStatus())


def _rec() -> SweepReconciler:
    """The reconciler over the service's informers, never connected: only their views are used."""
    sweeps = Informer(ObjectStore(NATS(), "sweeps", Sweep), name="sweeps")
    jobs = Informer(ObjectStore(NATS(), "jobs", Job), indexers={SLOTS: by_slot, CELLS: by_cell}, name="jobs")
    return SweepReconciler(NATS(), sweeps, jobs)


def _revision(rec: SweepReconciler) -> str | None:
    held = rec.sweeps.get(*KEY)
    return held.metadata.resource_version if held is not None else None


def test_the_newest_revision_wins_whatever_order_events_come_in() -> None:
    rec = _rec()
    assert rec.sweeps.apply(_sweep(5))
    assert not rec.sweeps.apply(_sweep(3)), "an older event changes nothing, and queues nothing"
    assert _revision(rec) == "5"
    rec.sweeps.apply(_sweep(9, generation=2))
    held = rec.sweeps.get(*KEY)
    assert held is not None and held.metadata.generation == 2


def test_a_deleted_sweep_is_not_brought_back_by_an_older_event() -> None:
    rec = _rec()
    rec.sweeps.apply(_sweep(5))
    rec.sweeps.apply(_sweep(7), deleted=True)
    assert rec.sweeps.get(*KEY) is None and rec.deleted_uid(KEY) == "u1"
    rec.sweeps.apply(_sweep(5))  # a list read before the delete
    assert rec.sweeps.get(*KEY) is None, "a pass must find the Sweep gone and collect its cells"
    assert rec.deleted_uid(KEY) == "u1", "the cells collected are the deleted Sweep's"
    rec.sweeps.apply(_sweep(8, uid="u2"))  # created again under the same name
    held = rec.sweeps.get(*KEY)
    assert held is not None and held.metadata.uid == "u2" and rec.deleted_uid(KEY) is None


def test_a_sweep_deleted_while_the_watch_was_down_is_seen_deleted_by_the_relist() -> None:
    """A relist replaces the view (a new term as leader trusts it): what vanished is a delete seen, with
    its uid, so its cells are collected by uid as if the watch had delivered the delete."""
    rec = _rec()
    rec.sweeps.apply(_sweep(5, uid="u0"))
    rec.sweeps.replace([], 6)
    assert rec.sweeps.get(*KEY) is None and rec.deleted_uid(KEY) == "u0"


# -- settled: what the resync leaves out ----------------------------------------------------------------


def _cell(i: int, rv: int, *, uid: str = "u1", phase: str = "Succeeded", final: bool = True) -> Job:
    ref = OwnerReference(api_version=API_VERSION, kind="Sweep", name="s", uid=uid, controller=True)
    meta = ObjectMeta(
        name=f"s-{i}", namespace="ns", uid=f"c{i}", resource_version=str(rv), owner_references=[ref]
    )
    return Job(metadata=meta, status=JobStatus(phase=phase, cost=Cost(total_usd="0.10", final=final)))


def _ended(n: int, **changes: object) -> Sweep:
    rows = [
        SweepCell(index=i, repetition=0, object=f"s-{i}", phase="Succeeded", cost_usd="0.10")
        for i in range(n)
    ]
    status = SweepStatus(
        phase="Succeeded",
        observed_generation=1,
        cells=rows,
        cost=Cost(total_usd=f"{n / 10:.2f}", final=True),
        completion_time="2026-11-30T00:00:00Z",
    )
    return _sweep(20, status=msgspec.structs.replace(status, **changes))


def test_a_finished_sweep_whose_cells_are_all_final_is_settled() -> None:
    rec = _rec()
    for i in range(3):
        rec.jobs.apply(_cell(i, i + 1))
    assert rec.settled(_ended(3))


def test_a_sweep_with_anything_left_to_do_is_not_settled() -> None:
    rec = _rec()
    for i in range(3):
        rec.jobs.apply(_cell(i, i + 1))
    assert not rec.settled(_ended(3, phase="Running")), "not ended"
    assert not rec.settled(_ended(3, observed_generation=0)), "a spec change not yet taken"
    assert not rec.settled(_ended(3, cost=Cost(total_usd="0.30", final=False))), "the cost not final"
    assert not rec.settled(_ended(4)), "a row without its Job: a cell deleted while nobody led"
    not_created = _ended(3, phase="Cancelled")
    not_created.status.cells[2] = SweepCell(index=2, repetition=0, phase="Pending")
    assert not rec.settled(not_created), "a cell never created (a Cancelled Sweep's)"
    rec.jobs.apply(_cell(1, 10, final=False))
    assert not rec.settled(_ended(3)), "a cell whose cost is not final yet"
    rec.jobs.apply(_cell(1, 11, phase="Running", final=True))
    assert not rec.settled(_ended(3)), "a cell not ended (its row says otherwise)"
    rec.jobs.apply(_cell(1, 12))
    rec.jobs.apply(_cell(3, 13, uid="earlier"))  # a name past the last cell, held by another Sweep's Job
    assert not rec.settled(_ended(3)), "a Job with a cell's name that is not one of its cells"
    rec.jobs.apply(_cell(3, 14, uid="earlier"), deleted=True)
    rec.jobs.apply(_cell(2, 15, uid="earlier"))  # cell 2's name now held by another Sweep's Job
    assert not rec.settled(_ended(3)), "a name taken"


def test_only_a_change_of_headline_skips_the_write_interval() -> None:
    row = SweepCell(index=0, repetition=0, phase="Running")
    old = SweepStatus(phase="Running", cells=[row], message="0 of 2 cells finished")
    moved = msgspec.structs.replace(
        old, cells=[msgspec.structs.replace(row, phase="Succeeded")], message="1 of 2 cells finished"
    )
    assert not _urgent(old, moved), "rows and counts wait for the interval"
    assert _urgent(old, msgspec.structs.replace(moved, phase="Succeeded"))
    assert _urgent(old, msgspec.structs.replace(old, reason="MaxCostReached"))
    assert _urgent(old, msgspec.structs.replace(old, observed_generation=2))
    flagged = msgspec.structs.replace(
        old, conditions=[Condition(type="ProjectedOverCap", status="True", reason="ProjectedOverCap")]
    )
    assert _urgent(old, flagged)
    retimed = msgspec.structs.replace(
        flagged,
        conditions=[
            msgspec.structs.replace(flagged.conditions[0], last_transition_time="2026-11-30T00:00:00Z")
        ],
    )
    assert not _urgent(flagged, retimed), "a condition's time alone is no news"
