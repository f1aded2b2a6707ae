"""Metering: every Job's holds kept ahead of use, charged as it runs, captured when its runs finish;
its funding (blocked or not) and its ``status.cost`` written from the books (ADR-0024).

One level-triggered reconcile per Job, safe to kill at any line and to run any number of times:

1. the Job (and its Sweep, and the Pipeline it is a stage of: ``putting``) are put in the project's book:
   their caps, labels and generation; a Job that never ran is left out until the hold endpoint puts it
   with its first hold (``_booked``: the book does not grow with Jobs that never run);
2. for each open hold of the Job (a hold is named after its Attempt): a finished run is **captured** with
   its charge by segment (``segmenting``); a running one is **charged** up to the last whole meter tick and
   **extended** ahead of use by as much as the caps, Budgets and credits allow; a hold whose Attempt never
   appeared is released;
3. the Job is **blocked** when a running hold is about to run out and cannot be extended (or, for a Job
   waiting to start, when not even one stop margin fits): the scheduler then stops it with a checkpoint
   and holds it Suspended with MaxCostReached, InsufficientCredits or BudgetExceeded. It is unblocked once
   two stop margins fit again (a cap raised, credits granted), and the scheduler resumes it. A Job blocked
   or unblocked requeues the Jobs its Sweep's or Pipeline's cap binds with it (``standing.siblings``), and
   the block names the cap that binds: the Job's, its Sweep's or its Pipeline's;
4. ``status.cost`` is written when it changed (a display copy: the book is the truth).

The reconcile returns when to look again: the next meter tick while anything of the Job is held.

**What it reads** (issue #19): the Job, its Attempts (by the Job's index), its Sweep, its Pipeline and its
funding record from the leader's informers (:mod:`viewing`), never a list of the namespace; the project's
book as this replica last read or wrote it, unless the books' glance shows a newer one (``Books.read``;
the commit's compare-and-set checks it), and a look that would change nothing in it commits nothing.
What it writes it hands to its informer at once (write-through: ``status.cost`` from the Job ``mutate``
returned, the funding record from its create or update), so the next pass sees its own write before the
watch brings it. The hold endpoint reads the Job, its Sweep and its Pipeline from the store: it serves on
every replica, and a hold is sized on what is stored.

**Settled** (what the controller's resync skips, :meth:`Metering.settled`): a Job the meter has nothing to
do for until something it watches changes. Either

* *final*: it ended and its cost is final (:func:`settled`): billing writes ``final`` only once no hold of
  it is open, every Attempt of it has ended and the view shows every run its status counts
  (``costing.runs_shown``), and nothing but its deletion changes that; or
* *at rest* (a Suspended Job, a Job waiting for capacity; never an ended one): the last reconcile of this
  revision of the Job read the book and found no open hold of it, no Attempt of it running, no block, and
  its ``status.cost`` as the book says; and since then no Attempt of it runs (the Attempts' index), no book
  holds an open hold of it (the books' glance) and billing does not block it (the funding view). The Job's
  own status is not enough on its own: a ``status.cost`` with nothing held may predate a hold placed since,
  and one written before a crash may lag a capture; the reconcile's word on the book, kept per revision (and
  forgotten at each new term as leader), is. A blocked Job is never at rest: credits granted on another
  replica only reach it by the resync.

The reconcile of a settled Job returns at once (the echo of billing's own cost write, a report, a Sweep's
event): no book read. Nor does a deleted Job with nothing of it held or running read one.

A hold can never be left open unmetered by this: every hold opened in a book, by any replica's hold
endpoint, queues its Job at the meter once the books' glance holds it (``service._placed``), and a Job
with an open hold is not at rest, so the meter looks at it every tick until the hold is captured or
released; under that, the expiry loop queues the Job of every open hold whose funding has run out,
settled or not (``service._expire``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client as NATS

from nodus_billing.archiving import Archive
from nodus_billing.books import Books, Planner, Step
from nodus_billing.costing import cost_of, ending, runs_of, starting, warm_pending
from nodus_billing.forgetting import forgettable, named
from nodus_billing.holding import Capture, Charge, ExtendHold, File, Forget, Op, Release
from nodus_billing.putting import job_ref as job_ref  # re-exported: the book's names of Jobs
from nodus_billing.putting import pipeline_ref_of, puts, stored, viewed
from nodus_billing.putting import sweep_ref_of as sweep_ref_of
from nodus_billing.recovering import recovery_of
from nodus_billing.segmenting import charged, usage_ms, usage_of
from nodus_billing.settings import METER_TICK_MS, ORPHAN_HOLD_MS, BillingSettings
from nodus_billing.standing import (
    Hold,
    State,
    Usage,
    binding_cap,
    held,
    month_of,
    room_for,
    siblings,
)
from nodus_billing.viewing import Views
from nodus_billing.warming import (
    WARM_FROM,
    end_of_funding,
    horizon_ms,
    keeper_key,
    warm_open,
    with_window,
    write_end,
)
from nodus_kit import errors, tracing
from nodus_kit.errors import AlreadyExists, Conflict, NotFound
from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_UID_LABEL, Attempt
from nodus_schema.billing import FUNDING_BUCKET, Block, Funding
from nodus_schema.holds import HOLD_WINDOW_MS, STOP_MARGIN_MS, resume_micros, stop_margin_ms
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.ledger import MICROS_PER_HOUR_MS, charge_micros
from nodus_schema.meta import ObjectMeta
from nodus_schema.pipelines import Pipeline
from nodus_schema.quantities import micros_to_usd, usd_to_micros
from nodus_schema.sweeps import Sweep

log = logging.getLogger(__name__)

STAMP_MS = 1000
"""The resolution of object times (metav1.Time: whole seconds)."""
MIN_RECHECK_MS = 250
"""The soonest a Job with an open hold is looked at again (a hold already short is checked this often)."""


@dataclass(frozen=True)
class Terms:
    """How far ahead holds fund runs, how often usage is charged, and how early a Job is stopped."""

    window_ms: int = HOLD_WINDOW_MS
    """A hold funds this much time ahead of use; it is extended when half of it is left."""
    tick_ms: int = METER_TICK_MS
    """Running usage is charged in whole ticks (the capture charges the rest, to the billing increment)."""
    margin_ms: int = STOP_MARGIN_MS
    """A Job is stopped while its holds still fund this long: time to checkpoint and tear down (a fifth of
    what a small hold funds, when that is less: nodus_schema.holds.stop_margin_ms)."""
    orphan_ms: int = ORPHAN_HOLD_MS
    """A hold whose Attempt was never created is released after this (the scheduler died in between)."""

    @classmethod
    def of(cls, settings: BillingSettings) -> Terms:
        """The terms billing's variables set (seconds there, milliseconds here)."""
        return cls(
            window_ms=_ms(settings.hold_window_s),
            tick_ms=_ms(settings.meter_tick_s),
            margin_ms=_ms(settings.stop_margin_s),
            orphan_ms=_ms(settings.orphan_hold_s),
        )


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def settled(job: Job) -> bool:
    """A Job the meter is done with for good: it ended, and its cost is final, which billing writes only
    once no hold of it is open and every Attempt of it has ended (cost_of). Nothing can change that but the
    Job's deletion (another reconcile: the holds of a deleted Job are released). The resync skips it and
    its reconcile returns at once, so an idle billing does not grow busier with history. (A Job at rest is
    settled too: :meth:`Metering.settled`.)"""
    cost = job.status.cost
    return job.status.phase in TERMINAL_PHASES and cost is not None and cost.final is True


def now_ms() -> int:
    return int(time.time() * 1000)


Key = tuple[str, str]
Requeue = Callable[[Key, float], None]


class Metering:
    def __init__(
        self,
        nc: NATS,
        books: Books,
        terms: Terms,
        views: Views | None = None,
        *,
        requeue: Requeue = lambda key, delay_s: None,
    ) -> None:
        self.books = books
        self.terms = terms
        # The stores: what billing writes, and what the hold endpoint reads (on every replica).
        self.jobs = ObjectStore(nc, "jobs", Job)
        self.sweeps = ObjectStore(nc, "sweeps", Sweep)
        self.pipelines = ObjectStore(nc, "pipelines", Pipeline)
        self.attempts = ObjectStore(nc, "attempts", Attempt)
        self.funding = ObjectStore(nc, FUNDING_BUCKET, Funding)
        self.archive = Archive(nc)
        self.views = views
        """The informers the reconcile reads (the service's; None: holds only)."""
        self.requeue = requeue  # the meter's enqueue (a write whose echo the view will not tell)
        self._rest: dict[Key, str] = {}
        """Jobs the last reconcile found at rest, with the resourceVersion it found so (see settled)."""

    # -- the reconcile -------------------------------------------------------------------------------
    def _read(self) -> Views:
        views = self.views
        if views is None or not views.synced():
            raise errors.Unavailable("billing's views of Jobs, Attempts and books are not listed yet")
        return views

    async def reconcile(self, key: Key) -> float | None:
        ns, name = key
        views = self._read()
        now = now_ms()
        job = views.jobs.get(ns, name)
        if job is None:
            self._rest.pop(key, None)
            if not (views.running(ns, name) or views.held(ns, name) or views.booked(ns, name)):
                return None  # deleted with nothing of it held, running or in a book: no book to read
            # Deleted, or not shown yet: the view of Jobs lags the others after a lost server (the R3
            # failover test filed a running cell's runs as a deleted Job's, and then wrote its cost $0).
            job = await views.jobs.confirm(ns, name)
            if job is None:
                return await self._reconcile(views, key, None, now)
        if settled(job) and (views.unfiled(ns, name) or views.booked(ns, name)):
            await self._file(views, ns, name)  # a pass cut short, or a book older than forgetting
            return None
        if self.settled(job):
            return None  # nothing left to charge, hold, write or file: no book read (issue #19)
        # A child of the Job's create, whatever event or tick brought it here (ADR-0032).
        with tracing.object_span("meter Job", job):
            return await self._reconcile(views, key, job, now)

    def settled(self, job: Job) -> bool:
        """Whether the resync may skip the Job: final, or at rest since the reconcile that found it so
        (see the module's docstring). Called for every stored Job per resync: memory only."""
        views = self.views
        key = (job.metadata.namespace or "", job.metadata.name or "")
        if settled(job):
            return views is None or not (views.unfiled(*key) or views.booked(*key))
        if views is None or self._rest.get(key) != job.metadata.resource_version:
            return False
        return not (views.running(*key) or views.held(*key) or views.blocks(job))

    def wrote_funding(self, record: Funding) -> None:
        """A funding record the hold endpoint wrote, handed to the view when this replica follows the
        store (write-through: the meter's next pass compares its block with it, not with an older one)."""
        if self.views is not None and self.views.funding.running:
            self.views.funding.apply(record)

    def forget_rest(self) -> None:
        """A new term as leader judges every Job again (another leader may have acted meanwhile)."""
        self._rest.clear()

    async def _reconcile(self, views: Views, key: Key, job: Job | None, now: int) -> float | None:
        ns, name = key
        attempts = views.attempts_of(ns, name)
        state = await self.books.read(ns, seen=_seen(views, ns))
        # The Jobs of this name (any uid) that the book holds holds of: all the book's Jobs of the name
        # count only through their holds, and a scan of the holds does not grow with the book's Jobs.
        refs = {h.job for h in state.holds.values() if h.job.rsplit("@", 1)[0] == name}
        steps: list[Step] = []
        booked = False
        if job is not None:
            refs.add(job_ref(name, job.metadata.uid))
            booked = _booked(state, job, attempts)
            if booked:
                steps += self.puts(job, *(await self._owners(views, job)))
        steps += self._settle(state, refs, attempts, now)
        if _acts(state, steps):
            state = (await self.books.apply(ns, steps)).state
        if await self._end_unfunded(views, state, attempts, now):
            self.requeue(key, 0.0)  # captured by the next pass
        if job is None:
            if not _open_holds(state, refs):
                await self._file(views, ns, name, state)
            return self._next(state, refs)
        ref = job_ref(name, job.metadata.uid)
        if booked and ref not in state.jobs:  # refused (a Sweep or Pipeline not known yet): the next pass
            return 1.0  # puts it
        if job.status.phase in TERMINAL_PHASES and _unaccounted(state, job, ref, attempts):
            # A run of the ended Job whose hold this book does not show: placed by a commit the books'
            # glance has not shown yet (another replica's hold endpoint; a watch resuming after a lost
            # server). Its cost is judged on the book as stored, never final without that run.
            state = await self.books.read(ns)
        block = await self._fund(views, job, ref, state, attempts, now)
        written: Job | None = job
        wait_ms = ending(state, job, ref, attempts, now)
        if not wait_ms and not starting(state, ref, attempts, now):
            written = await self._write_cost(views, job, ref, state, attempts)
        if written is not None and settled(written):
            await self._file(views, ns, name, state)
        quiet = not _open_holds(state, refs) and block is None and not _running(attempts) and not wait_ms
        # An ended Job is never at rest: its cost is final (settled) or waits for a run the views have not
        # shown (costing.runs_shown), whose event must find it.
        self._rested(key, written, at_rest=quiet and job.status.phase not in TERMINAL_PHASES)
        after = self._next(state, {ref})
        if wait_ms:  # the cost is written by the Job's end, or by this look at the latest
            return min(wait_ms / 1000, after) if after is not None else wait_ms / 1000
        return after

    async def _file(self, views: Views, ns: str, name: str, state: State | None = None) -> None:
        """File the settled runs of the Jobs of this name, the Job of the name being final (its cost
        written final) or gone: to the history bucket first, then out of the book (``filing``). A Job
        still metered keeps its runs in the book: its cost and recovery are read from them. The records
        of them all left with no run in the book are folded into its totals and dropped (``forgetting``),
        in the same commit: a final Job needs nothing of the book again (its cost is written, and the
        meter never looks at it again), so the book holds the Jobs still metered, not every Job a project
        keeps."""
        if state is None:
            state = await self.books.read(ns, seen=_seen(views, ns))
        refs = {h.job for h in state.holds.values() if h.status != "Open" and h.job.rsplit("@", 1)[0] == name}
        ops: list[Step] = []
        for ref in sorted(refs):
            ids = await self.archive.record(ns, ref, state)
            if ids:
                ops.append(File(job=ref, hold_ids=ids))
        # Every record of its name: the live Job's own once final, and those of older Jobs of the name
        # (deleted). A scan of the book's Jobs, which are those still metered.
        filing = {h for op in ops if isinstance(op, File) for h in op.hold_ids}
        ops += [Forget(job=ref) for ref in named(state, name) if forgettable(state, ref, filing)]
        if ops:
            await self.books.apply(ns, ops)

    def _rested(self, key: Key, job: Job | None, *, at_rest: bool) -> None:
        """Remember (or forget) that this revision of the Job needs nothing until something changes: no
        open hold in the book just read, nothing running, no block, its cost written. ``job``: None when
        the pass judged an older revision than the store holds (the next pass judges that one)."""
        if at_rest and job is not None:
            self._rest[key] = job.metadata.resource_version or ""
        else:
            self._rest.pop(key, None)

    async def _owners(self, views: Views, job: Job) -> tuple[Sweep | None, Pipeline | None]:
        """The cell's Sweep and the Pipeline the Job counts under (its own, or its Sweep's), from the views;
        from the store when a view lacks one (not seen yet, or gone): a Job must never go into the book
        without the shared cap of a Sweep or a Pipeline that exists."""
        ns = job.metadata.namespace
        ref = sweep_ref_of(job)
        sweep = viewed(views.sweeps, ns, ref) or await stored(self.sweeps, ns, ref)
        ref = pipeline_ref_of(job, sweep)
        return sweep, viewed(views.pipelines, ns, ref) or await stored(self.pipelines, ns, ref)

    async def owners(self, job: Job) -> tuple[Sweep | None, Pipeline | None]:
        """The cell's Sweep and the Job's Pipeline for the hold endpoint: from this replica's views when
        they are listed (the leader's: no read, and no decode of a Sweep whose status lists every cell),
        else as stored. A view a few milliseconds behind judges a hold by a cap a few milliseconds old, as
        a hold asked that much earlier would have been; the meter puts the change when it comes."""
        views = self.views
        if views is not None and views.synced():
            return await self._owners(views, job)
        return await self.stored_owners(job)

    async def stored_owners(self, job: Job) -> tuple[Sweep | None, Pipeline | None]:
        """The cell's Sweep and the Job's Pipeline as stored (None: under none, or gone or created again)."""
        ns = job.metadata.namespace
        sweep = await stored(self.sweeps, ns, sweep_ref_of(job))
        return sweep, await stored(self.pipelines, ns, pipeline_ref_of(job, sweep))

    def puts(self, job: Job, obj: Sweep | None, pipeline: Pipeline | None = None) -> list[Step]:
        """PutPipeline / PutSweep / PutJob, decided inside the commit (:func:`putting.puts`)."""
        return puts(job, obj, pipeline)

    def _settle(self, state: State, refs: set[str], attempts: list[Attempt], now: int) -> list[Step]:
        """Capture, charge, extend or release each open hold of the Job."""
        by_name = {a.metadata.name: a for a in attempts}
        steps: list[Step] = []
        for hold_id, hold in sorted(state.holds.items()):
            if hold.job not in refs or hold.status != "Open":
                continue
            attempt = by_name.get(hold_id)
            if attempt is None:
                if now - hold.placed_ms >= self.terms.orphan_ms:
                    steps.append(Release(hold_id=hold_id))
            elif attempt.status.phase in ATTEMPT_TERMINAL:
                reusers = self._reusers(attempt)
                if warm_open(attempt, reusers, now):  # its node kept warm: charged on (warming.py)
                    steps.append(self._tick(hold_id, attempt, now))
                    steps.append(self._extend(hold_id, attempt, now, horizon_ms(attempt, reusers)))
                    continue
                usage = usage_of(attempt, replacement=_replaces_lost(attempt, attempts), now_ms=now)
                steps.append(_capture(hold_id, with_window(usage, attempt, reusers, now)))
            else:
                if attempt.status.start_time:
                    steps.append(self._tick(hold_id, attempt, now))
                steps.append(self._extend(hold_id, attempt, now))
        return steps

    def _tick(self, hold_id: str, attempt: Attempt, now: int) -> Planner:
        """Charge the run's usage up to the last whole tick (never more than its final charge will be)."""
        rate, tick = attempt.spec.rate_micros_per_hour, self.terms.tick_ms
        # Object times are whole seconds: the run's finish, stamped later, may read up to a second less
        # than the clock does now. Ticking a second behind keeps every tick within the final charge.
        ticks = max(0, usage_ms(attempt, now) - STAMP_MS) // tick

        def plan(state: State) -> Op | None:
            hold = state.holds.get(hold_id)
            if hold is None or hold.status != "Open" or ticks == 0:
                return None
            amount = charge_micros(rate, ticks * tick) - hold.charged_micros
            if amount <= 0:
                return None
            return Charge(hold_id=hold_id, tick=str(ticks), amount_micros=amount)

        return plan

    def _reusers(self, attempt: Attempt) -> list[Attempt]:
        views = self.views
        return views.attempts.by_index(WARM_FROM, keeper_key(attempt)) if views is not None else []

    def _extend(self, hold_id: str, attempt: Attempt, now: int, horizon: int | None = None) -> Planner:
        """Keep a window of funding ahead of use, as far as the caps, Budgets and credits allow (and no
        further than ``horizon`` of billed time: a warm window's end)."""
        rate, window = attempt.spec.rate_micros_per_hour, self.terms.window_ms
        used_ms = usage_ms(attempt, now)
        ahead = used_ms + window if horizon is None else min(used_ms + window, horizon)

        def plan(state: State) -> Op | None:
            hold = state.holds.get(hold_id)
            if hold is None or hold.status != "Open" or rate <= 0:
                return None
            if hold.funded_until_ms - now > window // 2:
                return None
            needed = charge_micros(rate, ahead) - hold.charged_micros - held(state, hold_id)
            # Judged as apply judges an extension: by the Budgets of the hold's month and labels.
            room, _ = room_for(state, hold.job, hold.month, hold.labels)
            more = min(max(needed, 0), room)
            if more <= 0:
                return None
            until = funded_until(hold, held(state, hold_id) + more, now - used_ms)
            return ExtendHold(hold_id=hold_id, more_micros=more, funded_until_ms=until)

        return plan

    async def _end_unfunded(self, views: Views, state: State, attempts: list[Attempt], now: int) -> bool:
        """End the warm windows their holds can no longer fund (the cap, a Budget or the credits reached):
        where the funding ends (warming.end_of_funding). Whether one was ended."""
        ended = False
        for a in attempts:
            hold = state.holds.get(a.metadata.name or "")
            if not warm_pending(a) or hold is None or hold.status != "Open":
                continue
            end = end_of_funding(hold, a, self._reusers(a), now, self.terms.tick_ms)
            if end is None:
                continue
            written = await write_end(self.attempts, a, end)
            if written is not None:
                views.attempts.apply(written)
                ended = True
                log.info("warm window ended: not funded", extra={"attempt": a.metadata.name})
        return ended

    # -- funding ---------------------------------------------------------------------------------------
    async def _fund(
        self, views: Views, job: Job, ref: str, state: State, attempts: list[Attempt], now: int
    ) -> Block | None:
        """Block the Job when its running holds run out and cannot be extended; unblock when they can.
        Returns the Job's block as it now stands."""
        ns, name = job.metadata.namespace or "", job.metadata.name or ""
        record = views.funding.get(ns, name)
        current = record.blocked if record is not None and record.job_uid == job.metadata.uid else None
        block = None
        if ref not in state.jobs:  # never held (see _booked): nothing of it to block, nor to lift
            block = current
        elif job.status.phase not in TERMINAL_PHASES:
            block = self._block_of(state, ref, attempts, now, current)
        if block == current:
            return block
        funding = Funding(
            metadata=ObjectMeta(name=name, namespace=ns), job_uid=job.metadata.uid or "", blocked=block
        )
        try:
            if record is None:
                stored = await self.funding.create(funding)
            else:
                funding.metadata = msgspec.structs.replace(
                    funding.metadata, resource_version=record.metadata.resource_version
                )
                stored = await self.funding.update(funding)
        except AlreadyExists:
            # Written meanwhile (the hold endpoint, maybe on another replica) and not in the view yet:
            # retried once the view has it.
            raise Conflict(f"the funding record of job {ns}/{name} changed meanwhile") from None
        views.funding.apply(stored)  # write-through: the next pass compares with what was written
        if block is not None:
            log.info("job blocked", extra={"job": f"{ns}/{name}", "reason": block.reason})
        if (block is None) != (current is None):
            # One Job at its Sweep's or Pipeline's cap means every Job under it is: look at its siblings now,
            # not at their tick (cells of the Sweep; every stage of the Pipeline, cells included).
            for sibling in siblings(state, ref):
                self.requeue((ns, sibling.rsplit("@", 1)[0]), 0.0)
        return block

    def _block_of(
        self, state: State, ref: str, attempts: list[Attempt], now: int, current: Block | None
    ) -> Block | None:
        margin = self.terms.margin_ms
        running = [h for h, hold in state.holds.items() if hold.job == ref and hold.status == "Open"]
        live = {a.metadata.name for a in attempts if a.status.phase not in ATTEMPT_TERMINAL}
        running = [h for h in running if h in live]
        room, code = room_for(state, ref, month_of(now))
        if running:
            short = [h for h in running if state.holds[h].funded_until_ms - now < self._margin(state, h)]
            if not short:
                return None
            rate = max(state.holds[h].rate_micros_per_hour for h in short)
            return _block(state, ref, code, room, rate, margin)
        # Nothing runs: blocked until a run could be funded for a while again (resume_micros), so a
        # sliver of room left under a cap does not start a run for a second of work.
        rate = current.rate_micros_per_hour if current is not None else 0
        if current is None or room >= resume_micros(rate, margin):
            return None
        return _block(state, ref, code, room, rate, margin)

    def _margin(self, state: State, hold_id: str) -> int:
        """The hold's stop margin: the terms', or a fifth of what a small hold funds (a small cap runs)."""
        hold = state.holds[hold_id]
        return stop_margin_ms(hold.reserved_micros, hold.rate_micros_per_hour, self.terms.margin_ms)

    # -- status.cost -----------------------------------------------------------------------------------
    async def _write_cost(
        self, views: Views, job: Job, ref: str, state: State, attempts: list[Attempt]
    ) -> Job | None:
        """Write status.cost and status.recovery when they changed. Returns the Job as now stored when it
        is the revision this pass judged (or its own write on top of it); None when the store held a newer
        one (or none): the write-through then hides that revision's event from the view, and queues the
        Job again for the next pass to judge it."""
        cost = cost_of(job, ref, state, attempts)
        recovery = recovery_of(job, state, attempts)
        if cost.final and usd_to_micros(cost.total_usd or "0") == 0 and _ran(job, attempts):
            _warn_free(job, ref, state, attempts)
        if (job.status.cost, job.status.recovery) == (cost, recovery):
            return job
        found: list[str | None] = []  # the revision each try of the mutate wrote onto

        def change(current: Job) -> Job | None:
            found.append(current.metadata.resource_version)
            if current.metadata.uid != job.metadata.uid:
                return None
            if settled(current):
                # Final is the meter's last word: written by the pass that filed the Job's runs out of the
                # book. A pass on an older revision (a view a write behind the store) judges a book
                # without those runs, and would write $0 over it.
                return None
            if (current.status.cost, current.status.recovery) == (cost, recovery):
                return None
            status = msgspec.structs.replace(current.status, cost=cost, recovery=recovery)
            return msgspec.structs.replace(current, status=status)

        try:
            # Tried first on the revision judged (the view's copy): a Job nobody wrote since costs a write
            # and no read; a conflict reads it fresh.
            stored = await self.jobs.mutate(job.metadata.namespace, job.metadata.name or "", change, seen=job)
        except NotFound:
            return None  # deleted meanwhile: its DELETED event brings it back
        views.jobs.apply(stored)  # write-through: the next pass sees the cost it wrote (newer wins)
        return stored if found[-1] == job.metadata.resource_version else None

    def _next(self, state: State, refs: Iterable[str]) -> float | None:
        """Every tick while a hold is open, and in time to stop a run whose funding ends before the next
        tick (a small hold funds seconds)."""
        open_ = _open_holds(state, refs)
        if not open_:
            return None
        now = now_ms()
        due = min(state.holds[h].funded_until_ms - self._margin(state, h) - now for h in open_)
        return max(MIN_RECHECK_MS, min(self.terms.tick_ms, due)) / 1000


# --- pure helpers ------------------------------------------------------------------------------------


def _seen(views: Views, project: str) -> int | None:
    """The revision of the project's book that the books' glance shows (0: the glance, listed, holds no
    book of the project; None: a glance without a revision)."""
    glance = views.books.get(None, project)
    if glance is None:
        return 0
    rv = glance.metadata.resource_version
    return int(rv) if rv else None


def _ran(job: Job, attempts: list[Attempt]) -> bool:
    """Whether a run of the Job (its uid) used its node for a while (its agent's times say so)."""
    return any(
        (a.status.billing_stop_ms or 0) > (a.status.billing_start_ms or 0) > 0 for a in runs_of(job, attempts)
    )


def _warn_free(job: Job, ref: str, state: State, attempts: list[Attempt]) -> None:
    """A final cost of $0 for a Job that ran: a covered run is one reason; a pass that found the Job's runs
    filed out of the book is another (the R3 failover test's, 2026-12-04/05: a Job missing from a lagging
    view filed as a deleted one). What the pass saw, for whoever reads the log."""
    holds = {h: (hold.status, hold.charged_micros) for h, hold in state.holds.items() if hold.job == ref}
    log.warning(
        "final cost of a Job that ran is $0",
        extra={
            "job": f"{job.metadata.namespace}/{ref} rv {job.metadata.resource_version} {job.status.phase}",
            "holds": str(holds),
            "record": str(state.jobs.get(ref)),
            "runs": str([(a.metadata.name, a.status.phase, a.status.billing_stop_ms) for a in attempts]),
        },
    )


def _unaccounted(state: State, job: Job, ref: str, attempts: list[Attempt]) -> bool:
    """Whether a run of this Job (its uid) has no hold in ``state``, open, settled or filed: the book is
    older than that run's hold (a Job whose runs billing never funded reads the store each pass until its
    cost is final, then never again)."""
    record = state.jobs.get(ref)
    filed = set(record.filed) if record is not None else set()
    return any(
        a.metadata.name not in state.holds and a.metadata.name not in filed for a in runs_of(job, attempts)
    )


def _booked(state: State, job: Job, attempts: list[Attempt]) -> bool:
    """Whether the meter puts the Job in its project's book: it is there already (its cap, labels and
    generation are kept current), or a run of its name exists. A Job that never ran (Suspended, or waiting
    for capacity) is put by the hold endpoint with its first hold, in that hold's commit; until then
    nothing of it is held or spent, and the book (one message, written whole at every commit) does not grow
    with the Jobs of a project that never ran."""
    return job_ref(job.metadata.name or "", job.metadata.uid) in state.jobs or bool(attempts)


def _acts(state: State, steps: list[Step]) -> bool:
    """Whether a step would change the book as read: an operation, or a planner with something to do there
    (one that raises is left to the commit, which refuses it alone). A look that changes nothing commits
    nothing: no read of the book, no write (as a reconcile with no steps)."""
    for step in steps:
        if not callable(step):
            return True
        try:
            if step(state) is not None:
                return True
        except Exception:
            return True
    return False


def _capture(hold_id: str, usage: Usage) -> Planner:
    total = charged(usage)

    def plan(state: State) -> Op | None:
        hold = state.holds.get(hold_id)
        if hold is None or hold.status != "Open":
            return None
        # total_micros makes the hold end at exactly the run's charge, ticks that ran ahead included.
        return Capture(
            hold_id=hold_id,
            amount_micros=max(0, total - hold.charged_micros),
            usage=usage,
            total_micros=total,
        )

    return plan


def funded_until(hold: Hold, reserved_left: int, billing_start_ms: int) -> int:
    """When what a hold has charged and still reserves stops paying for its run, at its rate."""
    rate = hold.rate_micros_per_hour
    if rate <= 0:
        return hold.funded_until_ms
    paid = hold.charged_micros + reserved_left
    return billing_start_ms + paid * MICROS_PER_HOUR_MS // rate


def _running(attempts: list[Attempt]) -> bool:
    return any(a.status.phase not in ATTEMPT_TERMINAL for a in attempts)


def _open_holds(state: State, refs: Iterable[str]) -> list[str]:
    wanted = set(refs)
    return [h for h, hold in state.holds.items() if hold.job in wanted and hold.status == "Open"]


def _replaces_lost(attempt: Attempt, attempts: list[Attempt]) -> bool:
    """A run that replaces one lost with its capacity: its start-up is Restore, not Boot."""
    if attempt.spec.attempt <= 1:
        return False
    before = [
        a
        for a in attempts
        if a.spec.index == attempt.spec.index
        and a.spec.attempt == attempt.spec.attempt - 1
        and a.metadata.labels.get(JOB_UID_LABEL) == attempt.metadata.labels.get(JOB_UID_LABEL)
    ]
    return any(a.status.phase == "Lost" for a in before)


def _block(state: State, ref: str, code: str, room: int, rate: int, margin_ms: int) -> Block:
    job = state.jobs[ref]
    need = resume_micros(rate, margin_ms)
    left = f"${micros_to_usd(room)}"
    cap = binding_cap(state, ref, room) if code == "MaxCostReached" else None
    if code == "MaxCostReached":
        # The cap that binds: the Job's own, its Sweep's or its Pipeline's (innermost first on a tie).
        kind, name = (cap.kind.lower(), cap.name.rsplit("@", 1)[0]) if cap else ("job", ref.rsplit("@", 1)[0])
        usd = f"${micros_to_usd(cap.cap if cap else job.max_cost_micros or 0)}"
        whose = "the Job's spec.maxCostUSD" if kind == "job" else f"the spec.maxCostUSD of {kind} {name}"
        message = f"{left} is left under {whose} ({usd}): not enough to keep running"
        fix = f"Raise spec.maxCostUSD of {kind} {name} by at least ${micros_to_usd(need)} to resume it."
    elif code == "BudgetExceeded":
        message = f"a Budget of project {job.project} has {left} left this month"
        fix = "Raise the Budget's spec.monthlyUSD (kubectl get budgets), or wait for next month."
    else:
        message = f"project {job.project} has {left} of credits not held"
        fix = f"Grant the project at least ${micros_to_usd(max(need - room, 0))} (nodus credits grant)."
    return Block(reason=code, message=message, fix=fix, rate_micros_per_hour=rate)
