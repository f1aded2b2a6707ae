"""The cluster and the billing service as the money simulator plays them (issue #18; ``simulating``).

:class:`World` keeps the Jobs, Sweeps and runs the books are about and decides every operation as the
service does: the binder's hold sized as ``serving.Holds.hold`` sizes it (``room_for``, ``hold_micros``),
the Attempt written as the scheduler writes it (``reporting.apply``, ``ruling.as_lost``), and the meter's
ticks, extensions, captures, orphan releases and funding blocks as ``Metering`` makes them (its ``_settle``,
``_tick``, ``_extend``, ``_capture``, ``_block_of`` and ``_next``, on the real ``usage_ms``, ``usage_of``,
``funded_until`` and ``stop_margin_ms``). The subclass applies and checks each operation (``_apply``).

Jobs may be stages of a Pipeline (issue #22): a Job stage names it (``SimJob.pipeline``), a cell counts
against its Sweep's. A Job blocked or unblocked requeues the Jobs its Sweep's or Pipeline's cap binds with
it (``standing.siblings``, as the meter does).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

import msgspec

from nodus_billing.filing import fileable
from nodus_billing.holding import (
    Capture,
    Charge,
    Expire,
    ExtendHold,
    File,
    Forget,
    Op,
    PlaceHold,
    PutJob,
    Release,
)
from nodus_billing.invariants import Broken, check_capture
from nodus_billing.metering import MIN_RECHECK_MS, STAMP_MS, Terms, funded_until
from nodus_billing.segmenting import NODUS_FAULTS, billed_millis_of, charged, usage_ms, usage_of
from nodus_billing.standing import Hold, Result, State, binding_cap, held, month_of, room_for, siblings
from nodus_billing.standing import Job as BookJob
from nodus_schema.attempts import Attempt, AttemptSpec, AttemptStatus
from nodus_schema.holds import hold_micros, minimum_hold_micros, resume_micros, stop_margin_ms
from nodus_schema.ledger import MICROS_PER_HOUR_MS, charge_micros
from nodus_schema.meta import ObjectMeta, format_time

HEARTBEAT_GRACE_MS: Final = 15_000
"""A node lost is seen this long after its last heartbeat at most."""
ORPHANS: Final = 0.03
"""The share of holds whose Attempt is never created (the scheduler died in between)."""


@dataclass
class Run:
    """One Attempt and its hold (named after it). ``created_ms`` None: the Attempt was never created."""

    hold_id: str
    job: str
    slot: int
    rate: int
    created_ms: int | None
    replacement: bool = False
    node_times: bool = True
    """Its agent reports the node's times (billingStartMs, programStartMs, billingStopMs); an older one
    does not, and the run is billed from the Attempt's creation to its finish, in whole seconds."""
    node_start_ms: int = 0
    started_ms: int | None = None
    finished_ms: int | None = None
    stop_ms: int | None = None
    """billingStopMs: the node's stop, or its last heartbeat for a run lost with its node."""
    phase: str = "Pending"
    reason: str | None = None
    by_agent: bool = True
    """The finish was reported by the agent (not a node loss the scheduler declared)."""
    stop_at_ms: int | None = None
    report_at_ms: int | None = None
    reported: bool = False
    """The meter sees the run finished (the Attempt's finish has reached it)."""


@dataclass
class SimJob:
    ref: str
    project: str
    sweep: str | None
    rate: int
    slots: int
    remaining: int
    """Runs still to succeed or fail; lost and stopped runs are run again."""
    cap: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    generation: int = 1
    pipeline: str | None = None
    """The Pipeline of a Job stage (a cell's is its Sweep's)."""
    running: dict[int, Run] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)
    blocked: tuple[str, int] | None = None
    """The funding block (reason, rate) the scheduler obeys: no new runs, running ones stopped."""
    next_look_ms: int | None = None
    forgotten: bool = False
    """Deleted, and its record forgotten by the book (nothing happens to it any more)."""

    @property
    def done(self) -> bool:
        return self.remaining <= 0 and not self.running


class World:
    """What the books are about, and the service's decisions on it; ``_apply`` is the subclass's."""

    def __init__(self, rng: random.Random, terms: Terms, now_ms: int, projects: tuple[str, ...]) -> None:
        self.rng, self.terms, self.now = rng, terms, now_ms
        self.books = {p: State() for p in projects}
        self.filed: dict[str, dict[str, Hold]] = {p: {} for p in projects}
        """Per project, the holds filed out of its book: the history bucket's records."""
        self.forgotten: dict[str, dict[str, BookJob]] = {p: {} for p in projects}
        """Per project, the records of the Jobs its book forgot, as they were then."""
        self.jobs: dict[str, SimJob] = {}
        self.runs: dict[str, Run] = {}
        self.requeued: dict[str, None] = {}
        self.counts: Counter[str] = Counter()
        self.fault: str | None = None
        self.serial = 0

    def _apply(self, project: str, op: Op, first: Result | None = None) -> Result:
        raise NotImplementedError

    def _fail(self, op: object, problem: str) -> None:
        raise NotImplementedError

    # -- the scheduler and the runs ---------------------------------------------------------------------

    def start(self) -> None:
        """The binder asks billing for a hold (sized as serving.Holds.hold does), then creates the Attempt."""
        ready = [
            j for j in self.jobs.values() if j.blocked is None and len(j.running) < min(j.slots, j.remaining)
        ]
        if not ready:
            return
        job = self.rng.choice(ready)
        # The hold endpoint puts a Job that never ran with its first hold.
        if job.ref not in self.books[job.project].jobs and not self.put(job).ok:
            return
        slot = min(s for s in range(job.slots) if s not in job.running)
        room, _ = room_for(self.books[job.project], job.ref, month_of(self.now))
        sized = hold_micros(job.rate, self.terms.window_ms, room)
        amount = sized or max(minimum_hold_micros(job.rate), 1)
        self.serial += 1
        hold_id = f"{job.ref.split('@')[0]}-{slot}-a{self.serial}"
        op = PlaceHold(
            hold_id=hold_id,
            job=job.ref,
            amount_micros=amount,
            funded_until_ms=self.now + amount * MICROS_PER_HOUR_MS // job.rate,
            at_ms=self.now,
            rate_micros_per_hour=job.rate,
        )
        orphan = self.rng.random() < ORPHANS
        run = Run(hold_id, job.ref, slot, job.rate, None if orphan else self.now, slot in job.lost)
        run.node_times = self.rng.random() < 0.8
        run.node_start_ms = self.now + self.rng.randrange(800)
        self.runs[hold_id] = run
        result = self._apply(job.project, op)
        if result.ok != bool(sized):
            self._fail(op, f"room_for left {room} µ$ (a hold of {sized} µ$), but apply said {result}")
        if not result.ok:
            del self.runs[hold_id]
            job.blocked = (result.code or "", job.rate)
            self.counts["blocks"] += 1
            self._count_pipeline_block(job, room, result.code)
            return
        if not orphan:
            job.running[slot] = run
        self.requeued[job.ref] = None

    def put(self, job: SimJob) -> Result:
        """PutJob at the Job's generation (putting.puts): by the hold endpoint before a Job's first hold,
        by the meter for a Job already in the book."""
        op = PutJob(
            name=job.ref,
            project=job.project,
            generation=job.generation,
            sweep=job.sweep,
            labels=dict(job.labels),
            max_cost_micros=job.cap,
            pipeline=job.pipeline,
        )
        result = self._apply(job.project, op)
        self.requeued[job.ref] = None
        return result

    def progress(self) -> None:
        """A run starts its program, finishes, fails to launch or is lost with its node."""
        live = [r for r in self.runs.values() if r.created_ms is not None and r.finished_ms is None]
        if not live:
            return
        run, r = self.rng.choice(live), self.rng.random()
        if self.now < run.node_start_ms:
            return  # its node has not begun it yet
        if run.started_ms is None:
            if r < 0.55:
                run.started_ms, run.phase = self.now, "Running"
            elif r < 0.65:
                self.finish(run, "Lost", "Lost")  # the agent could not launch it: Nodus's fault
            elif r < 0.75:
                self.finish(run, "Lost", "NodeLost", by_agent=False)
        elif r < 0.35:
            self.finish(run, *self.rng.choice((("Succeeded", "Completed"), ("Failed", "Error"))))
        elif r < 0.45:
            self.finish(run, "Lost", "NodeLost", by_agent=False)

    def finish(self, run: Run, phase: str, reason: str, by_agent: bool = True, at: int | None = None) -> None:
        run.finished_ms = self.now if at is None else at
        if by_agent:  # its agent stops it only once it began it
            run.finished_ms = max(run.finished_ms, run.node_start_ms)
        run.phase, run.reason, run.by_agent = phase, reason, by_agent
        if by_agent:
            run.stop_ms = run.finished_ms
        else:  # the last heartbeat, up to the grace before the loss was seen
            since = run.started_ms if run.started_ms is not None else run.node_start_ms
            run.stop_ms = max(since, run.finished_ms - self.rng.randrange(HEARTBEAT_GRACE_MS))
        late = self.rng.random() < 0.2  # the finish reaches the meter late (a failover): ticks run ahead
        run.report_at_ms = run.finished_ms + (self.rng.randrange(2 * self.terms.tick_ms) if late else 0)
        job = self.jobs[run.job]
        job.running.pop(run.slot, None)
        if phase in ("Succeeded", "Failed"):
            job.remaining -= 1
        if phase == "Lost":
            job.lost.add(run.slot)
        else:
            job.lost.discard(run.slot)

    def timers(self) -> None:
        """Stops that are over, and finishes that reach the meter."""
        for run in self.runs.values():
            if run.finished_ms is None and run.stop_at_ms is not None and run.stop_at_ms <= self.now:
                self.finish(run, "Stopped", "Stopped", at=run.stop_at_ms)
            if not run.reported and run.report_at_ms is not None and run.report_at_ms <= self.now:
                run.reported = True
                self.requeued[run.job] = None

    def attempt(self, run: Run) -> Attempt:
        """The Attempt as the scheduler writes it from the agent's reports (reporting.apply, as_lost)."""

        def stamp(ms: int | None) -> str | None:
            return None if ms is None else format_time(datetime.fromtimestamp(ms // 1000, UTC))

        status = AttemptStatus(phase=run.phase, reason=run.reason, start_time=stamp(run.started_ms))
        if run.node_times and run.started_ms is not None:
            status.billing_start_ms, status.program_start_ms = run.node_start_ms, run.started_ms
        if run.finished_ms is not None:
            status.finish_time = stamp(run.finished_ms)
            if run.by_agent:  # AttemptFinished: a run never started reads as started when it finished,
                # unless its node said it could not run it (reason Lost)
                if run.reason != "Lost":
                    status.start_time = status.start_time or status.finish_time
                if run.node_times:
                    status.billing_start_ms, status.billing_stop_ms = run.node_start_ms, run.stop_ms
            elif run.node_times:
                status.billing_stop_ms = run.stop_ms
        return Attempt(
            metadata=ObjectMeta(name=run.hold_id, creation_timestamp=stamp(run.created_ms)),
            spec=AttemptSpec(
                job=run.job,
                index=run.slot,
                attempt=1,
                node="node",
                offering="sim",
                region_class="sim",
                rate_micros_per_hour=run.rate,
                pricebook_version="sim",
            ),
            status=status,
        )

    # -- the meter ----------------------------------------------------------------------------------------

    def meter_due(self) -> None:
        for job in list(self.jobs.values()):
            due = job.next_look_ms is not None and job.next_look_ms <= self.now
            if (due or job.ref in self.requeued) and self.rng.random() < 0.97:  # the leader is late at times
                self.meter(job)
        self.requeued.clear()

    def meter(self, job: SimJob) -> None:
        """One reconcile of the Job, as Metering._settle, _fund and _next decide it."""
        if job.forgotten:
            return  # deleted: the meter finds nothing of it
        state = self.books[job.project]
        for hold_id, hold in sorted(state.holds.items()):
            if hold.job != job.ref or hold.status != "Open":
                continue
            run = self.runs.get(hold_id)
            if run is None or run.created_ms is None:
                if self.now - hold.placed_ms >= self.terms.orphan_ms:
                    self._apply(job.project, Release(hold_id=hold_id))
            elif run.reported:
                self._capture(job.project, run)
            else:
                if run.started_ms is not None:
                    self._tick(job.project, run)
                self._extend(job.project, run)
        self._fund(job)
        open_ = [h for h in self.books[job.project].holds.values() if h.job == job.ref and h.status == "Open"]
        if not open_:
            job.next_look_ms = None
            # A done Job's runs are filed out of the book and its record folded into the book's totals
            # (Metering._file, one commit: final or deleted alike), at this pass or a later one (a pass cut
            # short): decided by the clock, not the seed's stream, so every seed draws as before.
            if job.done and self.now % 3:
                self.file(job)
                self.forget(job)
            return
        margin = self.terms.margin_ms
        due = min(
            h.funded_until_ms - stop_margin_ms(h.reserved_micros, h.rate_micros_per_hour, margin)
            for h in open_
        )
        job.next_look_ms = self.now + max(MIN_RECHECK_MS, min(self.terms.tick_ms, due - self.now))

    def file(self, job: SimJob) -> None:
        """The history record written, then its holds filed out of the book (Metering._file)."""
        state = self.books[job.project]
        record = state.jobs.get(job.ref)
        holds = {h: hold for h, hold in state.holds.items() if record and fileable(hold, job.ref, record)}
        if holds:
            self.filed[job.project].update(holds)
            self._apply(job.project, File(job=job.ref, hold_ids=sorted(holds)))
            self.counts["jobs filed"] += 1

    def forget(self, job: SimJob) -> None:
        """The Job final (or deleted), its runs filed: the book forgets its record (Metering._file)."""
        state = self.books[job.project]
        record = state.jobs.get(job.ref)
        if record is None or any(h.job == job.ref for h in state.holds.values()):
            return  # a run placed under other labels stays in the book, and the Job with it
        self.forgotten[job.project][job.ref] = msgspec.convert(msgspec.to_builtins(record), type=BookJob)
        job.forgotten = True
        self._apply(job.project, Forget(job=job.ref))
        self.counts["jobs forgotten"] += 1

    def of_forgotten(self, project: str, op: Op) -> bool:
        """An operation on a forgotten Job (the meter never sends one: it sees the Job final or deleted, and
        the hold endpoint refuses an ended Job)."""
        forgotten = self.forgotten[project]
        match op:
            case PutJob() | PlaceHold() | File():
                return (op.name if isinstance(op, PutJob) else op.job) in forgotten
            case ExtendHold() | Charge() | Capture() | Release():
                run = self.runs.get(op.hold_id)
                return run is not None and run.job in forgotten
        return False

    def _tick(self, project: str, run: Run) -> None:
        hold = self.books[project].holds[run.hold_id]
        ticks = max(0, usage_ms(self.attempt(run), self.now) - STAMP_MS) // self.terms.tick_ms
        amount = charge_micros(run.rate, ticks * self.terms.tick_ms) - hold.charged_micros
        if ticks == 0 or amount <= 0:
            return
        result = self._apply(project, Charge(hold_id=run.hold_id, tick=str(ticks), amount_micros=amount))
        if self.fault == "double_charge" and result.ok:
            self._apply(project, Charge(hold_id=run.hold_id, tick=str(ticks + 1), amount_micros=amount))
        if result.overrun_micros:
            self.counts["ticks past funding"] += 1

    def _extend(self, project: str, run: Run) -> None:
        state = self.books[project]
        hold = state.holds[run.hold_id]
        window = self.terms.window_ms
        if hold.status != "Open" or hold.funded_until_ms - self.now > window // 2:
            return
        used = usage_ms(self.attempt(run), self.now)
        left = held(state, run.hold_id)
        needed = charge_micros(run.rate, used + window) - hold.charged_micros - left
        room, _ = room_for(state, hold.job, hold.month, hold.labels)
        more = min(max(needed, 0), room)
        if more <= 0:
            return
        until = funded_until(hold, left + more, self.now - used)
        op = ExtendHold(hold_id=run.hold_id, more_micros=more, funded_until_ms=until)
        result = self._apply(project, op)
        if result.ok and until <= hold.funded_until_ms:
            self.counts["extensions that reserved nothing"] += 1
        if not result.ok:  # sized by the room of the hold's month and labels, as apply judges it
            self._fail(
                op,
                f"room_for left {room} µ$ (hold month {hold.month}, labels {hold.labels}), but apply"
                f" said {result}",
            )

    def _capture(self, project: str, run: Run) -> None:
        hold = self.books[project].holds[run.hold_id]
        usage = usage_of(self.attempt(run), replacement=run.replacement, now_ms=self.now)
        total = charged(usage)
        if self.fault == "overcharge_capture":
            total += charge_micros(run.rate, STAMP_MS)
        op = Capture(
            hold_id=run.hold_id,
            amount_micros=max(0, total - hold.charged_micros),
            usage=usage,
            total_micros=total,
        )
        result = self._apply(project, op)
        if not result.ok:
            return
        cost, covered = self.cost(run)
        self.counts["runs covered whole" if covered else "runs captured"] += 1
        self.counts["captures refunding ticks"] += 1 if result.refunded_micros else 0
        try:
            check_capture(self.books[project], run.hold_id, cost, covered)
        except Broken as e:
            self._fail(op, str(e))

    def cost(self, run: Run) -> tuple[int, bool]:
        """What a finished run costs by its times (docs/billing.md, Segments), worked out here and not by
        segmenting, and whether Nodus covers all of it (its program never started, because of Nodus):
        for such a run, what it would have cost."""
        reported_start = run.node_times and (run.started_ms is not None or run.by_agent)
        start = run.node_start_ms if reported_start else _stamp(run.created_ms)
        stop = run.stop_ms if run.node_times and run.stop_ms is not None else _stamp(run.finished_ms)
        whole = charge_micros(run.rate, max(billed_millis_of(max(0, stop - start)), STAMP_MS))
        if run.started_ms is None:
            return whole, run.phase == "Lost" or run.reason in NODUS_FAULTS
        if run.phase == "Lost":  # charged from the launch to the last heartbeat; Boot, Teardown covered
            program = run.started_ms if run.node_times else _stamp(run.started_ms)
            launched = min(max(program, start), max(stop, start))
            running = max(0, stop - launched)
            return (charge_micros(run.rate, billed_millis_of(running)) if running else 0), False
        return whole, False

    def _fund(self, job: SimJob) -> None:
        """Metering._block_of: block a Job whose running holds are short and cannot be extended, unblock
        it once it could run a while again; the scheduler stops a blocked Job's runs."""
        if job.done or job.ref not in self.books[job.project].jobs:  # never held: nothing to block
            return
        state, margin = self.books[job.project], self.terms.margin_ms
        room, code = room_for(state, job.ref, month_of(self.now))
        live = [
            hold
            for h, hold in state.holds.items()
            if hold.job == job.ref and hold.status == "Open" and self._live(h)
        ]
        block: tuple[str, int] | None = None
        if live:
            short = [
                h.rate_micros_per_hour
                for h in live
                if h.funded_until_ms - self.now
                < stop_margin_ms(h.reserved_micros, h.rate_micros_per_hour, margin)
            ]
            block = (code, max(short)) if short else None
        elif job.blocked is not None and room < resume_micros(job.blocked[1], margin):
            block = (code, job.blocked[1])
        was, job.blocked = job.blocked, block
        if (was is None) == (block is None):
            return
        self.counts["blocks" if block else "unblocks"] += 1
        if block is not None:
            self._count_pipeline_block(job, room, code)
        for other in siblings(state, job.ref):  # under the same Sweep or Pipeline cap
            self.requeued[other] = None
        for run in job.running.values() if block else ():
            if run.stop_at_ms is None:  # a checkpoint and a teardown; a slow one runs past its funding
                slow = self.rng.random() < 0.2
                teardown = (
                    self.rng.randrange(margin, 3 * margin) if slow else self.rng.randrange(margin // 2 + 1)
                )
                run.stop_at_ms = self.now + teardown

    def _count_pipeline_block(self, job: SimJob, room: int, code: str | None) -> None:
        """Count a block that a Pipeline's cap binds (the workload must reach it)."""
        cap = binding_cap(self.books[job.project], job.ref, room) if code == "MaxCostReached" else None
        if cap is not None and cap.kind == "Pipeline":
            self.counts["blocks at a Pipeline's cap"] += 1

    def _live(self, hold_id: str) -> bool:
        """The meter sees the hold's Attempt, not finished."""
        run = self.runs.get(hold_id)
        return run is not None and run.created_ms is not None and not run.reported

    def expire(self, expiry_ms: int) -> None:
        """The safety net: holds nobody extended for the expiry grace past their funding."""
        cutoff = self.now - expiry_ms
        for project, state in self.books.items():
            if any(h.status == "Open" and h.funded_until_ms <= cutoff for h in state.holds.values()):
                self._apply(project, Expire(now_ms=cutoff // 1000 * 1000))

    def use_bounds(self, state: State) -> dict[str, int]:
        """Per open hold, the most its run can have cost by now (an orphan's: nothing)."""
        bounds: dict[str, int] = {}
        for hold_id, hold in state.holds.items():
            run = self.runs.get(hold_id)
            if hold.status == "Open" and run is not None:
                used = 0 if run.created_ms is None else max(0, self.now - _stamp(run.created_ms))
                bounds[hold_id] = charge_micros(run.rate, used) if used else 0
        return bounds


def _stamp(ms: int | None) -> int:
    """An instant as object times keep it (whole seconds)."""
    return (ms or 0) // 1000 * 1000
