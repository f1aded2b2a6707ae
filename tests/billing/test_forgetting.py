"""Forgetting deleted Jobs' records (issue #23, ``nodus_billing.forgetting``): once a Job is deleted and
its runs are filed, the book keeps only totals of it, and every cap, Budget and the account read the same.

Pure: operations on :class:`State` values. The meter's side (a deleted Job's runs filed and its record
forgotten in one commit) is in tests/scheduler/test_funding.py; the money simulator deletes and forgets
done Jobs too and checks every invariant against the book with their records put back.
"""

from __future__ import annotations

from nodus_billing.accounting import fold
from nodus_billing.archiving import settled_of
from nodus_billing.holding import (
    Capture,
    File,
    Forget,
    Grant,
    Op,
    PlaceHold,
    PutBudget,
    PutJob,
    PutPipeline,
    PutSweep,
    apply,
    encode,
)
from nodus_billing.invariants import unfiled
from nodus_billing.serving import account_view
from nodus_billing.standing import (
    Job,
    Result,
    State,
    Usage,
    budget_used,
    caps_over,
    pipeline_spent,
    room_for,
    sweep_spent,
)

JAN = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def run(state: State, *ops: Op) -> tuple[State, Result]:
    result = Result(op_id="")
    for op in ops:
        state, result, _ = apply(state, op)
        assert state.balances == fold(state.ledger.values()), f"after {op}"
        assert sum(state.balances.values()) == 0
    return state, result


def ran(state: State, hold_id: str, job: str, charge: int, unbilled: int = 0) -> State:
    """A run of ``job``: held (500 µ$), then captured at ``charge``, reporting ``unbilled`` beyond it."""
    place = PlaceHold(hold_id=hold_id, job=job, amount_micros=500, funded_until_ms=JAN + 60_000, at_ms=JAN)
    total = charge + unbilled
    usage = Usage(attempt=hold_id, rate_micros_per_hour=3_600_000)
    cap = Capture(hold_id=hold_id, amount_micros=total, usage=usage, total_micros=total)
    state, _ = run(state, place, cap)
    return state


def book() -> State:
    """A Pipeline over a Sweep (two cells) and a Job stage; a Job alone; Budgets with and without selector."""
    cell = {"team": "ml", "nodus.dev/sweep": "s"}
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=100_000),
        PutPipeline(name="pl@1", project="p", generation=1, max_cost_micros=5_000),
        PutSweep(name="s@1", project="p", generation=1, max_cost_micros=2_000, pipeline="pl@1"),
        PutJob(name="c0@1", project="p", generation=1, sweep="s@1", labels={**cell, "nodus.dev/cell": "0"}),
        PutJob(name="c1@1", project="p", generation=1, sweep="s@1", labels={**cell, "nodus.dev/cell": "1"}),
        PutJob(name="st@1", project="p", generation=1, pipeline="pl@1", labels={"team": "ml"}),
        PutJob(name="j@1", project="p", generation=1, labels={"team": "web"}),
        PutBudget(name="all@1", project="p", monthly_micros=50_000, generation=1),
        PutBudget(name="ml@1", project="p", monthly_micros=20_000, generation=1, selector={"team": "ml"}),
    )
    state = ran(state, "c0-a", "c0@1", 500, unbilled=30)  # 30 beyond its hold: unbilled
    state = ran(state, "c1-a", "c1@1", 300)
    state = ran(state, "st-a", "st@1", 70)
    return ran(state, "j-a", "j@1", 50)


def filed_and_forgotten(state: State, *jobs: str) -> tuple[State, dict[str, object], dict[str, Job]]:
    """The meter's deleted path: the history record, File, then Forget."""
    history: dict[str, object] = {}
    records: dict[str, Job] = {}
    for job in jobs:
        holds = settled_of(state, job)
        history.update(holds)
        state, result = run(state, File(job=job, hold_ids=sorted(holds)))
        assert result.ok, result
        records[job] = state.jobs[job]
        state, result = run(state, Forget(job=job))
        assert result.ok, result
    return state, history, records


def test_a_deleted_cells_record_folds_into_its_sweep_and_everything_reads_the_same() -> None:
    before = book()
    after, history, records = filed_and_forgotten(before, "c0@1", "st@1", "j@1")
    assert set(after.jobs) == {"c1@1"}, "only the live Job's record stays"
    assert after.sweeps["s@1"].forgotten_micros == 500 and after.pipelines["pl@1"].forgotten_micros == 70
    assert sweep_spent(after, "s@1") == sweep_spent(before, "s@1") == 800
    assert pipeline_spent(after, "pl@1") == pipeline_spent(before, "pl@1") == 870
    assert caps_over(after, "c1@1") == caps_over(before, "c1@1")
    assert room_for(after, "c1@1", "2026-01") == room_for(before, "c1@1", "2026-01")
    for budget in before.budgets.values():
        assert budget_used(after, budget, "2026-01") == budget_used(before, budget, "2026-01")
    view = account_view("p", after)
    assert view == account_view("p", before) and view.unbilled_micros == 30
    # Put back together from its history and the records as they were, the book is the book before.
    whole = unfiled(after, history, records)  # type: ignore[arg-type]
    assert whole.jobs == before.jobs and whole.holds == before.holds and whole.balances == before.balances


def test_a_budget_with_a_selector_created_later_counts_what_forgotten_jobs_spent() -> None:
    after, _, _ = filed_and_forgotten(book(), "c0@1", "c1@1", "st@1")
    later, _ = run(
        after,
        PutBudget(name="ml2@1", project="p", monthly_micros=9_000, generation=1, selector={"team": "ml"}),
    )
    assert budget_used(later, later.budgets["ml2@1"], "2026-01") == 500 + 300 + 70
    # The cells fold into one row (their nodus.dev/cell labels told them apart); the stage into another.
    assert sorted((r.jobs, sum(r.months.values())) for r in later.forgotten) == [(1, 70), (2, 800)]


def test_a_job_with_a_run_in_the_book_is_not_forgotten_and_forgetting_twice_changes_nothing() -> None:
    state = book()
    state, result = run(state, Forget(job="c0@1"))
    assert (result.ok, result.code) == (False, "Conflict") and "c0@1" in state.jobs, "its run comes first"
    gone, _, _ = filed_and_forgotten(state, "c0@1")
    again, result = run(gone, Forget(job="c0@1"))
    assert result.ok and encode(again) == encode(gone)


def test_a_sweep_put_again_keeps_what_its_forgotten_cells_spent() -> None:
    gone, _, _ = filed_and_forgotten(book(), "c0@1")
    raised, _ = run(
        gone, PutSweep(name="s@1", project="p", generation=2, max_cost_micros=3_000, pipeline="pl@1")
    )
    assert raised.sweeps["s@1"].forgotten_micros == 500 and sweep_spent(raised, "s@1") == 800
    assert caps_over(raised, "c1@1")[0].committed == 800


def test_a_job_put_again_keeps_what_it_filed() -> None:
    state = book()
    holds = settled_of(state, "j@1")
    state, _ = run(state, File(job="j@1", hold_ids=sorted(holds)))
    state, _ = run(
        state, PutJob(name="j@1", project="p", generation=2, labels={"team": "web"}, max_cost_micros=9)
    )
    assert state.jobs["j@1"].filed == ["j-a"] and state.jobs["j@1"].filed_months == {"2026-01": 50}
    assert state.jobs["j@1"].max_cost_micros == 9


def test_a_deleted_sweeps_thousand_cells_leave_the_book_the_size_it_had_before_them() -> None:
    state, _ = run(State(), Grant(grant_id="g", project="p", amount_micros=10**12))
    sweep = "grid@0f1c6d0e-8b1e-4e7a-9d55-7c1b2f3a4d5e"
    apply(state, PutSweep(name=sweep, project="p", generation=1), copy=False)
    empty = len(encode(state))
    jobs = [f"grid-{i}@{i:08d}-8b1e-4e7a-9d55-7c1b2f3a4d5e" for i in range(1000)]
    labels = {"nodus.dev/sweep": "grid", "team": "ml"}
    for i, job in enumerate(jobs):  # applied in place, as a commit applies its operations (books.py)
        hold_id = f"grid-{i}-{i:08x}-1-1"
        usage = Usage(attempt=hold_id, rate_micros_per_hour=3_600_000)
        for op in (
            PutJob(
                name=job, project="p", generation=1, sweep=sweep, labels={**labels, "nodus.dev/cell": str(i)}
            ),
            PlaceHold(hold_id=hold_id, job=job, amount_micros=500, funded_until_ms=JAN + 60_000, at_ms=JAN),
            Capture(hold_id=hold_id, amount_micros=123, usage=usage, total_micros=123),
        ):
            apply(state, op, copy=False)
    for job in jobs:
        apply(state, File(job=job, hold_ids=sorted(settled_of(state, job))), copy=False)
        apply(state, Forget(job=job), copy=False)
    kept = len(encode(state))
    print(f"a book before a 1,000-cell Sweep: {empty:,} bytes; after it, its cells deleted: {kept:,}")
    assert not state.jobs and not state.holds and state.balances == fold(state.ledger.values())
    assert sweep_spent(state, sweep) == 1000 * 123
    assert kept - empty < 300, "the same size, give or take the totals"
