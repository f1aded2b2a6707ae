"""No amount can poison a book: holds, charges, releases, grants with amounts up to and far beyond the
bounds (``standing.BOOK_MAX_MICROS``, the API's MAX_USD, MAX_DURATION) leave a book that always encodes
(msgpack, which ``apply`` copies through, and JSON, which KV keeps), decodes to the same value, and keeps
every invariant of ADR-0023.

The bug these bounds close: a Job admitted with ``maxCostUSD: "99999999999999"`` (10^20 µ$) was put into
its project's book, which JSON stored, and every later ``apply`` failed in msgpack (OverflowError).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

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
    granted_total,
)
from nodus_billing.standing import (
    BOOK_MAX_MICROS,
    MAX_GRANT_MICROS,
    Result,
    State,
    Usage,
    available,
    held,
    job_held,
    job_spent,
    room_for,
    sweep_held,
    sweep_spent,
)
from nodus_schema.ledger import charge_micros
from nodus_schema.quantities import MAX_DURATION, MAX_USD_MICROS, duration_micros, usd_to_micros

PROJECTS = ("p", "q")
START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MAX_DURATION_MS = duration_micros(MAX_DURATION) // 1000
INT64 = 2**63 - 1

# Amounts from the everyday to far past every bound: near MAX_USD, near the book's bound, near 64 bits.
amounts = st.one_of(
    st.integers(min_value=0, max_value=5_000),
    st.integers(min_value=0, max_value=MAX_USD_MICROS),
    st.integers(min_value=MAX_USD_MICROS - 3, max_value=MAX_USD_MICROS + 3),
    st.integers(min_value=BOOK_MAX_MICROS - 3, max_value=BOOK_MAX_MICROS + 3),
    st.integers(min_value=2**63 - 3, max_value=2**64 + 3),
    st.integers(min_value=0, max_value=10**30),
)
rates = st.one_of(
    st.integers(min_value=1, max_value=100_000_000),  # up to $100/h: every price book
    st.integers(min_value=1, max_value=MAX_USD_MICROS),  # up to MAX_USD an hour
    st.integers(min_value=1, max_value=10**24),
)
durations_ms = st.one_of(
    st.integers(min_value=0, max_value=600_000), st.integers(min_value=0, max_value=MAX_DURATION_MS)
)


def ints_of(value: Any) -> list[int]:
    """Every integer in a value, as msgspec would write it."""
    tree = msgspec.to_builtins(value)
    out: list[int] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, int) and not isinstance(node, bool):
            out.append(node)

    walk(tree)
    return out


def assert_encodes(state: State) -> None:
    """The book encodes both ways and decodes to the same value; every integer is within the bound."""
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=State) == state
    assert decode(encode(state)) == state
    assert all(-BOOK_MAX_MICROS <= n <= BOOK_MAX_MICROS for n in ints_of(state))


class Bounds(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = State()
        self.now = START
        self.serial = 0
        self.granted: Counter[str] = Counter()
        self.generations: Counter[str] = Counter()
        self.rates: dict[str, int] = {}

    def do(self, op: Op) -> Result:
        self.state, result, _ = apply(self.state, op)
        return result

    def fresh(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def open_holds(self) -> list[str]:
        return sorted(h for h, hold in self.state.holds.items() if hold.status == "Open")

    @rule(project=st.sampled_from(PROJECTS), amount=amounts)
    def grant(self, project: str, amount: int) -> None:
        fits = 0 < amount <= MAX_GRANT_MICROS and granted_total(self.state) + amount <= BOOK_MAX_MICROS
        result = self.do(Grant(grant_id=self.fresh("g"), project=project, amount_micros=amount))
        assert result.ok == fits, result
        assert result.ok or (result.message and result.fix)
        if result.ok:
            self.granted[project] += amount

    @rule(project=st.sampled_from(PROJECTS), amount=amounts)
    def revoke(self, project: str, amount: int) -> None:
        free = available(self.state, project)
        result = self.do(Revoke(revoke_id=self.fresh("r"), project=project, amount_micros=amount))
        assert result.ok == (0 < amount <= free)
        if result.ok:
            self.granted[project] -= amount

    @rule(project=st.sampled_from(PROJECTS), monthly=amounts)
    def put_budget(self, project: str, monthly: int) -> None:
        name = f"budget-{project}"
        self.generations[name] += 1
        op = PutBudget(name=name, project=project, monthly_micros=monthly, generation=self.generations[name])
        assert self.do(op).ok
        assert self.state.budgets[name].monthly_micros == min(monthly, BOOK_MAX_MICROS)

    @rule(project=st.sampled_from(PROJECTS), cap=st.none() | amounts)
    def put_sweep(self, project: str, cap: int | None) -> None:
        name = self.fresh("s")
        assert self.do(PutSweep(name=name, project=project, generation=1, max_cost_micros=cap)).ok
        kept = self.state.sweeps[name].max_cost_micros
        assert kept == (cap if cap is not None and cap <= BOOK_MAX_MICROS else None)

    @rule(data=st.data(), cap=st.none() | amounts)
    def put_job(self, data: st.DataObject, cap: int | None) -> None:
        sweep = data.draw(st.sampled_from([None, *sorted(self.state.sweeps)]))
        project = self.state.sweeps[sweep].project if sweep else data.draw(st.sampled_from(PROJECTS))
        name = self.fresh("j")
        op = PutJob(name=name, project=project, generation=1, sweep=sweep, max_cost_micros=cap)
        assert self.do(op).ok
        kept = self.state.jobs[name].max_cost_micros
        assert kept == (cap if cap is not None and cap <= BOOK_MAX_MICROS else None)

    @precondition(lambda self: self.state.jobs)
    @rule(data=st.data(), rate=rates, window_ms=durations_ms, sized=st.booleans())
    def place(self, data: st.DataObject, rate: int, window_ms: int, sized: bool) -> None:
        """A hold for one window at the rate: as asked (any size), or sized to the room as serving does."""
        job = data.draw(st.sampled_from(sorted(self.state.jobs)))
        amount = charge_micros(rate, window_ms)
        if sized:
            room, _ = room_for(self.state, job, "2026-01")
            amount = max(min(amount, room), 1)
        hold_id = self.fresh("h")
        op = PlaceHold(
            hold_id=hold_id,
            job=job,
            amount_micros=amount,
            funded_until_ms=self.now + window_ms,
            at_ms=self.now,
            rate_micros_per_hour=rate,
        )
        result = self.do(op)
        if amount <= 0 or amount > BOOK_MAX_MICROS or rate > BOOK_MAX_MICROS:
            assert result.code == "Invalid" and result.message and result.fix, result
        else:
            assert result.ok or result.code in {"InsufficientCredits", "BudgetExceeded", "MaxCostReached"}
        if result.ok:
            self.rates[hold_id] = rate

    @precondition(lambda self: self.open_holds())
    @rule(data=st.data(), more=amounts)
    def extend(self, data: st.DataObject, more: int) -> None:
        hold_id = data.draw(st.sampled_from(self.open_holds()))
        until = self.state.holds[hold_id].funded_until_ms + 1000
        self.do(ExtendHold(hold_id=hold_id, more_micros=more, funded_until_ms=until))

    @precondition(lambda self: self.open_holds())
    @rule(data=st.data(), used_ms=durations_ms, raw=st.none() | amounts)
    def tick(self, data: st.DataObject, used_ms: int, raw: int | None) -> None:
        """A meter tick: the rate × the time used so far (up to MAX_DURATION), or any amount at all."""
        hold_id = data.draw(st.sampled_from(self.open_holds()))
        hold = self.state.holds[hold_id]
        amount = raw if raw is not None else max(0, charge_micros(self.rates[hold_id], used_ms))
        before, unbilled = held(self.state, hold_id), self.state.jobs[hold.job].unbilled_micros
        recorded = hold.overrun_micros
        result = self.do(Charge(hold_id=hold_id, tick=str(hold.last_tick + 1), amount_micros=amount))
        assert result.ok
        assert result.charged_micros == min(amount, before)
        # The tick's overrun replaces what the hold recorded before (each tick asks for all of it again).
        overrun = min(amount, BOOK_MAX_MICROS) - result.charged_micros
        assert self.state.holds[hold_id].overrun_micros == overrun
        assert self.state.jobs[hold.job].unbilled_micros == min(
            max(0, unbilled + overrun - recorded), BOOK_MAX_MICROS
        )

    @precondition(lambda self: self.open_holds())
    @rule(data=st.data(), total=amounts, boot=amounts)
    def capture(self, data: st.DataObject, total: int, boot: int) -> None:
        hold_id = data.draw(st.sampled_from(self.open_holds()))
        usage = Usage(
            attempt=hold_id,
            rate_micros_per_hour=self.rates[hold_id],
            billed_millis=total,
            segments={"Boot": boot, "Running": total},
            covered={"Boot": total},
        )
        before = held(self.state, hold_id)
        result = self.do(Capture(hold_id=hold_id, amount_micros=0, usage=usage, total_micros=total))
        assert result.ok and self.state.holds[hold_id].status == "Captured"
        assert result.charged_micros <= before

    @precondition(lambda self: self.open_holds())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        assert self.do(Release(hold_id=data.draw(st.sampled_from(self.open_holds())))).ok

    @rule(advance_ms=st.integers(min_value=0, max_value=MAX_DURATION_MS))
    def expire(self, advance_ms: int) -> None:
        self.now = min(self.now + advance_ms, START + MAX_DURATION_MS)
        self.do(Expire(now_ms=self.now))

    @rule()
    def restart_billing(self) -> None:
        self.state = decode(encode(self.state))

    # --- invariants ---

    @invariant()
    def the_book_encodes_and_decodes_to_the_same_value(self) -> None:
        assert_encodes(self.state)

    @invariant()
    def the_ledger_folds_to_the_balances_and_nothing_goes_below_zero(self) -> None:
        assert self.state.balances == fold(self.state.ledger.values())
        assert sum(self.state.balances.values()) == 0
        for account, amount in self.state.balances.items():
            assert amount >= 0 or account == "credits:issued", (account, amount)
        assert granted_total(self.state) <= BOOK_MAX_MICROS

    @invariant()
    def caps_hold_and_totals_are_exact(self) -> None:
        for name, job in self.state.jobs.items():
            if job.max_cost_micros is not None:
                assert job_spent(self.state, name) + job_held(self.state, name) <= job.max_cost_micros
        for name, sweep in self.state.sweeps.items():
            if sweep.max_cost_micros is not None:
                assert sweep_spent(self.state, name) + sweep_held(self.state, name) <= sweep.max_cost_micros
        for project in PROJECTS:
            jobs = [n for n, j in self.state.jobs.items() if j.project == project]
            spent = sum(job_spent(self.state, n) for n in jobs)
            holding = sum(job_held(self.state, n) for n in jobs)
            assert available(self.state, project) + holding + spent == self.granted[project]


Bounds.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestBounds = Bounds.TestCase


# --- the cases one at a time (each failed before the bounds) ------------------------------------------


def run(state: State, *ops: Op) -> tuple[State, Result]:
    result = Result(op_id="")
    for op in ops:
        state, result, _ = apply(state, op)
    return state, result


def test_the_job_of_the_bug_report_leaves_a_book_every_later_operation_can_use() -> None:
    cap = usd_to_micros("99999999999999")  # 10^20 µ$: beyond 64 bits
    state, result = run(State(), PutJob(name="big@u", project="p", generation=1, max_cost_micros=cap))
    assert result.ok and state.jobs["big@u"].max_cost_micros is None, "a cap no book can reach is no cap"
    assert_encodes(state)
    state, result = run(state, Grant(grant_id="later", project="p", amount_micros=1_000_000))
    assert result.ok and available(state, "p") == 1_000_000


def test_a_sweep_cap_and_a_budget_beyond_the_book_are_clamped_and_never_bind_first() -> None:
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=10),
        PutSweep(name="s", project="p", generation=1, max_cost_micros=10**22),
        PutBudget(name="b", project="p", monthly_micros=10**22, generation=1),
        PutJob(name="j", project="p", generation=1, sweep="s"),
    )
    assert state.sweeps["s"].max_cost_micros is None
    assert state.budgets["b"].monthly_micros == BOOK_MAX_MICROS
    assert_encodes(state)
    # More than the credits: the credits are the limit that binds, not the clamped Sweep cap or Budget.
    _, refused = run(
        state, PlaceHold(hold_id="h", job="j", amount_micros=11, funded_until_ms=START, at_ms=START)
    )
    assert refused.code == "InsufficientCredits"
    assert room_for(state, "j", "2026-01") == (10, "InsufficientCredits")


def test_a_grant_above_max_usd_or_past_the_books_total_is_refused_with_a_fix() -> None:
    _, too_big = run(State(), Grant(grant_id="g", project="p", amount_micros=MAX_USD_MICROS + 1))
    assert too_big.code == "Invalid" and too_big.fix and "at most" in too_big.fix
    state = State()
    for i in range(BOOK_MAX_MICROS // MAX_USD_MICROS):
        state, result = run(state, Grant(grant_id=f"g{i}", project="p", amount_micros=MAX_USD_MICROS))
        assert result.ok
    state, past = run(state, Grant(grant_id="one-more", project="p", amount_micros=1))
    assert past.code == "Invalid" and past.message and "the most a billing book holds" in past.message
    assert granted_total(state) == BOOK_MAX_MICROS
    assert_encodes(state)


def test_usage_beyond_the_book_is_clamped_and_what_nodus_absorbs_saturates() -> None:
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=1_000),
        PutJob(name="j", project="p", generation=1),
        PlaceHold(hold_id="h", job="j", amount_micros=100, funded_until_ms=START, at_ms=START),
    )
    state, tick = run(state, Charge(hold_id="h", tick="1", amount_micros=10**25))
    assert (tick.charged_micros, tick.overrun_micros) == (100, BOOK_MAX_MICROS - 100)
    state, _ = run(state, Charge(hold_id="h", tick="2", amount_micros=10**25))
    assert state.jobs["j"].unbilled_micros == BOOK_MAX_MICROS, "saturates at the bound"
    usage = Usage(attempt="h", billed_millis=2**70, segments={"Running": 2**70}, covered={"Boot": 2**70})
    state, captured = run(state, Capture(hold_id="h", amount_micros=0, usage=usage, total_micros=2**70))
    assert captured.ok
    kept = state.holds["h"].usage
    assert kept is not None and kept.segments == {"Running": BOOK_MAX_MICROS}
    assert kept.billed_millis == BOOK_MAX_MICROS
    assert_encodes(state)


@pytest.mark.parametrize(
    "op",
    [
        PlaceHold(
            hold_id="h", job="j", amount_micros=BOOK_MAX_MICROS + 1, funded_until_ms=START, at_ms=START
        ),
        PlaceHold(hold_id="h", job="j", amount_micros=1, funded_until_ms=10**19, at_ms=START),
        PlaceHold(
            hold_id="h",
            job="j",
            amount_micros=1,
            funded_until_ms=START,
            at_ms=START,
            rate_micros_per_hour=2**64,
        ),
        PutJob(name="j", project="p", generation=2**64),
    ],
    ids=["hold-beyond-the-book", "time-past-9999", "rate-beyond-the-book", "generation-beyond-64-bits"],
)
def test_an_operation_the_book_cannot_hold_is_refused_alone(op: Op) -> None:
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=10),
        PutJob(name="j", project="p", generation=1),
    )
    after, result = run(state, op)
    assert result.code == "Invalid" and result.message and result.fix, result
    assert after == state, "nothing changed"
    _, later = run(after, Grant(grant_id="later", project="p", amount_micros=1))
    assert later.ok, "the book still takes every other operation"


def test_a_tick_number_beyond_the_book_is_refused() -> None:
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=10),
        PutJob(name="j", project="p", generation=1),
        PlaceHold(hold_id="h", job="j", amount_micros=5, funded_until_ms=START, at_ms=START),
    )
    after, result = run(state, Charge(hold_id="h", tick="9" * 30, amount_micros=1))
    assert result.code == "Invalid" and after == state
    assert_encodes(after)


@settings(max_examples=200, deadline=None)
@given(rate=rates, window_ms=durations_ms, credits=st.integers(min_value=1, max_value=MAX_USD_MICROS))
def test_a_hold_sized_as_serving_sizes_it_fits_any_rate_and_window(
    rate: int, window_ms: int, credits: int
) -> None:
    """serving.Holds: min(rate × window, room), at least two stop margins; with any rate and window up to
    MAX_DURATION the hold is placed or refused with a funding reason, and the book encodes."""
    state, _ = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=credits),
        PutJob(name="j", project="p", generation=1),
    )
    room, _ = room_for(state, "j", "2026-01")
    want, least = charge_micros(rate, window_ms), charge_micros(rate, 120_000)
    amount = max(min(want, room), least)
    until = START + amount * 3_600_000 // rate
    state, result = run(
        state,
        PlaceHold(
            hold_id="h",
            job="j",
            amount_micros=amount,
            funded_until_ms=until,
            at_ms=START,
            rate_micros_per_hour=rate,
        ),
    )
    assert result.ok or result.code in {"InsufficientCredits", "Invalid"}, result
    assert_encodes(state)
    assert max(ints_of(state)) <= INT64
