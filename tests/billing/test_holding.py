"""The pure core of holds, caps, budgets and the double-entry ledger: each rule and each refusal."""

from __future__ import annotations

from nodus_billing.accounting import fold
from nodus_billing.holding import (
    Capture,
    Charge,
    Expire,
    ExtendHold,
    Grant,
    Op,
    PlaceHold,
    PutBudget,
    PutJob,
    PutSweep,
    Release,
    Revoke,
    apply,
    decode,
    encode,
    hold_amount,
)
from nodus_billing.standing import (
    Result,
    State,
    available,
    job_held,
    job_spent,
    resumable,
    suspensions,
)

JAN = 1_767_225_600_000  # 2026-01-01T00:00:00Z
FEB = 1_769_904_000_000  # 2026-02-01T00:00:00Z


def run(state: State, *ops: Op) -> tuple[State, Result]:
    result = Result(op_id="")
    for op in ops:
        state, result, _ = apply(state, op)
    return state, result


def funded(credits: int = 100, job_cap: int | None = None) -> State:
    state, _ = run(
        State(),
        Grant(grant_id="g1", project="p", amount_micros=credits),
        PutJob(name="j", project="p", generation=1, max_cost_micros=job_cap, labels={"team": "ml"}),
    )
    return state


def hold(hold_id: str, amount: int, job: str = "j", at: int = JAN) -> PlaceHold:
    return PlaceHold(hold_id=hold_id, job=job, amount_micros=amount, funded_until_ms=at + 60_000, at_ms=at)


def test_a_hold_moves_credits_from_available_to_the_hold() -> None:
    state, result = run(funded(), hold("h", 30))
    assert result.ok
    assert available(state, "p") == 70
    assert job_held(state, "j") == 30
    assert state.balances == fold(state.ledger.values())


def test_a_hold_beyond_the_balance_is_refused_with_insufficient_credits() -> None:
    state, result = run(funded(100), hold("a", 60), hold("b", 41))
    assert (result.ok, result.code) == (False, "InsufficientCredits")
    assert "$0.00004 not held" in (result.message or "") and "grant at least $0.000001" in (result.fix or "")
    assert "b" not in state.holds


def test_a_hold_beyond_the_job_cap_is_refused_with_max_cost_reached() -> None:
    state, result = run(funded(1000, job_cap=50), hold("a", 30), Capture(hold_id="a", amount_micros=20))
    assert job_spent(state, "j") == 20
    state, result = run(state, hold("b", 31))
    assert result.code == "MaxCostReached"
    assert "at least $0.000051" in (result.fix or "")
    state, result = run(state, hold("c", 30))
    assert result.ok


def test_a_cell_must_fit_the_sweeps_shared_cap_and_its_own() -> None:
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=1000),
        PutSweep(name="s", project="p", generation=1, max_cost_micros=100),
        PutJob(name="c1", project="p", generation=1, sweep="s"),
        PutJob(name="c2", project="p", generation=1, sweep="s", max_cost_micros=40),
    )
    state, result = run(state, hold("h1", 70, job="c1"))
    assert result.ok
    _, result = run(state, hold("h2", 31, job="c2"))
    assert result.code == "MaxCostReached" and "sweep s" in (result.message or "")
    _, result = run(state, hold("h2", 41, job="c2"))
    assert result.code == "MaxCostReached" and "job c2" in (result.message or "")
    _, result = run(state, hold("h2", 30, job="c2"))
    assert result.ok


def test_budgets_with_matching_labels_bound_each_month() -> None:
    state, _ = run(
        funded(1000),
        PutBudget(name="ml", project="p", monthly_micros=50, generation=1, selector={"team": "ml"}),
        PutBudget(name="other", project="p", monthly_micros=1, generation=1, selector={"team": "web"}),
    )
    state, result = run(state, hold("a", 40))
    assert result.ok
    _, result = run(state, hold("b", 11))
    assert result.code == "BudgetExceeded" and "ml" in (result.message or "")
    _, result = run(state, hold("b", 11, at=FEB))
    assert result.ok, "a new month has a new budget"


def test_capture_charges_and_releases_the_rest_once() -> None:
    state, result = run(funded(100), hold("h", 60), Capture(hold_id="h", amount_micros=25))
    assert (result.charged_micros, result.released_micros, result.overrun_micros) == (25, 35, 0)
    assert (job_spent(state, "j"), job_held(state, "j"), available(state, "p")) == (25, 0, 75)
    _, again = run(state, Release(hold_id="h"))
    assert again.code == "Conflict" and "already captured" in (again.message or "")


def test_usage_beyond_the_hold_is_reported_not_charged() -> None:
    state, result = run(funded(100), hold("h", 30), Charge(hold_id="h", tick="1", amount_micros=20))
    assert result.charged_micros == 20
    state, result = run(state, Capture(hold_id="h", amount_micros=15))
    assert (result.charged_micros, result.overrun_micros, result.released_micros) == (10, 5, 0)
    assert job_spent(state, "j") == 30
    assert state.jobs["j"].unbilled_micros == 5


def test_a_capture_gives_back_what_ticks_charged_beyond_the_runs_final_charge() -> None:
    # Ticks charged 20 (the run's finish reached the meter late); the run's final charge is 8.
    state, _ = run(funded(100), hold("h", 30), Charge(hold_id="h", tick="1", amount_micros=20))
    state, result = run(state, Capture(hold_id="h", amount_micros=0, total_micros=8))
    assert result.ok and (result.refunded_micros, result.charged_micros, result.released_micros) == (
        12,
        0,
        22,
    )
    assert (job_spent(state, "j"), job_held(state, "j"), available(state, "p")) == (8, 0, 92)
    assert state.holds["h"].charged_micros == 8 and state.holds["h"].status == "Captured"
    assert fold(state.ledger.values()) == state.balances
    again, same, more = apply(state, Capture(hold_id="h", amount_micros=0, total_micros=8))
    assert more == [] and encode(again) == encode(state) and same.code == "Conflict"


def test_a_capture_with_its_total_charges_what_the_ticks_did_not() -> None:
    state, _ = run(funded(100), hold("h", 30), Charge(hold_id="h", tick="1", amount_micros=5))
    state, result = run(state, Capture(hold_id="h", amount_micros=999, total_micros=12))
    assert (result.charged_micros, result.refunded_micros, result.released_micros) == (7, 0, 18)
    assert job_spent(state, "j") == 12
    _, refused = run(funded(100), hold("x", 30), Capture(hold_id="x", amount_micros=0, total_micros=-1))
    assert refused.code == "Invalid"


def test_an_extension_must_fit_like_a_hold() -> None:
    state, _ = run(funded(1000, job_cap=50), hold("h", 30))
    state, result = run(state, ExtendHold(hold_id="h", more_micros=20, funded_until_ms=JAN + 120_000))
    assert result.ok and state.holds["h"].funded_until_ms == JAN + 120_000
    _, result = run(state, ExtendHold(hold_id="h", more_micros=1, funded_until_ms=JAN + 180_000))
    assert result.code == "MaxCostReached"


def test_expire_releases_holds_nobody_extended() -> None:
    state, _ = run(funded(100), hold("a", 10), hold("b", 10, at=JAN + 1000))
    state, result = run(state, Expire(now_ms=JAN + 60_500))
    assert result.expired == ["a"] and result.released_micros == 10
    assert state.holds["a"].status == "Expired" and state.holds["b"].status == "Open"
    _, late = run(state, Capture(hold_id="a", amount_micros=5))
    assert late.code == "Conflict"


def test_every_operation_applied_twice_changes_nothing() -> None:
    state, _ = run(funded(100), hold("h", 30))
    for op in (
        Charge(hold_id="h", tick="1", amount_micros=5),
        ExtendHold(hold_id="h", more_micros=10, funded_until_ms=JAN + 120_000),
        Grant(grant_id="g1", project="p", amount_micros=100),
        Capture(hold_id="h", amount_micros=7),
        Expire(now_ms=JAN),
    ):
        once, first, _posted = apply(state, op)
        twice, second, more = apply(once, op)
        assert more == [] and encode(twice) == encode(once), op
        # Remembered operations answer as the first time; a guarded one (a tick, an extension) answers
        # that it did nothing; any operation on a hold that has resolved is a Conflict.
        assert second == first or second.charged_micros == 0 or second.code == "Conflict", (op, second)
        state = once
    assert job_spent(state, "j") == 12


def test_a_resolved_hold_leaves_one_netted_entry_and_no_results() -> None:
    state, _ = run(funded(100), hold("h", 30))
    for tick in range(1, 40):  # a long run: many ticks and extensions
        state, _ = run(
            state,
            Charge(hold_id="h", tick=str(tick), amount_micros=0 if tick % 2 else 1),
            ExtendHold(hold_id="h", more_micros=1, funded_until_ms=JAN + 60_000 + tick),
        )
    assert {e for e in state.ledger if e.startswith("hold:h:")} == {"hold:h:place", "hold:h:charged"}
    state, result = run(state, Capture(hold_id="h", amount_micros=5))
    assert result.ok and job_spent(state, "j") == 19 + 5
    assert [e for e in state.ledger if e.startswith("hold:h:")] == ["hold:h:settled"]
    assert state.ledger["hold:h:settled"].amount_micros == 24
    assert not [k for k in state.results if k.startswith("hold:h:")]
    assert fold(state.ledger.values()) == state.balances and available(state, "p") == 100 - 24
    _, late = run(state, hold("h", 30))
    assert late.code == "Conflict", "the hold's id stays taken"


def test_apply_never_touches_the_state_it_was_given() -> None:
    state = funded(100)
    before = encode(state)
    apply(state, hold("h", 30))
    assert encode(state) == before


def test_revoke_takes_only_credits_no_hold_reserves() -> None:
    state, _ = run(funded(100), hold("h", 70))
    _, result = run(state, Revoke(revoke_id="r", project="p", amount_micros=31))
    assert result.code == "InsufficientCredits" and "at most $0.00003," in (result.fix or "")
    state, result = run(state, Revoke(revoke_id="r2", project="p", amount_micros=30))
    assert result.ok and available(state, "p") == 0


def test_a_stale_generation_does_not_undo_a_cap_raise() -> None:
    state, _ = run(
        funded(1000, job_cap=10),
        PutJob(name="j", project="p", generation=3, max_cost_micros=90),
        PutJob(name="j", project="p", generation=2, max_cost_micros=10),
    )
    assert state.jobs["j"].max_cost_micros == 90


def test_a_job_never_moves_to_another_project_or_sweep() -> None:
    _, result = run(funded(), PutJob(name="j", project="q", generation=2))
    assert result.code == "Conflict"


def test_caps_list_what_must_stop_and_raising_the_cap_resumes() -> None:
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=1000),
        PutSweep(name="s", project="p", generation=1, max_cost_micros=100),
        PutJob(name="c1", project="p", generation=1, sweep="s"),
        PutJob(name="c2", project="p", generation=1, sweep="s"),
        hold("h1", 50, job="c1"),
        hold("h2", 45, job="c2"),
    )
    stopped = {(s.kind, s.name, s.reason) for s in suspensions(state, increment_micros=10)}
    assert stopped == {
        ("Sweep", "s", "MaxCostReached"),
        ("Job", "c1", "MaxCostReached"),
        ("Job", "c2", "MaxCostReached"),
    }
    assert not resumable(state, "c1", 10)
    state, _ = run(state, PutSweep(name="s", project="p", generation=2, max_cost_micros=200))
    assert suspensions(state, 10) == [] and resumable(state, "c1", 10)


def test_a_project_out_of_credit_is_listed_with_a_fix() -> None:
    state, _ = run(funded(100), hold("h", 95))
    [out] = suspensions(state, increment_micros=10)
    assert (out.kind, out.reason) == ("Project", "InsufficientCredits")
    assert "add at least $0.000005" in out.fix


def test_the_state_round_trips_through_json_in_camel_case() -> None:
    state, _ = run(funded(100), hold("h", 30), Charge(hold_id="h", tick="1", amount_micros=3))
    data = encode(state)
    assert b'"fundedUntilMs"' in data and b'"amountMicros"' in data
    assert decode(data) == state


def test_hold_amount_rounds_up_like_charges() -> None:
    assert hold_amount(2_990_000, 1000) == 831
    assert hold_amount(3_600_000, 3_600_000) == 3_600_000


# -- what the money simulator found (#18), each a regression test ---------------------------------------


def test_a_runs_overrun_is_recorded_once_however_many_ticks_ask_again() -> None:
    """Every tick asks for the run's whole usage so far less what the hold charged: past the funding it
    asks again for the overrun an earlier tick recorded. Hold 100; ticks at 120 and 150; final 160."""
    state, _ = run(
        funded(1_000),
        hold("h", 100),
        Charge(hold_id="h", tick="1", amount_micros=120),
        Charge(hold_id="h", tick="2", amount_micros=50),
    )
    assert state.jobs["j"].unbilled_micros == 50  # 150 used, 100 charged: 50, not 20 + 50
    state, result = run(state, Capture(hold_id="h", amount_micros=0, total_micros=160))
    assert (result.charged_micros, job_spent(state, "j")) == (0, 100)
    assert state.jobs["j"].unbilled_micros == 60  # the run's real overrun, not 130


def test_an_overrun_an_extension_pays_for_later_is_no_longer_unbilled() -> None:
    state, _ = run(
        funded(1_000),
        hold("h", 100),
        Charge(hold_id="h", tick="1", amount_micros=120),
        ExtendHold(hold_id="h", more_micros=100, funded_until_ms=JAN + 120_000),
        Charge(hold_id="h", tick="2", amount_micros=30),
    )
    assert (job_spent(state, "j"), state.jobs["j"].unbilled_micros) == (130, 0)


def test_a_deleted_budget_is_not_brought_back_by_a_late_put() -> None:
    put = PutBudget(name="b@u1", project="p", monthly_micros=10, generation=2)
    gone = PutBudget(name="b@u1", project="p", monthly_micros=0, generation=2, deleted=True)
    state, _ = run(funded(100), put, gone)
    for late in (put, PutBudget(name="b@u1", project="p", monthly_micros=10, generation=3)):
        again, _ = run(state, late)
        assert encode(again) == encode(state), "a deleted Budget stays deleted"
    _, result = run(state, hold("h", 50))
    assert result.ok, "a deleted Budget binds nothing"
    # A delete that arrives before the put of the same Budget: the put, when it comes, puts nothing.
    early, _ = run(funded(100), gone, put)
    assert early.budgets["b@u1"].deleted


def test_an_extensions_room_is_judged_by_the_budgets_of_its_holds_month_and_labels() -> None:
    """room_for(…, hold.month, hold.labels) is what apply allows an extension: sized by this month's
    Budget or the Job's labels now, it was refused at a month's turn or after a relabel."""
    from nodus_billing.standing import month_of, room_for

    state, _ = run(
        funded(1_000),
        PutBudget(name="ml", project="p", monthly_micros=150, generation=1, selector={"team": "ml"}),
        hold("h", 100),  # January, labels team=ml: 50 left under the Budget in January
        PutJob(name="j", project="p", generation=2, labels={"team": "web"}),
    )
    h = state.holds["h"]
    now_room, _ = room_for(state, "j", month_of(FEB))  # February, team=web: the Budget does not apply
    room, code = room_for(state, "j", h.month, h.labels)
    assert (room, code) == (50, "BudgetExceeded") and now_room > room
    _, too_much = run(state, ExtendHold(hold_id="h", more_micros=room + 1, funded_until_ms=FEB))
    assert too_much.code == "BudgetExceeded"
    _, fits = run(state, ExtendHold(hold_id="h", more_micros=room, funded_until_ms=FEB))
    assert fits.ok
