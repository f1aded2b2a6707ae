"""A hypothesis state machine over billing's pure core: the invariants of issue #7 hold after every step,
with the three levels of caps (a Job's, its Sweep's, its Pipeline's: issue #22)."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
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
    PutPipeline,
    PutSweep,
    Release,
    Revoke,
    apply,
    decode,
    encode,
)
from nodus_billing.standing import (
    Result,
    State,
    available,
    held,
    job_held,
    job_spent,
    month_of,
    pipeline_held,
    pipeline_spent,
    refusal_for,
    room_for,
    sweep_held,
    sweep_spent,
)
from nodus_schema.ledger import charge_micros

PROJECTS = ("p", "q")
START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
RATE = 3_600_000  # µ$/h: one micro-dollar per millisecond keeps amounts small and readable
amounts = st.integers(min_value=0, max_value=400)


class Billing(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = State()
        self.history: list[tuple[Op, Result]] = []
        self.now = START
        self.generations: Counter[str] = Counter()
        self.granted: Counter[str] = Counter()  # net of revokes, per project
        self.charged: Counter[str] = Counter()  # per job, from the results alone
        self.resolutions: Counter[str] = Counter()
        self.committed: dict[str, int] = {}  # per Pipeline, spent + held after the last step
        self.serial = 0

    def do(self, op: Op) -> Result:
        self.state, result, _ = apply(self.state, op)
        self.history.append((op, result))
        return result

    def fresh(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def open_holds(self) -> list[str]:
        return sorted(h for h, hold in self.state.holds.items() if hold.status == "Open")

    # --- accounts, budgets, objects ---

    @rule(project=st.sampled_from(PROJECTS), amount=st.integers(min_value=1, max_value=2000))
    def grant(self, project: str, amount: int) -> None:
        if self.do(Grant(grant_id=self.fresh("g"), project=project, amount_micros=amount)).ok:
            self.granted[project] += amount

    @rule(project=st.sampled_from(PROJECTS), amount=st.integers(min_value=1, max_value=2000))
    def revoke(self, project: str, amount: int) -> None:
        free = available(self.state, project)
        result = self.do(Revoke(revoke_id=self.fresh("r"), project=project, amount_micros=amount))
        assert result.ok == (amount <= free)
        if result.ok:
            self.granted[project] -= amount

    @rule(
        project=st.sampled_from(PROJECTS),
        team=st.sampled_from(["", "a", "b"]),
        monthly=st.integers(min_value=0, max_value=3000),
    )
    def put_budget(self, project: str, team: str, monthly: int) -> None:
        name = f"budget-{project}-{team or 'all'}"
        self.generations[name] += 1
        selector = {"team": team} if team else {}
        op = PutBudget(
            name=name,
            project=project,
            monthly_micros=monthly,
            generation=self.generations[name],
            selector=selector,
        )
        assert self.do(op).ok

    def pipelines_of(self, project: str) -> list[str]:
        return sorted(n for n, p in self.state.pipelines.items() if p.project == project)

    @rule(project=st.sampled_from(PROJECTS), cap=st.none() | st.integers(min_value=0, max_value=200))
    def put_pipeline(self, project: str, cap: int | None) -> None:
        name = self.fresh("pl")
        self.generations[name] = 1
        assert self.do(PutPipeline(name=name, project=project, generation=1, max_cost_micros=cap)).ok

    @rule(
        data=st.data(),
        project=st.sampled_from(PROJECTS),
        cap=st.none() | st.integers(min_value=0, max_value=150),
    )
    def put_sweep(self, data: st.DataObject, project: str, cap: int | None) -> None:
        # A Sweep stage of a Pipeline, or a Sweep of its own.
        pipeline = data.draw(st.sampled_from([None, *self.pipelines_of(project)]))
        name = self.fresh("s")
        self.generations[name] = 1
        op = PutSweep(name=name, project=project, generation=1, max_cost_micros=cap, pipeline=pipeline)
        assert self.do(op).ok

    @rule(data=st.data(), cap=st.none() | amounts, team=st.sampled_from(["a", "b"]))
    def put_job(self, data: st.DataObject, cap: int | None, team: str) -> None:
        # Cells are drawn more often than lone Jobs: the shared Sweep cap is the subtle rule.
        sweep = data.draw(st.sampled_from([None, *sorted(self.state.sweeps), *sorted(self.state.sweeps)]))
        project = self.state.sweeps[sweep].project if sweep else data.draw(st.sampled_from(PROJECTS))
        # A lone Job may be a Job stage of a Pipeline; a cell is under its Sweep's Pipeline, if any.
        pipeline = None if sweep else data.draw(st.sampled_from([None, *self.pipelines_of(project)]))
        name = self.fresh("j")
        self.generations[name] = 1
        op = PutJob(
            name=name,
            project=project,
            generation=1,
            sweep=sweep,
            labels={"team": team},
            max_cost_micros=cap,
            pipeline=pipeline,
        )
        assert self.do(op).ok

    @precondition(lambda self: self.state.jobs or self.state.sweeps or self.state.pipelines)
    @rule(data=st.data(), more=st.integers(min_value=1, max_value=300))
    def raise_cap(self, data: st.DataObject, more: int) -> None:
        names = sorted(self.state.jobs) + sorted(self.state.sweeps) + sorted(self.state.pipelines)
        name = data.draw(st.sampled_from(names))
        self.generations[name] += 1
        gen = self.generations[name]
        if name in self.state.jobs:
            job = self.state.jobs[name]
            cap = None if job.max_cost_micros is None else job.max_cost_micros + more
            op: Op = PutJob(
                name=name,
                project=job.project,
                generation=gen,
                sweep=job.sweep,
                labels=job.labels,
                max_cost_micros=cap,
                pipeline=job.pipeline,
            )
        elif name in self.state.sweeps:
            sweep = self.state.sweeps[name]
            cap = None if sweep.max_cost_micros is None else sweep.max_cost_micros + more
            op = PutSweep(
                name=name,
                project=sweep.project,
                generation=gen,
                max_cost_micros=cap,
                pipeline=sweep.pipeline,
            )
        else:
            pipeline = self.state.pipelines[name]
            cap = None if pipeline.max_cost_micros is None else pipeline.max_cost_micros + more
            op = PutPipeline(name=name, project=pipeline.project, generation=gen, max_cost_micros=cap)
        assert self.do(op).ok

    @precondition(lambda self: self.state.pipelines)
    @rule(data=st.data())
    def lower_a_pipeline_cap(self, data: st.DataObject) -> None:
        """A Pipeline's cap lowered, below what its stages spent and hold at times: accepted (it only
        forbids growth), and nothing more is held under it until it is raised again."""
        name = data.draw(st.sampled_from(sorted(self.state.pipelines)))
        pipeline = self.state.pipelines[name]
        cap = data.draw(st.integers(min_value=0, max_value=pipeline.max_cost_micros or 200))
        self.generations[name] += 1
        op = PutPipeline(
            name=name, project=pipeline.project, generation=self.generations[name], max_cost_micros=cap
        )
        assert self.do(op).ok

    @precondition(lambda self: self.state.jobs)
    @rule(data=st.data())
    def hold_what_room_for_leaves(self, data: st.DataObject) -> None:
        """``room_for`` is exact over the three levels, Budgets and credits: a hold of what it leaves fits,
        one micro-dollar more is refused with the limit it names."""
        job = data.draw(st.sampled_from(sorted(self.state.jobs)))
        room, code = room_for(self.state, job, month_of(self.now))
        more = PlaceHold(
            hold_id=self.fresh("h"),
            job=job,
            amount_micros=room + 1,
            funded_until_ms=self.now + 1,
            at_ms=self.now,
        )
        _, refused, posted = apply(self.state, more)  # judged, not kept
        assert (refused.ok, refused.code, posted) == (False, code, []), (room, code, refused)
        if room > 0:
            op = PlaceHold(
                hold_id=self.fresh("h"),
                job=job,
                amount_micros=room,
                funded_until_ms=self.now + 1,
                at_ms=self.now,
            )
            assert self.do(op).ok

    # --- holds: cell start, extend, meter tick, capture (cell stop), cancel, expire ---

    @precondition(lambda self: self.state.jobs)
    @rule(data=st.data(), window_ms=st.integers(min_value=1, max_value=300))
    def start_cell(self, data: st.DataObject, window_ms: int) -> None:
        job = data.draw(st.sampled_from(sorted(self.state.jobs)))
        amount = charge_micros(RATE, window_ms)
        op = PlaceHold(
            hold_id=self.fresh("h"),
            job=job,
            amount_micros=amount,
            funded_until_ms=self.now + window_ms,
            at_ms=self.now,
        )
        result = self.do(op)
        assert result.ok or result.code in {"InsufficientCredits", "BudgetExceeded", "MaxCostReached"}
        assert result.ok or (result.message and result.fix)

    @precondition(lambda self: self.open_holds())
    @rule(data=st.data(), window_ms=st.integers(min_value=0, max_value=200))
    def extend(self, data: st.DataObject, window_ms: int) -> None:
        hold_id = data.draw(st.sampled_from(self.open_holds()))
        hold = self.state.holds[hold_id]
        until = hold.funded_until_ms + window_ms
        more = charge_micros(RATE, window_ms)
        room, _ = room_for(self.state, hold.job, hold.month, hold.labels)
        code = refusal_for(self.state, hold.job, more, hold.month, hold.labels)
        result = self.do(ExtendHold(hold_id=hold_id, more_micros=more, funded_until_ms=until))
        # An extension is judged as room_for sizes it, against every level of caps, Budgets and credits;
        # refused, it names the first rule (in apply's order) its amount breaks, which past room + 1 need
        # not be the one with the least room.
        if window_ms:
            assert result.ok == (more <= room), (more, room, result)
            assert result.ok or result.code == code

    @precondition(lambda self: self.open_holds())
    @rule(data=st.data(), amount=amounts)
    def meter_tick(self, data: st.DataObject, amount: int) -> None:
        hold_id = data.draw(st.sampled_from(self.open_holds()))
        before = held(self.state, hold_id)
        tick = str(self.state.holds[hold_id].last_tick + 1)  # the meter numbers its ticks per hold
        result = self.do(Charge(hold_id=hold_id, tick=tick, amount_micros=amount))
        assert (result.charged_micros, result.overrun_micros) == (
            min(amount, before),
            max(0, amount - before),
        )
        self.charged[self.state.holds[hold_id].job] += result.charged_micros

    @precondition(lambda self: self.open_holds())
    @rule(data=st.data(), amount=amounts)
    def stop_cell(self, data: st.DataObject, amount: int) -> None:
        hold_id = data.draw(st.sampled_from(self.open_holds()))
        before = held(self.state, hold_id)
        result = self.do(Capture(hold_id=hold_id, amount_micros=amount))
        assert result.charged_micros + result.released_micros == before
        assert result.charged_micros + result.overrun_micros == amount
        self.charged[self.state.holds[hold_id].job] += result.charged_micros
        self.resolutions[hold_id] += 1

    @precondition(lambda self: self.open_holds())
    @rule(data=st.data(), total=amounts)
    def finish_cell(self, data: st.DataObject, total: int) -> None:
        """The meter's capture with the run's whole charge: ticks that ran ahead are given back."""
        hold_id = data.draw(st.sampled_from(self.open_holds()))
        hold = self.state.holds[hold_id]
        before, ticked = held(self.state, hold_id), hold.charged_micros
        result = self.do(Capture(hold_id=hold_id, amount_micros=0, total_micros=total))
        if total < ticked:
            assert (result.refunded_micros, result.charged_micros) == (ticked - total, 0)
            assert result.released_micros == before + ticked - total
        else:
            assert result.refunded_micros == 0
            assert result.charged_micros + result.overrun_micros == total - ticked
            assert result.charged_micros + result.released_micros == before
        self.charged[hold.job] += result.charged_micros - result.refunded_micros
        self.resolutions[hold_id] += 1

    @precondition(lambda self: self.open_holds())
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        hold_id = data.draw(st.sampled_from(self.open_holds()))
        assert self.do(Release(hold_id=hold_id)).ok
        self.resolutions[hold_id] += 1

    @rule(advance_ms=st.integers(min_value=0, max_value=300))
    def expire(self, advance_ms: int) -> None:
        self.now += advance_ms
        fresh = f"expire:{self.now}" not in self.state.results
        result = self.do(Expire(now_ms=self.now))
        # The same instant twice is a redelivery: its first result comes back, nothing resolves again.
        for hold_id in result.expired if fresh else []:
            self.resolutions[hold_id] += 1

    @precondition(lambda self: self.state.holds)
    @rule(data=st.data())
    def act_on_a_resolved_hold(self, data: st.DataObject) -> None:
        hold_id = data.draw(st.sampled_from(sorted(self.state.holds)))
        if self.state.holds[hold_id].status != "Open":
            result = self.do(Release(hold_id=hold_id))
            assert result.code == "Conflict" or result == self.state.results[result.op_id]

    # --- crashes and redelivery ---

    @rule()
    def restart_billing(self) -> None:
        self.state = decode(encode(self.state))

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        op, first = data.draw(st.sampled_from(self.history))
        before = encode(self.state)
        if not first.ok:
            # A refusal moved nothing and is not remembered (ADR-0024): replayed, it is judged again as a
            # new request. The invariants still hold after it, whatever it decides now.
            self.state, again, posted = apply(self.state, op)
            if not posted:
                return  # refused again, or accepted by an earlier replay and now answered from memory
            if again.ok and isinstance(op, Grant | Revoke):
                self.granted[op.project] += op.amount_micros if isinstance(op, Grant) else -op.amount_micros
            if again.ok and isinstance(op, Capture | Release):
                self.resolutions[op.hold_id] += 1
            if again.ok and isinstance(op, Charge | Capture):
                self.charged[self.state.holds[op.hold_id].job] += again.charged_micros
            return
        self.state, again, posted = apply(self.state, op)
        assert posted == [] and encode(self.state) == before, "a replay changes nothing"
        # Remembered operations answer as the first time. A guarded one (a put, a tick, an extension)
        # answers that it did nothing new; any operation on a hold that has resolved is a Conflict.
        assert again == first or again.code == "Conflict" or (again.ok and again.charged_micros == 0), again

    # --- invariants ---

    @invariant()
    def ledger_folds_to_every_balance(self) -> None:
        assert self.state.balances == fold(self.state.ledger.values())
        assert sum(self.state.balances.values()) == 0

    @invariant()
    def nothing_goes_below_zero(self) -> None:
        for account, amount in self.state.balances.items():
            assert amount >= 0 or account == "credits:issued", (account, amount)

    @invariant()
    def spend_and_holds_stay_under_every_cap(self) -> None:
        for name, job in self.state.jobs.items():
            if job.max_cost_micros is not None:
                assert job_spent(self.state, name) + job_held(self.state, name) <= job.max_cost_micros
        for name, sweep in self.state.sweeps.items():
            if sweep.max_cost_micros is not None:
                assert sweep_spent(self.state, name) + sweep_held(self.state, name) <= sweep.max_cost_micros
        for name, pipeline in self.state.pipelines.items():
            # Everything under a Pipeline, its Sweep stages' cells included, stays under its one cap; a cap
            # lowered below what was committed is accepted, and then nothing under it grows.
            committed = pipeline_spent(self.state, name) + pipeline_held(self.state, name)
            if pipeline.max_cost_micros is not None:
                ceiling = max(pipeline.max_cost_micros, self.committed.get(name, 0))
                assert committed <= ceiling, (name, committed, pipeline.max_cost_micros)
            self.committed[name] = committed

    @invariant()
    def no_hold_resolves_twice(self) -> None:
        assert all(count == 1 for count in self.resolutions.values())
        for hold_id, hold in self.state.holds.items():
            assert (hold.status != "Open") == (self.resolutions[hold_id] == 1)
            assert hold.status == "Open" or held(self.state, hold_id) == 0

    @invariant()
    def totals_are_exact(self) -> None:
        for name in self.state.jobs:
            assert job_spent(self.state, name) == self.charged[name]
        for project in PROJECTS:
            jobs = [n for n, j in self.state.jobs.items() if j.project == project]
            spent = sum(job_spent(self.state, n) for n in jobs)
            holding = sum(job_held(self.state, n) for n in jobs)
            assert available(self.state, project) + holding + spent == self.granted[project]


Billing.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestBilling = Billing.TestCase
