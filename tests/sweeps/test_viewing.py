"""The sweep reconciler's view of Sweeps and its write throttle (pure: no message leaves the process).

The view is fed by the controller's watch (``SweepReconciler.seen``); what it holds decides which Sweep a
pass works on, so an older event (a resync's list that raced a write, a redelivery) must never replace a
newer Sweep, and a Sweep seen deleted must not come back from an event older than its delete.
"""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit.storing import Event
from nodus_schema.meta import Condition, ObjectMeta
from nodus_schema.sweeps import Sweep, SweepCell, SweepSpec, SweepStatus
from nodus_sweeps.reconciling import SweepReconciler, _urgent

KEY = ("ns", "s")


def _sweep(rv: int, uid: str = "u1", generation: int = 1) -> Sweep:
    spec = msgspec.convert({"template": {"spec": {"image": "x"}}}, SweepSpec)
    meta = ObjectMeta(name="s", namespace="ns", uid=uid, generation=generation, resource_version=str(rv))
    return Sweep(metadata=meta, spec=spec)


def _rec() -> SweepReconciler:
    return SweepReconciler(NATS())  # never connected: only the view is used


def test_the_newest_revision_wins_whatever_order_events_come_in() -> None:
    rec = _rec()
    assert rec.seen(Event("ADDED", _sweep(5), 5)) == [KEY]
    assert rec.seen(Event("MODIFIED", _sweep(3), 0)) == [KEY], "an older event still queues the Sweep"
    assert rec._seen[KEY].metadata.resource_version == "5"
    rec.seen(Event("MODIFIED", _sweep(9, generation=2), 9))
    assert rec._seen[KEY].metadata.generation == 2


def test_a_deleted_sweep_is_not_brought_back_by_an_older_event() -> None:
    rec = _rec()
    rec.seen(Event("ADDED", _sweep(5), 5))
    rec.seen(Event("DELETED", _sweep(7), 7))
    assert KEY not in rec._seen
    rec.seen(Event("MODIFIED", _sweep(5), 0))  # a resync's list read before the delete
    assert KEY not in rec._seen, "a pass must find the Sweep gone and collect its cells"
    rec.seen(Event("ADDED", _sweep(8, uid="u2"), 8))  # created again under the same name
    assert rec._seen[KEY].metadata.uid == "u2"


def test_reset_forgets_everything_a_new_term_as_leader_must_read_again() -> None:
    rec = _rec()
    rec.seen(Event("ADDED", _sweep(5), 5))
    rec.seen(Event("DELETED", _sweep(6, uid="u0"), 6))
    rec.reset()
    assert rec._seen == {} and rec._gone == {}


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
