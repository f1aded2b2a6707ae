"""Filing settled runs out of a project's book (issue #23, ``nodus_billing.filing``): the book keeps what
is open, and what a finished Job spent still counts under every cap, every Budget and the account.

Pure: operations on :class:`State` values. The service's side (history first, then the book; the usage
report reading both) is in tests/scheduler/test_funding.py; the money simulator files done Jobs too and
checks every invariant against the book with its filed runs put back (``invariants.unfiled``).
"""

from __future__ import annotations

import pytest

from nodus_billing.accounting import fold
from nodus_billing.archiving import record_name, settled_of
from nodus_billing.holding import (
    Capture,
    File,
    Forget,
    Grant,
    Op,
    PlaceHold,
    PutBudget,
    PutJob,
    PutSweep,
    Release,
    apply,
    encode,
)
from nodus_billing.invariants import Broken, unfiled
from nodus_billing.serving import account_view, usage_rows
from nodus_billing.standing import (
    Hold,
    Result,
    State,
    Usage,
    available,
    budget_used,
    caps_over,
    job_spent,
    room_for,
    sweep_spent,
)

JAN = 1_767_225_600_000  # 2026-01-01T00:00:00Z
FEB = 1_769_904_000_000  # 2026-02-01T00:00:00Z
LABELS = {"team": "ml"}


def run(state: State, *ops: Op) -> tuple[State, Result]:
    result = Result(op_id="")
    for op in ops:
        state, result, _ = apply(state, op)
        assert state.balances == fold(state.ledger.values()), f"after {op}"
        assert sum(state.balances.values()) == 0
    return state, result


def usage(attempt: str, covered: int = 0) -> Usage:
    return Usage(
        attempt=attempt, rate_micros_per_hour=3_600_000, covered={"Boot": covered} if covered else {}
    )


def ran(state: State, hold_id: str, job: str, charge: int, at: int = JAN, covered: int = 0) -> State:
    """A run of ``job``: held, then captured at ``charge``."""
    place = PlaceHold(hold_id=hold_id, job=job, amount_micros=500, funded_until_ms=at + 60_000, at_ms=at)
    state, result = run(state, place)
    assert result.ok, result
    state, result = run(
        state,
        Capture(hold_id=hold_id, amount_micros=charge, usage=usage(hold_id, covered), total_micros=charge),
    )
    assert result.ok, result
    return state


def book() -> State:
    """Project p: credits, a Sweep capped at 1,000 µ$ with two cells, a Job stage alone, Budgets."""
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=10_000),
        PutSweep(name="s@1", project="p", generation=1, max_cost_micros=1_000),
        PutJob(name="c0@1", project="p", generation=1, sweep="s@1", labels=LABELS),
        PutJob(name="c1@1", project="p", generation=1, sweep="s@1", labels=LABELS),
        PutJob(name="j@1", project="p", generation=1, labels={"team": "web"}, max_cost_micros=900),
        PutBudget(name="all@1", project="p", monthly_micros=5_000, generation=1),
        PutBudget(name="ml@1", project="p", monthly_micros=2_000, generation=1, selector=LABELS),
    )
    state = ran(state, "c0-a", "c0@1", 120)
    state = ran(state, "c0-b", "c0@1", 80, at=FEB, covered=7)
    state = ran(state, "c1-a", "c1@1", 300)
    return ran(state, "j-a", "j@1", 50)


def filed(state: State, job: str) -> tuple[State, dict[str, Hold]]:
    """The meter's two steps: the history record (here, a dict), then File."""
    holds = settled_of(state, job)
    state, result = run(state, File(job=job, hold_ids=sorted(holds)))
    assert result.ok, result
    return state, holds


def test_a_finished_jobs_runs_leave_the_book_and_everything_it_spent_still_counts() -> None:
    before = book()
    after, history = filed(before, "c0@1")
    assert sorted(history) == ["c0-a", "c0-b"]
    assert not {"c0-a", "c0-b"} & set(after.holds), "the hold records left the book"
    assert not [e for e in after.ledger if e.startswith(("hold:c0-a", "hold:c0-b"))], "and their entries"
    job = after.jobs["c0@1"]
    assert sorted(job.filed) == ["c0-a", "c0-b"]
    assert job.filed_months == {"2026-01": 120, "2026-02": 80}
    assert after.filed == {"2026-01": 120, "2026-02": 80}
    assert after.balances["project:p:filed"] == 200 and "spend:c0@1" not in after.balances
    # Every reader says what it said before: the Job's spend, its Sweep's, the caps, the Budgets, the account.
    assert job_spent(after, "c0@1") == job_spent(before, "c0@1") == 200
    assert sweep_spent(after, "s@1") == sweep_spent(before, "s@1") == 500
    for name in before.jobs:
        assert caps_over(after, name) == caps_over(before, name)
        assert room_for(after, name, "2026-01") == room_for(before, name, "2026-01")
    for budget in before.budgets.values():
        for month in ("2026-01", "2026-02"):
            assert budget_used(after, budget, month) == budget_used(before, budget, month)
    assert account_view("p", after) == account_view("p", before)
    assert available(after, "p") == available(before, "p")
    # The book put back together from its history is the book before, to the entry.
    whole = unfiled(after, history)
    assert whole.holds == before.holds and whole.balances == before.balances
    assert {k: v.amount_micros for k, v in whole.ledger.items()} == {
        k: v.amount_micros for k, v in before.ledger.items()
    }


def test_the_usage_report_reads_the_filed_runs_from_history_and_the_rest_from_the_book() -> None:
    before = book()
    after, history = filed(before, "c0@1")
    runs = {**history, **after.holds}  # what Archive.runs reads
    assert usage_rows(after, "p", None, runs) == usage_rows(before, "p", None)
    assert [r.attempt for r in usage_rows(after, "p", "2026-02", runs)] == ["c0-b"]


def test_the_usage_report_names_a_forgotten_cells_sweep_from_its_history() -> None:
    """A final cell's record leaves the book with its runs (forgetting): its history record keeps the Sweep
    the report names (``JobHistory.sweep``)."""
    before = book()
    after, history = filed(before, "c0@1")
    after, result = run(after, Forget(job="c0@1"))
    assert result.ok and "c0@1" not in after.jobs
    runs = {**history, **after.holds}
    assert usage_rows(after, "p", None, runs, {"c0@1": "s@1"}) == usage_rows(before, "p", None)
    unnamed = {r.sweep for r in usage_rows(after, "p", None, runs) if r.attempt.startswith("c0")}
    assert unnamed == {None}, "the book alone no longer knows it"


def test_a_late_operation_on_a_filed_hold_is_a_conflict_never_a_new_hold() -> None:
    after, _ = filed(book(), "c0@1")
    text = encode(after)
    late = [
        PlaceHold(hold_id="c0-a", job="c0@1", amount_micros=500, funded_until_ms=JAN + 60_000, at_ms=JAN),
        Capture(hold_id="c0-b", amount_micros=80, total_micros=80),
        Release(hold_id="c0-a"),
    ]
    for op in late:
        state, result, posted = apply(after, op)
        assert (result.ok, result.code) == (False, "Conflict"), op
        assert "is filed" in (result.message or "")
        assert posted == [] and encode(state) == text, "nothing moved"


def test_filing_leaves_open_holds_other_jobs_runs_and_runs_placed_under_other_labels() -> None:
    state = book()
    place = PlaceHold(hold_id="c0-c", job="c0@1", amount_micros=100, funded_until_ms=JAN + 9, at_ms=JAN)
    state, _ = run(state, place)
    state, _ = run(state, File(job="c0@1", hold_ids=["c0-a", "c0-c", "c1-a", "nope"]))
    assert "c0-a" not in state.holds
    assert state.holds["c0-c"].status == "Open" and "c1-a" in state.holds, "open, and another Job's: kept"
    # Relabelled since its runs were placed: what a selector Budget counts of them would change; kept.
    state, _ = run(state, PutJob(name="c1@1", project="p", generation=2, sweep="s@1", labels={"team": "x"}))
    assert settled_of(state, "c1@1") == {}
    again, _ = run(state, File(job="c1@1", hold_ids=["c1-a"]))
    assert "c1-a" in again.holds


def test_filing_twice_changes_nothing() -> None:
    once, _ = filed(book(), "c0@1")
    twice, result = run(once, File(job="c0@1", hold_ids=["c0-a", "c0-b"]))
    assert result.ok and encode(twice) == encode(once)


def test_a_job_the_book_does_not_know_is_refused() -> None:
    _, result = run(book(), File(job="nobody@1", hold_ids=["x"]))
    assert (result.ok, result.code) == (False, "NotFound")


def test_what_the_book_keeps_of_a_finished_run_is_a_small_part_of_what_it_kept() -> None:
    """A 1,000-cell Sweep's book (issue #23): every cell ran once; once filed, the book is a fraction of the
    size (the bus's largest message was its ceiling: 1 MiB held about 1,000 runs)."""
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=10**12),
        PutSweep(name="grid@0f1c6d0e-8b1e-4e7a-9d55-7c1b2f3a4d5e", project="p", generation=1),
    )
    sweep = "grid@0f1c6d0e-8b1e-4e7a-9d55-7c1b2f3a4d5e"
    labels = {"nodus.dev/sweep": "grid", "team": "ml"}
    jobs = [f"grid-{i}@{i:08d}-8b1e-4e7a-9d55-7c1b2f3a4d5e" for i in range(1000)]
    for i, job in enumerate(jobs):  # applied in place, as a commit applies its operations (books.py)
        hold_id = f"grid-{i}-{i:08x}-1-1"
        for op in (
            PutJob(
                name=job, project="p", generation=1, sweep=sweep, labels={**labels, "nodus.dev/cell": str(i)}
            ),
            PlaceHold(hold_id=hold_id, job=job, amount_micros=500, funded_until_ms=JAN + 60_000, at_ms=JAN),
            Capture(hold_id=hold_id, amount_micros=123, usage=usage(hold_id), total_micros=123),
        ):
            apply(state, op, copy=False)
    full = len(encode(state))
    for job in jobs:
        apply(state, File(job=job, hold_ids=sorted(settled_of(state, job))), copy=False)
    kept = len(encode(state))
    assert not state.holds and state.balances == fold(state.ledger.values())
    assert sweep_spent(state, sweep) == 1000 * 123
    print(f"1,000 finished runs: {full:,} bytes in the book, {kept:,} once filed")
    assert kept < full / 2.5, (full, kept)
    assert kept / 1000 < 400, f"{kept / 1000:.0f} bytes per finished run"


def test_the_history_records_name_is_the_jobs_name_and_uid() -> None:
    assert record_name("train-3@0f1c") == "train-3-0f1c"
    assert record_name("plain") == "plain"


def test_the_checks_refuse_a_book_whose_filed_runs_history_lost() -> None:
    after, _ = filed(book(), "c0@1")
    with pytest.raises(Broken, match="no history record"):
        unfiled(after, {})
