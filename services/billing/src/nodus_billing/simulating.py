"""The money simulator (issue #18), in the spirit of TigerBeetle's VOPR: seeded random workloads over
billing's real core, with every invariant checked after every operation.

``simulate(seed, steps)`` draws everything from ``random.Random(seed)``: grants and revokes; Jobs alone
and Sweep cells under a shared cap; Pipelines (issue #22) whose one cap is shared by their Job stages and
their Sweep stages' cells, raised, lowered and removed; Budgets with and without selectors; caps raised,
lowered (below what is spent and held too) and removed; runs that start, run, finish, fail to launch, are
lost with their node or are stopped by a funding block, with finishes that reach the meter late; billing
restarts (every book through JSON and back) with the last operations delivered again; redeliveries of
recent operations; retries of a hold request; the expiry safety net; and a clock that moves by the seed.
Every operation is applied with ``holding.apply`` to its project's book (one :class:`State` per project,
as the service keeps them), decided as the service decides it (``simulated.World``), and followed by every
check of ``invariants``. No I/O: the same seed is the same run, anywhere.

A broken invariant raises :class:`SimulationFailure` naming the seed, the step and the operation, with the
command that replays it: ``python -m nodus_billing.simulating --seed 1234 --steps 500``.

``pipelines=False`` (``--no-pipelines``) draws the workload as it was before Pipelines, seed for seed: the
seeds that showed the problems of #18 replay the very runs that showed them.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from nodus_billing.holding import (
    Capture,
    Charge,
    Expire,
    Grant,
    Op,
    PlaceHold,
    PutBudget,
    PutPipeline,
    PutSweep,
    Release,
    Revoke,
    apply,
    decode,
    encode,
    op_id,
)
from nodus_billing.invariants import Broken, Tally, check_book, check_expiry, check_replay
from nodus_billing.metering import Terms
from nodus_billing.simulated import Run, SimJob, World
from nodus_billing.standing import Result, State, available
from nodus_schema.ledger import charge_micros

START_MS: Final = 1_769_896_800_000
"""2026-01-31T22:00:00Z, plus up to three hours by the seed: many runs cross a month (Budgets are monthly)."""
PROJECTS: Final = ("p0", "p1")
RATES: Final = (3_600_000, 2_990_000, 1_000_000, 123_457, 3_600, 7)
"""µ$/h: 1 µ$ a millisecond, an H100, $1/h, an odd one for rounding, 1 µ$ a second, almost nothing."""
FAULTS: Final = ("double_charge", "overcharge_capture", "drop_entry")
"""Bugs the simulator can be told to inject, to show that it catches them (``simulate(fault=...)``)."""
EVENTS: Final = {
    "start": 25,
    "run": 25,
    "grant": 4,
    "revoke": 2,
    "budget": 3,
    "sweep": 3,
    "job": 5,
    "cap": 5,
    "pipeline": 3,
    "restart": 2,
    "redeliver": 6,
    "retry": 2,
    "idle": 10,
}
"""What happens between two looks of the meter, and how often (weights); ``pipeline`` only with
Pipelines."""
JOURNAL: Final = 64
"""Recent operations kept for redelivery and for replay after a restart."""
PURITY_CHECKS: Final = 0.02
"""The share of operations applied twice to the same book: apply() must leave it alone and agree."""


class SimulationFailure(AssertionError):
    """An invariant broke: the seed, the step, the operation, what broke, and the command that replays it."""

    def __init__(self, seed: int, steps: int, step: int, op: object, problem: str, replay: str) -> None:
        self.seed, self.step, self.op, self.problem, self.replay = seed, step, op, problem, replay
        super().__init__(
            f"money simulator: seed {seed}, step {step} of {steps}, op {op!r}: {problem}\nreplay: {replay}"
        )


@dataclass
class SimResult:
    seed: int
    steps: int
    """Operations applied to the books, every one checked."""
    events: int
    simulated_ms: int
    counts: dict[str, int]
    """What happened, by kind: operations by outcome, captures, covered runs, blocks, restarts."""
    ops: list[tuple[str, Op]] = field(default_factory=list)
    """Every operation applied, with its project (only with ``keep_ops``)."""
    books: dict[str, State] = field(default_factory=dict)
    """Every project's book at the end (only with ``keep_ops``)."""


def replay_command(seed: int, steps: int, fault: str | None = None, pipelines: bool = True) -> str:
    extra = (f" --fault {fault}" if fault else "") + ("" if pipelines else " --no-pipelines")
    return f"python -m nodus_billing.simulating --seed {seed} --steps {steps}{extra}"


def simulate(
    seed: int,
    steps: int,
    *,
    fault: str | None = None,
    keep_ops: bool = False,
    pipelines: bool = True,
) -> SimResult:
    """Run ``steps`` operations of the workload of ``seed``; raises :class:`SimulationFailure`.

    ``fault`` injects one of :data:`FAULTS`. Every invariant is strict: none is tolerated. ``pipelines``:
    False draws the workload without Pipelines, exactly as before they existed (the same seed, the same
    run)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"no fault {fault!r}: choose from {', '.join(FAULTS)}")
    return _Simulation(seed, steps, fault, keep_ops, pipelines).run()


class _Done(Exception):
    """The steps asked for are done."""


class _Simulation(World):
    def __init__(self, seed: int, steps: int, fault: str | None, keep_ops: bool, pipelines: bool) -> None:
        rng = random.Random(seed)
        window = rng.choice((600_000, 120_000, 30_000))
        terms = Terms(
            window_ms=window,
            tick_ms=rng.choice([t for t in (30_000, 10_000, 2_000) if t <= window // 3]),
            margin_ms=rng.choice((60_000, 20_000, 5_000)),
            orphan_ms=120_000,
        )
        super().__init__(rng, terms, START_MS + rng.randrange(3 * 3_600_000), PROJECTS)
        self.seed, self.steps, self.fault, self.keep_ops = seed, steps, fault, keep_ops
        self.expiry_ms = rng.choice((600_000, 3_600_000))
        self.started = self.now
        self.tallies = {p: Tally() for p in PROJECTS}
        self.sweeps: dict[str, tuple[str, int, int | None, int]] = {}  # project, generation, cap, rate
        self.under: dict[str, str] = {}  # a Sweep stage's Pipeline
        self.with_pipelines = pipelines
        self.pipelines: dict[str, tuple[str, int, int | None]] = {}  # project, generation, cap
        self.events = {k: w for k, w in EVENTS.items() if pipelines or k != "pipeline"}
        self.budgets: dict[tuple[str, str], tuple[str, int]] = {}  # (project, team) -> name, generation
        self.journal: deque[tuple[str, Op, Result]] = deque(maxlen=JOURNAL)
        self.ops: list[tuple[str, Op]] = []
        self.step = 0

    def run(self) -> SimResult:
        events = 0
        try:
            for project in PROJECTS:
                self._grant(project, self.rng.choice((600_000, 3_600_000, 20_000_000)))
            while events < 50 * self.steps + 100:
                events += 1
                self._advance()
                self.timers()
                self._event()
                self.meter_due()
                if self.rng.random() < 0.05:
                    self.expire(self.expiry_ms)
        except _Done:
            pass
        books = dict(self.books) if self.keep_ops else {}
        return SimResult(
            self.seed, self.step, events, self.now - self.started, dict(self.counts), self.ops, books
        )

    # -- applying and checking ---------------------------------------------------------------------------

    def _apply(self, project: str, op: Op, first: Result | None = None) -> Result:
        """Apply one operation to a project's book and check every invariant; ``first``: the result of
        the same operation applied before (this is a redelivery)."""
        if self.step >= self.steps:
            raise _Done
        self.step += 1
        state = self.books[project]
        fresh = op_id(op) not in state.results
        hold = state.holds.get(getattr(op, "hold_id", ""))
        charged_before = hold.charged_micros if hold is not None else 0
        try:
            before = encode(state) if first is not None or self.rng.random() < PURITY_CHECKS else None
            new, result, posted = apply(state, op)
            if before is not None:
                _pure(state, op, before, new, result)
            if self.fault == "drop_entry" and posted and any(e.amount_micros for e in new.ledger.values()):
                entry = next(e for e in reversed(new.ledger.values()) if e.amount_micros)
                del new.ledger[entry.id]  # a write that lost an entry
            self.books[project] = new
            self.journal.append((project, op, result))
            if self.keep_ops:
                self.ops.append((project, op))
            if first is not None and first.ok and before is not None:
                check_replay(before, encode(new), posted, first, result)
            self._tally(project, op, result, bool(posted), fresh, charged_before)
            months = {h.month for h in new.holds.values()} | set(new.filed)
            redefined = frozenset(f"budget:{op.name}:{m}" for m in months if isinstance(op, PutBudget))
            tally, bounds = self.tallies[project], self.use_bounds(new)
            check_book(
                new,
                project,
                tally,
                bounds,
                redefined=redefined,
                filed=self.filed[project],
                forgotten=self.forgotten[project],
            )
        except Broken as e:
            self._fail(op, str(e))
        self.counts[f"{type(op).__name__} {'ok' if result.ok else result.code}"] += 1
        return result

    def _fail(self, op: object, problem: str) -> None:
        replay = replay_command(self.seed, self.steps, self.fault, self.with_pipelines)
        raise SimulationFailure(self.seed, self.steps, self.step, op, problem, replay) from None

    def _tally(self, project: str, op: Op, result: Result, posted: bool, fresh: bool, before: int) -> None:
        """What the book must now say, from the result alone (``before``: what the hold had charged)."""
        tally = self.tallies[project]
        if not result.ok or not (fresh or posted):
            return
        match op:
            case Grant():
                tally.granted += op.amount_micros
            case Revoke():
                tally.granted -= op.amount_micros
            case PlaceHold() if op.hold_id not in self.runs:
                # A refused hold delivered again and funded now: nobody creates its Attempt.
                self.runs[op.hold_id] = Run(op.hold_id, op.job, -1, op.rate_micros_per_hour, None)
                self.counts["holds funded on redelivery"] += 1
                self.requeued[op.job] = None
            case Charge() if posted:
                tally.charged[op.hold_id] = before + result.charged_micros
                tally.reported[op.hold_id] = before + op.amount_micros
            case Capture():
                total = op.total_micros if op.total_micros is not None else before + op.amount_micros
                tally.charged[op.hold_id] = before + result.charged_micros - result.refunded_micros
                tally.reported[op.hold_id] = total
                tally.resolved[op.hold_id] += 1
            case Release():
                tally.resolved[op.hold_id] += 1
            case Expire():
                tally.resolved.update(result.expired)
                check_expiry(self.books[project], op.now_ms, result.expired)

    # -- time and the workload ---------------------------------------------------------------------------

    def _advance(self) -> None:
        rng, tick = self.rng, self.terms.tick_ms
        due = [j.next_look_ms for j in self.jobs.values() if j.next_look_ms is not None]
        r = rng.random()
        if r < 0.45:
            self.now += rng.randrange(2_000)
        elif r < 0.85 and due:
            self.now = max(self.now, min(due)) + rng.randrange(500)
        elif r < 0.99:
            self.now += rng.randrange(3 * tick)
        else:  # billing (or its meter) was away a while: nothing was charged, extended or stopped
            self.now += rng.randrange(self.terms.window_ms, 2 * 3_600_000)
            self.counts["outages"] += 1

    def _event(self) -> None:
        rng = self.rng
        match rng.choices(list(self.events), list(self.events.values()))[0]:
            case "start":
                self.start()
            case "run":
                self.progress()
            case "grant":
                self._grant(rng.choice(PROJECTS), rng.choice((-1, 1, 1_000, 60_000, 600_000, 3_600_000)))
            case "revoke":
                self._revoke()
            case "budget":
                self._budget()
            case "sweep":
                self._sweep()
            case "job":
                self._new_job()
            case "cap":
                self._cap()
            case "pipeline":
                self._pipeline()
            case "restart":
                self._restart()
            case "redeliver" if self.journal:
                self.counts["redeliveries"] += 1
                project, op, first = rng.choice(list(self.journal))
                if not self.of_forgotten(project, op):
                    self._apply(project, op, first)
            case "retry":
                self._retry()

    def _grant(self, project: str, amount: int) -> None:
        self.serial += 1
        self._apply(project, Grant(grant_id=f"g{self.serial}", project=project, amount_micros=amount))
        self._requeue(project)

    def _revoke(self) -> None:
        project = self.rng.choice(PROJECTS)
        free = available(self.books[project], project)
        amount = self.rng.choice((free // 2, free, free + 1, self.rng.randint(1, max(1, free))))
        self.serial += 1
        self._apply(project, Revoke(revoke_id=f"r{self.serial}", project=project, amount_micros=amount))

    def _budget(self) -> None:
        """A Budget (the project's, or its team a's) put, raised, lowered or deleted, as budgeting does."""
        rng = self.rng
        project, team = rng.choice(PROJECTS), rng.choice(("", "a"))
        known = self.budgets.pop((project, team), None)
        op: Op
        if known is not None and rng.random() < 0.25:
            name, gen = known
            op = PutBudget(name=name, project=project, monthly_micros=0, generation=gen, deleted=True)
        else:
            self.serial += 1
            name, gen = known or (f"b-{team or 'all'}@u{self.serial}", 0)
            self.budgets[(project, team)] = (name, gen + 1)
            monthly = _amount(rng, rng.choice(RATES))
            selector = {"team": team} if team else {}
            op = PutBudget(
                name=name, project=project, monthly_micros=monthly, generation=gen + 1, selector=selector
            )
        self._apply(project, op)
        self._requeue(project)

    def _sweep(self) -> None:
        rng = self.rng
        if len(self.sweeps) < 3 or rng.random() < 0.3:
            self.serial += 1
            name, project, gen, rate = (
                f"s{self.serial}@u{self.serial}",
                rng.choice(PROJECTS),
                1,
                rng.choice(RATES),
            )
        else:
            name = rng.choice(sorted(self.sweeps))
            project, gen, _, rate = self.sweeps[name]
            gen += 1
        cap = None if rng.random() < 0.25 else _amount(rng, rate)
        if gen == 1 and self.with_pipelines:  # a stage of a Pipeline of the project, at times
            pipeline = self._a_pipeline(project)
            if pipeline is not None:
                self.under[name] = pipeline
        self.sweeps[name] = (project, gen, cap, rate)
        op = PutSweep(
            name=name, project=project, generation=gen, max_cost_micros=cap, pipeline=self.under.get(name)
        )
        self._apply(project, op)
        for job in self.jobs.values():
            if job.sweep == name:
                self.requeued[job.ref] = None

    def _a_pipeline(self, project: str) -> str | None:
        """One of the project's Pipelines, or none (Pipelines only)."""
        mine = sorted(name for name, (p, _, _) in self.pipelines.items() if p == project)
        return self.rng.choice([None, *mine, *mine]) if mine else None

    def _pipeline(self) -> None:
        """A Pipeline put, or its cap raised, lowered (below what its stages spent and hold, at times) or
        removed; every Job under it is looked at (the meter's ``_stages_of``)."""
        rng = self.rng
        if len(self.pipelines) < 2 or rng.random() < 0.25:
            self.serial += 1
            name, project, gen, cap = f"p{self.serial}@u{self.serial}", rng.choice(PROJECTS), 1, None
        else:
            name = rng.choice(sorted(self.pipelines))
            project, gen, cap = self.pipelines[name]
            gen += 1
        r = rng.random()
        if r < 0.15:
            cap = None
        elif r < 0.45 and cap is not None:
            cap = rng.randint(0, cap)
        else:
            cap = (cap or 0) + _amount(rng, rng.choice(RATES))
        self.pipelines[name] = (project, gen, cap)
        self._apply(project, PutPipeline(name=name, project=project, generation=gen, max_cost_micros=cap))
        for job in self.jobs.values():
            if name in (job.pipeline, self.under.get(job.sweep or "")):
                self.requeued[job.ref] = None

    def _new_job(self) -> None:
        rng = self.rng
        if sum(1 for j in self.jobs.values() if not j.done) >= 8:
            return
        self.serial += 1
        sweep = rng.choice(sorted(self.sweeps)) if self.sweeps and rng.random() < 0.5 else None
        if sweep is not None:
            project, _, _, rate = self.sweeps[sweep]
            job = SimJob(f"c{self.serial}@u{self.serial}", project, sweep, rate, 1, rng.randint(1, 3))
        else:
            rate, project = rng.choice(RATES), rng.choice(PROJECTS)
            job = SimJob(
                f"j{self.serial}@u{self.serial}", project, None, rate, rng.randint(1, 2), rng.randint(1, 4)
            )
            if self.with_pipelines:  # a Job stage of a Pipeline of the project, at times
                job.pipeline = self._a_pipeline(project)
        job.cap = None if rng.random() < 0.35 else _amount(rng, rate)
        job.labels = {"team": rng.choice(("a", "b"))}
        self.jobs[job.ref] = job  # in the book from its first hold (Metering._booked)

    def _cap(self) -> None:
        """A Job's maxCostUSD raised, lowered (below what is spent and held, at times) or removed."""
        live = [j for j in self.jobs.values() if not j.done]
        if not live:
            return
        rng = self.rng
        job = rng.choice(live)
        r = rng.random()
        if r < 0.15:
            job.cap = None
        elif r < 0.45 and job.cap is not None:
            job.cap = rng.randint(0, job.cap)
        else:
            job.cap = (job.cap or 0) + _amount(rng, job.rate)
        if rng.random() < 0.2:
            job.labels = {"team": rng.choice(("a", "b"))}
        job.generation += 1
        if job.ref in self.books[job.project].jobs:  # else put with its first hold, at this generation
            self.put(job)

    def _restart(self) -> None:
        """Billing restarts: every book read back from its JSON; the last operations are delivered again."""
        self.counts["restarts"] += 1
        for project, state in self.books.items():
            back = decode(encode(state))
            if back != state:
                self._fail("restart", f"the book of {project} reads back different from what was written")
            self.books[project] = back
        for project, op, first in list(self.journal)[-self.rng.randint(1, 5) :]:
            if not self.of_forgotten(project, op):
                self._apply(project, op, first)

    def _retry(self) -> None:
        """The scheduler asks again for a hold it has (serving's retry): the same id, the first answer."""
        runs = [r for r in self.runs.values() if r.created_ms is not None and r.finished_ms is None]
        if not runs:
            return
        run = self.rng.choice(runs)
        project = self.jobs[run.job].project
        hold = self.books[project].holds[run.hold_id]
        if hold.status != "Open":
            return
        op = PlaceHold(
            hold_id=run.hold_id, job=run.job, amount_micros=hold.reserved_micros, funded_until_ms=0, at_ms=0
        )
        first = self.books[project].results.get(op_id(op))
        if first is None:
            self._fail(op, f"open hold {run.hold_id} forgot its place: asked again, it would be judged again")
        self.counts["hold retries"] += 1
        self._apply(project, op, first)

    def _requeue(self, project: str) -> None:
        for job in self.jobs.values():
            if job.project == project:
                self.requeued[job.ref] = None


def _pure(state: State, op: Op, before: bytes, new: State, result: Result) -> None:
    """apply() leaves its input alone and decides the same way twice."""
    if encode(state) != before:
        raise Broken("apply() changed the book it was given")
    again, result_again, _ = apply(state, op)
    if encode(again) != encode(new) or result_again != result:
        raise Broken("apply() decided differently on the same book")


def _amount(rng: random.Random, rate: int) -> int:
    """A cap or a Budget: from nothing, through a sliver of a second, to hours of the rate."""
    seconds = rng.choice((0, 0.5, 1, 2, 5, 12, 30, 120, 600, 1_800, 7_200))
    return charge_micros(rate, int(seconds * 1000 * rng.uniform(0.8, 1.25)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nodus_billing.simulating", description="The money simulator (issue #18)."
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed (the first, with --seeds)")
    parser.add_argument("--steps", type=int, default=500, help="operations per seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds, from --seed on")
    parser.add_argument("--fault", choices=FAULTS, help="inject a bug, to see it caught")
    parser.add_argument(
        "--no-pipelines", action="store_true", help="the workload without Pipelines, as before issue #22"
    )
    args = parser.parse_args(argv)
    counts: Counter[str] = Counter()
    steps = 0
    start = time.perf_counter()
    for seed in range(args.seed, args.seed + args.seeds):
        try:
            result = simulate(seed, args.steps, fault=args.fault, pipelines=not args.no_pipelines)
        except SimulationFailure as e:
            print(e, file=sys.stderr)
            return 1
        steps += result.steps
        counts.update(result.counts)
    seconds = time.perf_counter() - start
    for kind, n in sorted(counts.items()):
        print(f"{n:>9}  {kind}")
    print(f"{args.seeds} seed(s), {steps} steps in {seconds:.2f} s: {steps / seconds:,.0f} steps/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
