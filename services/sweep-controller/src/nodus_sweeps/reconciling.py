"""The Sweep reconciler: cells Jobs in, cell table and best cells out.

Level-triggered and safe to kill at any line: it derives everything from the Sweep and the Jobs it
controls, both read from the process's informers (:mod:`nodus_kit.informing`; the cell rules are in
:mod:`nodus_sweeps.cells`), creates the next missing cells (AlreadyExists is success when the Job found is
its own), and writes the status only when it changed. What it writes it hands to the informers at once
(write-through), so its next pass sees it before the watch delivers it.

Ownership is Kubernetes' ControllerRef, never labels (ADR-0007): the Sweep acts only on the Jobs named as
its cells whose controller ownerReference carries its uid, for everything (counting, the rows, the best
cells, the cost, maxParallel, state propagation, the cascade on delete). A cell's name held by any other Job
(a user's, one of an earlier Sweep of the same name) is never adopted: the cell is reported Pending with no
object, the condition ``CellNameTaken`` and an event say which Job holds it and what to do, the other cells
go on, and once the Job is gone the cell is created (docs/sweeps.md, "Cells and their names").

What a pass costs is kept small for Sweeps of a thousand cells, whose status is ~140 kB (issue #8's
200 cells/s, bench/sweeps_bench.py):

* the Sweep is the one the sweeps informer holds, and the status is written by compare-and-set on its
  revision; only a Sweep the informer does not hold is read from the store (so a cell's event for a Sweep
  the watch has not delivered yet is never taken for a deleted Sweep);
* the cells of a generation are expanded once, and a row is built again only when its Job changed;
* a status whose phase, reason and conditions did not change (only rows, counts, costs) is written at
  most every :data:`WRITE_INTERVAL_S` per Sweep: a pass within it asks to run again when it ends;
* a pass costs the same whatever changed (a walk over every cell, ~1 ms a thousand cells), so a Sweep
  is passed at most every :data:`PASS_INTERVAL_S`: changes of its cells that come meanwhile (a busy
  Sweep's come every few milliseconds) are taken together by the next pass.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit import measuring, tracing
from nodus_kit.errors import AlreadyExists, Conflict, NotFound, TemporaryError
from nodus_kit.eventing import publish_event
from nodus_kit.informing import Informer, key_of
from nodus_kit.keying import Event
from nodus_schema.costs import Cost, CostSegments, Estimate
from nodus_schema.defaulting import default_job
from nodus_schema.estimating import RATE_CEILING_ANNOTATION
from nodus_schema.expanding import Cell, cell_job, cell_job_name, expand
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import Condition, now_rfc3339, set_condition
from nodus_schema.quantities import micros_to_usd, usd_to_micros
from nodus_schema.sweeps import Sweep, SweepBest, SweepCell, SweepStatus
from nodus_sweeps import cells as rules
from nodus_sweeps.cells import (
    NAME_TAKEN,
    controlled_by,
    controller_of,
    cost_final,
    taken_condition,
    taken_fix,
    taken_sentence,
    taken_summary,
)

log = logging.getLogger(__name__)
DEFAULT_MAX_PARALLEL = 4
SYNC_WAIT_S = 5.0
WRITE_INTERVAL_S = 0.25
"""The least time between two status writes of one Sweep that only move its rows and counts."""
PASS_INTERVAL_S = 0.025
"""The least time between the starts of two passes over one Sweep (a freed slot waits at most this)."""
STOP_EARLY_ANNOTATION = "nodus.dev/stop-early"
"""``"true"``: start no more cells while the projected cost to finish exceeds what is left under the cap."""

Key = tuple[str, str]


class SweepReconciler:
    """Reconciles one Sweep per call from the sweeps informer and the jobs informer (indexed by
    :func:`~nodus_sweeps.cells.by_slot` and :func:`~nodus_sweeps.cells.by_cell`), which the service
    declares and starts."""

    def __init__(self, nc: NATS, sweeps: Informer[Sweep], jobs: Informer[Job]) -> None:
        self.nc = nc
        self.sweeps = sweeps
        self.jobs = jobs
        self._gone_uid: dict[Key, str] = {}  # the uid of each Sweep seen deleted (whose cells go)
        self._announced: dict[Key, set[tuple[str, int, str]]] = {}  # (Sweep uid, index, holder uid) told
        self._expanded: dict[Key, tuple[str | None, int | None, list[Cell], list[str]]] = {}
        self._rows: dict[Key, dict[int, tuple[str | None, SweepCell]]] = {}
        self._written: dict[Key, float] = {}  # monotonic time of the last status write
        self._passed: dict[Key, float] = {}  # monotonic time the last pass began
        sweeps.add_handler(self._on_sweep)

    def _on_sweep(self, event: Event[Sweep]) -> None:
        """Remember the uid of a Sweep seen deleted (a relist's synthesised DELETED included): its cells
        are collected by uid, so that none of a Sweep created again under the name is."""
        key, uid = key_of(event.object), event.object.metadata.uid
        if event.type != "DELETED":
            self._gone_uid.pop(key, None)
        elif uid:
            self._gone_uid[key] = uid

    def deleted_uid(self, key: Key) -> str | None:
        """The uid of the Sweep ``key`` this process saw deleted (None: it did not see a delete)."""
        return self._gone_uid.get(key)

    def wakes(self, event: Event[Job]) -> list[Key]:
        """The controller's mapper of Job changes: a Job with a cell's name wakes that Sweep if it claims a
        Sweep (label, ownerReference), or if the Sweep is one the sweeps informer holds (a user's Job
        holding a cell's name, whose delete frees it); other Jobs, however named, wake nothing."""
        job = event.object
        slot = rules.slot_of(job.metadata.name or "")
        if slot is None:
            return []
        key = (job.metadata.namespace or "", slot[0])
        return [key] if rules.related(job) or self.sweeps.get(*key) is not None else []

    def settled(self, sweep: Sweep) -> bool:
        """The controller's ``settled``: nothing left to do (:func:`nodus_sweeps.cells.settled`)."""
        return rules.settled(sweep, self.jobs)

    async def _synced(self) -> None:
        """A pass works from both views only once their first lists are in: a restarted controller must
        never create a cell the store already holds because it has not read it yet."""
        for informer in (self.sweeps, self.jobs):
            if not informer.synced.is_set() and not await informer.wait_synced(SYNC_WAIT_S):
                raise TemporaryError(f"the {informer.name} informer has not listed yet", delay=1.0)

    async def _sweep(self, key: Key) -> Sweep:
        # Not in the view: deleted, or not delivered yet (a cell's event may come first); the store says.
        sweep = await self.sweeps.confirm(*key)
        if sweep is None:
            raise NotFound(f"sweep {key[0]}/{key[1]} not found")  # deleted (or never there)
        return sweep

    def _forget(self, key: Key) -> None:
        self._announced.pop(key, None)
        self._expanded.pop(key, None)
        self._rows.pop(key, None)
        self._written.pop(key, None)
        self._passed.pop(key, None)

    async def reconcile(self, key: tuple[str, str]) -> float | None:
        ns, name = key
        await self._synced()
        now = time.monotonic()
        wait = self._passed.get(key, 0.0) + PASS_INTERVAL_S - now
        if wait > 0:
            return wait
        self._passed[key] = now
        try:
            sweep = await self._sweep(key)
        except NotFound:
            self._forget(key)
            await self._collect(ns, name, self.deleted_uid(key), rules.dependents(self.jobs, key))
            return None
        # A child of the Sweep's create, whatever event brought it here; its cells carry it on (ADR-0032).
        with tracing.object_span("reconcile Sweep", sweep):
            return await self._reconcile(key, sweep)

    async def _reconcile(self, key: Key, sweep: Sweep) -> float | None:
        cells, names = self._cells(key, sweep)
        uid = sweep.metadata.uid
        # Only the matrix's cells: a Job with a name past the last index is no cell, whoever owns it.
        all_owned, all_taken = rules.owned(self.jobs, key, uid), rules.taken(self.jobs, key, uid)
        owned = {c.index: all_owned[n] for c, n in zip(cells, names, strict=True) if n in all_owned}
        taken = {c.index: all_taken[n] for c, n in zip(cells, names, strict=True) if n in all_taken}
        await self._propagate_state(sweep, owned)
        outlook = project(sweep, len(cells) - len(taken), owned)
        if not (outlook is not None and outlook.over and stops_early(sweep)):
            await self._create_cells(sweep, cells, owned, taken)
        await self._announce(key, sweep, taken)
        status = self._status(sweep, cells, owned, outlook, self._rows.setdefault(key, {}), taken)
        return await self._write(key, sweep, status)

    async def _announce(self, key: Key, sweep: Sweep, taken: dict[int, Job]) -> None:
        """One Warning event per cell whose name a Job the Sweep does not own holds (per holder)."""
        told = self._announced.setdefault(key, set())
        uid = sweep.metadata.uid or ""
        now = {(uid, i, job.metadata.uid or "") for i, job in taken.items()}
        for _, index, holder in sorted(now - told):
            job = taken[index]
            await publish_event(
                self.nc,
                sweep,
                NAME_TAKEN,
                f"cell #{index}: {taken_sentence(sweep, job)}; {taken_fix([job])}",
                severity="Warning",
                phase=sweep.status.phase,
                once=f"{NAME_TAKEN}:{index}:{holder}",
            )
            log.warning(
                "cell name taken",
                extra={"sweep": sweep.metadata.name, "cell": index, "job": job.metadata.name},
            )
        self._announced[key] = now  # a name taken again later is told again

    def _cells(self, key: Key, sweep: Sweep) -> tuple[list[Cell], list[str]]:
        """The Sweep's cells and their Jobs' names, expanded once per generation (a spec change is a new
        generation)."""
        uid, generation = sweep.metadata.uid, sweep.metadata.generation
        held = self._expanded.get(key)
        if held is not None and held[0] == uid and held[1] == generation:
            return held[2], held[3]
        cells = expand(sweep)
        names = [cell_job_name(sweep.metadata.name or "", c.index) for c in cells]
        self._expanded[key] = (uid, generation, cells, names)
        self._rows.pop(key, None)  # rows carry the cell's matrix values
        return cells, names

    async def _collect(self, ns: str, name: str, uid: str | None, cell_jobs: list[Job]) -> None:
        """The Sweep is gone: its cells go too (ownerReferences, as Kubernetes' garbage collector does).

        Only Jobs with a cell's name whose controller ownerReference is a Sweep of this name: with the uid
        of the Sweep seen deleted, when this process saw the delete; else any uid, since no Sweep of this
        name exists for any of them to belong to. Cells orphaned on purpose (propagationPolicy=Orphan
        removes the reference) stay, and so does every Job without a Sweep as its controller, labels or not.
        """
        for job in cell_jobs:
            ref = controller_of(job)
            if ref is None or ref.kind != "Sweep" or ref.name != name or (uid and ref.uid != uid):
                continue
            try:
                self.jobs.apply(await self.jobs.store.delete(ns, job.metadata.name or ""), deleted=True)
            except NotFound:
                pass

    async def _propagate_state(self, sweep: Sweep, owned: dict[int, Job]) -> None:
        """spec.state of the Sweep propagates to its unfinished cells (Suspended, Cancelled, Running)."""
        wanted = sweep.spec.state or "Running"
        for job in owned.values():
            if job.status.phase in TERMINAL_PHASES or (job.spec.state or "Running") == wanted:
                continue

            def change(j: Job, wanted: str = wanted) -> Job:
                # A spec change is a new generation, as the gateway writes it.
                meta = msgspec.structs.replace(j.metadata, generation=(j.metadata.generation or 1) + 1)
                return msgspec.structs.replace(
                    j, metadata=meta, spec=msgspec.structs.replace(j.spec, state=wanted)
                )

            try:
                self.jobs.apply(
                    await self.jobs.store.mutate(job.metadata.namespace, job.metadata.name or "", change)
                )
            except NotFound:
                pass

    async def _create_cells(
        self, sweep: Sweep, cells: list[Cell], owned: dict[int, Job], taken: dict[int, Job]
    ) -> None:
        """The next missing cells, in index order, up to maxParallel unfinished. A cell whose name a Job
        the Sweep does not control holds is skipped (it takes no slot) and put in ``taken``."""
        if (sweep.spec.state or "Running") != "Running":
            return
        limit = sweep.spec.max_parallel or DEFAULT_MAX_PARALLEL
        unfinished = sum(1 for j in owned.values() if j.status.phase not in TERMINAL_PHASES)
        name, ns, uid = sweep.metadata.name or "", sweep.metadata.namespace, sweep.metadata.uid
        for cell in cells:
            if unfinished >= limit:
                return
            if cell.index in owned or cell.index in taken:
                continue
            try:
                # Defaulted as a Job the gateway admitted would be (the GPU request of the cell included).
                job = tracing.stamp(_bound(sweep, default_job(cell_job(sweep, cell))))
                owned[cell.index] = await self.jobs.store.create(job)
                self.jobs.apply(owned[cell.index])  # write-through: the next pass counts it
                measuring.SWEEP_CELLS_CREATED.inc()
                log.info("cell created", extra={"sweep": sweep.metadata.name, "cell": cell.index})
            except AlreadyExists:
                # Ours (a create the view has not seen yet) or a Job of someone else: never adopted.
                try:
                    found = await self.jobs.store.get(ns, cell_job_name(name, cell.index))
                except NotFound:
                    continue  # deleted meanwhile: its event brings the next pass, which creates it
                if not controlled_by(found, name, uid):
                    taken[cell.index] = found
                    continue
                owned[cell.index] = found
            unfinished += 1

    def _status(
        self,
        sweep: Sweep,
        cells: list[Cell],
        owned: dict[int, Job],
        outlook: Outlook | None = None,
        built: dict[int, tuple[str | None, SweepCell]] | None = None,
        taken: dict[int, Job] | None = None,
    ) -> SweepStatus:
        """``built``: the rows of an earlier pass by index with their Job's revision (None: no Job
        yet), reused where the Job did not change and updated in place. ``taken``: the Jobs that hold
        cells' names without being the Sweep's, by index (their rows are Pending, with no object)."""
        taken = taken or {}
        m = sweep.spec.matrix
        built = {} if built is None else built
        rows = []
        for c in cells:
            job = owned.get(c.index)
            rv = job.metadata.resource_version if job is not None else None
            held = built.get(c.index)
            if held is None or held[0] != rv:
                held = built[c.index] = (rv, _cell_row(c, job, bool(m.gpu), bool(m.regions)))
            rows.append(held[1])
        old = sweep.status
        phase, reason, message = _phase(sweep, rows, taken)
        phase, reason, message = _capped(sweep, owned, phase, reason, message)
        phase, reason, message = _stopped_early(sweep, outlook, owned, phase, reason, message)
        if taken and phase in ("Pending", "Running") and not reason:
            phase, reason, message = phase, NAME_TAKEN, f"{message}; {taken_summary(sweep, taken)}"
        final = phase in TERMINAL_PHASES and all(cost_final(owned[r.index]) for r in rows if r.index in owned)
        status = SweepStatus(
            cells=rows,
            best=_best(rows),
            cost=roll_up([j.status.cost for j in owned.values()], sweep.spec.max_cost_usd, final),
            phase=phase,
            reason=reason,
            message=message,
            observed_generation=sweep.metadata.generation,
            start_time=old.start_time or (now_rfc3339() if owned else None),
            # A Sweep that runs again (a cell's Job deleted, a taken name freed) has not completed.
            completion_time=(old.completion_time or now_rfc3339()) if phase in TERMINAL_PHASES else None,
            # Copies: set_condition changes a condition in place, and the old status is the view's.
            conditions=[msgspec.structs.replace(c) for c in old.conditions],
            estimate=old.estimate,
        )
        cond = Condition(
            type="Complete" if phase == "Succeeded" else "Failed" if phase == "Failed" else "Progressing",
            status="True",
            reason=reason or phase,
            message=message,
            observed_generation=sweep.metadata.generation,
        )
        set_condition(status.conditions, cond, now=status.completion_time or now_rfc3339())
        if phase not in TERMINAL_PHASES:
            # A Sweep that runs again (a taken name freed, a cell's Job deleted) has not ended any more.
            for ended in [
                c for c in status.conditions if c.type in ("Complete", "Failed") and c.status == "True"
            ]:
                again = msgspec.structs.replace(
                    ended, status="False", reason=reason or phase, message=message
                )
                set_condition(status.conditions, again, now=now_rfc3339())
        if outlook is not None:
            set_condition(status.conditions, outlook.condition(sweep), now=now_rfc3339())
        named = taken_condition(sweep, taken, had=any(c.type == NAME_TAKEN for c in old.conditions))
        if named is not None:
            set_condition(status.conditions, named, now=now_rfc3339())
        return status

    async def _write(self, key: Key, sweep: Sweep, status: SweepStatus) -> float | None:
        """Write ``status`` by compare-and-set on the revision read; a change of rows alone waits for
        :data:`WRITE_INTERVAL_S` since the last write (the pass asks to run again then)."""
        if _same(sweep.status, status):
            return None
        wait = self._written.get(key, 0.0) + WRITE_INTERVAL_S - time.monotonic()
        if wait > 0 and not _urgent(sweep.status, status):
            return wait
        try:
            written = await self.sweeps.store.update(msgspec.structs.replace(sweep, status=status))
        except NotFound:
            self._forget(key)
            return None
        except Conflict:
            # Someone (the gateway: a spec change) wrote first: read it again and redo the pass.
            with contextlib.suppress(NotFound):  # deleted meanwhile: the next pass collects the cells
                self.sweeps.apply(await self.sweeps.store.get(*key))
            return 0.0
        self.sweeps.apply(written)  # write-through: the next pass compares with what it wrote
        self._written[key] = time.monotonic()
        return None


def _bound(sweep: Sweep, job: Job) -> Job:
    """The cell Job bound to the Sweep's estimate (ADR-031, ADR-0014): the Sweep's rate ceiling, if it was
    created bound to a dry-run (the scheduler places no cell above it), and the price book version the
    Sweep was admitted under (``status.estimate.pricebookVersion``), so every cell is placed and priced at
    that version rather than at whatever is newest when the cell is created. A version the cell already
    records is kept."""
    ceiling = sweep.metadata.annotations.get(RATE_CEILING_ANNOTATION)
    if ceiling is not None:
        annotations = {**job.metadata.annotations, RATE_CEILING_ANNOTATION: ceiling}
        job = msgspec.structs.replace(
            job, metadata=msgspec.structs.replace(job.metadata, annotations=annotations)
        )
    admitted = sweep.status.estimate.pricebook_version if sweep.status.estimate else None
    recorded = job.status.estimate
    if admitted is not None and (recorded is None or recorded.pricebook_version is None):
        estimate = (
            Estimate(pricebook_version=admitted)
            if recorded is None
            else msgspec.structs.replace(recorded, pricebook_version=admitted)
        )
        job = msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, estimate=estimate))
    return job


def _urgent(old: SweepStatus, new: SweepStatus) -> bool:
    """A change people and the other controllers wait on: phase, reason, times, conditions."""
    return _headline(old) != _headline(new)


def _headline(s: SweepStatus) -> tuple[Any, ...]:
    conditions = [(c.type, c.status, c.reason) for c in s.conditions]
    return (s.phase, s.reason, s.observed_generation, s.start_time, s.completion_time, conditions)


def _same(a: SweepStatus, b: SweepStatus) -> bool:
    """Equal but for condition timestamps (which must not cause a write on every pass)."""
    strip = [msgspec.structs.replace(c, last_transition_time=None) for c in a.conditions]
    strip_b = [msgspec.structs.replace(c, last_transition_time=None) for c in b.conditions]
    return msgspec.structs.replace(a, conditions=strip) == msgspec.structs.replace(b, conditions=strip_b)


def _cell_row(cell: Cell, job: Job | None, sweeps_gpu: bool, sweeps_region: bool) -> SweepCell:
    st = job.status if job else None
    return SweepCell(
        index=cell.index,
        repetition=cell.repetition,
        gpu=cell.gpu_text if sweeps_gpu else None,
        region=cell.region if sweeps_region else None,
        params=dict(cell.params),
        object=job.metadata.name if job else None,
        phase=(st.phase or "Pending") if st else "Pending",
        wall_seconds=st.wall_seconds if st else None,
        units_per_second=st.units_per_second if st else None,
        cost_usd=st.cost.total_usd if st and st.cost else None,
        lost_gpu_seconds=st.recovery.lost_gpu_seconds if st and st.recovery else None,
        recovery_usd=st.recovery.recovery_usd if st and st.recovery else None,
    )


def _best(rows: list[SweepCell]) -> SweepBest | None:
    done = [r for r in rows if r.phase == "Succeeded"]
    by_cost = min(
        (r for r in done if r.cost_usd),
        key=lambda r: (usd_to_micros(r.cost_usd or "0"), r.index),
        default=None,
    )
    by_tp = max(
        (r for r in done if r.units_per_second),
        key=lambda r: (Decimal(r.units_per_second or "0"), -r.index),
        default=None,
    )
    if by_cost is None and by_tp is None:
        return None
    return SweepBest(by_cost=by_cost.index if by_cost else None, by_throughput=by_tp.index if by_tp else None)


def roll_up(costs: list[Cost | None], limit: str | None, final: bool) -> Cost:
    """The Sweep's cost from its cells' (billing writes each cell's): sums, and the earliest funding end."""
    present = [c for c in costs if c is not None]

    def total(field: str, of: list[Any]) -> str | None:
        values = [getattr(c, field) for c in of if getattr(c, field) is not None]
        return micros_to_usd(sum(usd_to_micros(v) for v in values)) if values else None

    segments = [c.by_segment for c in present if c.by_segment is not None]
    until = [c.funded_until_time for c in present if c.funded_until_time]
    return Cost(
        total_usd=total("total_usd", present) or micros_to_usd(0),
        held_usd=total("held_usd", present),
        rate_usd_per_hour=total("rate_usd_per_hour", present),
        limit_usd=limit,
        by_segment=CostSegments(
            boot_usd=total("boot_usd", segments),
            running_usd=total("running_usd", segments),
            restore_usd=total("restore_usd", segments),
            teardown_usd=total("teardown_usd", segments),
            covered_by_nodus=sorted({s for seg in segments for s in seg.covered_by_nodus}),
        )
        if segments
        else None,
        funded_until_time=min(until) if until else None,
        final=final,
    )


def _capped(
    sweep: Sweep, owned: dict[int, Job], phase: str, reason: str | None, message: str
) -> tuple[str, str | None, str]:
    """A Sweep whose cells billing stopped at the shared cap is Suspended with MaxCostReached (ADR-0024)."""
    if phase in TERMINAL_PHASES or (sweep.spec.state or "Running") != "Running":
        return phase, reason, message
    open_ = [j for j in owned.values() if j.status.phase not in TERMINAL_PHASES]
    capped = [j for j in open_ if j.status.reason == "MaxCostReached"]
    if not capped:
        return phase, reason, message
    cap = sweep.spec.max_cost_usd
    fix = f"raise spec.maxCostUSD (now ${cap}) to resume them" if cap else "raise the cells' maxCostUSD"
    if all(j.status.phase == "Suspended" for j in capped) and len(capped) == len(open_):
        return "Suspended", "MaxCostReached", f"{len(capped)} cells suspended at the cost cap; {fix}"
    return "Running", "MaxCostReached", f"stopping {len(capped)} cells at the cost cap; {fix}"


@dataclass(frozen=True)
class Outlook:
    """What finishing the Sweep should cost, from the mean of its finished cells, against its cap."""

    finished: int
    mean: int  # µ$ per finished cell
    left_cells: int
    projected: int  # µ$ still to spend to finish, at the mean
    left: int  # µ$ left under the cap
    cap: int

    @property
    def over(self) -> bool:
        return self.projected > self.left

    def sentence(self) -> str:
        return (
            f"at the mean of {self.finished} finished cells (${micros_to_usd(self.mean)} each), the "
            f"{self.left_cells} cells left need about ${micros_to_usd(self.projected)}; "
            f"${micros_to_usd(max(self.left, 0))} is left under maxCostUSD ${micros_to_usd(self.cap)}"
        )

    def condition(self, sweep: Sweep) -> Condition:
        return Condition(
            type="ProjectedOverCap",
            status="True" if self.over else "False",
            reason="ProjectedOverCap" if self.over else "WithinCap",
            message=self.sentence(),
            observed_generation=sweep.metadata.generation,
        )


def project(sweep: Sweep, total_cells: int, owned: dict[int, Job]) -> Outlook | None:
    """The cost outlook of a capped Sweep once at least one cell has a final cost; else None."""
    if not sweep.spec.max_cost_usd:
        return None
    cap = usd_to_micros(sweep.spec.max_cost_usd)
    spent = {i: usd_to_micros(j.status.cost.total_usd or "0") for i, j in owned.items() if j.status.cost}
    done = [i for i, j in owned.items() if j.status.phase in TERMINAL_PHASES and cost_final(j)]
    if not done:
        return None
    mean = -(-sum(spent[i] for i in done) // len(done))
    left_cells = total_cells - len(done)
    in_progress = sum(amount for i, amount in spent.items() if i not in done)
    projected = max(0, mean * left_cells - in_progress)
    return Outlook(len(done), mean, left_cells, projected, cap - sum(spent.values()), cap)


def stops_early(sweep: Sweep) -> bool:
    return sweep.metadata.annotations.get(STOP_EARLY_ANNOTATION, "").lower() == "true"


def _stopped_early(
    sweep: Sweep,
    outlook: Outlook | None,
    owned: dict[int, Job],
    phase: str,
    reason: str | None,
    message: str,
) -> tuple[str, str | None, str]:
    """With the stop-early policy, a Sweep that may not start more cells, and has none running, waits
    Suspended with StoppedEarly (raising the cap, or removing the annotation, lets it go on)."""
    if outlook is None or not outlook.over or not stops_early(sweep) or phase != "Running" or reason:
        return phase, reason, message
    if any(j.status.phase not in TERMINAL_PHASES for j in owned.values()):
        return phase, reason, message  # cells still running finish first
    fix = (
        f"raise spec.maxCostUSD to at least ${micros_to_usd(outlook.cap + outlook.projected - outlook.left)}"
    )
    return "Suspended", "StoppedEarly", f"stopped early: {outlook.sentence()}; {fix}"


def _phase(
    sweep: Sweep, rows: list[SweepCell], taken: dict[int, Job] | None = None
) -> tuple[str, str | None, str]:
    """The Sweep's phase from its rows (ADR-0007). A cell whose name is taken (``taken``; its row is
    Pending) never runs while it is: once every other cell has ended and spec.state is Running, the Sweep
    ends Failed with CellNameTaken (a cell created later, its name freed, makes it run again)."""
    taken = taken or {}
    n = len(rows)
    done = [r for r in rows if r.phase in TERMINAL_PHASES]
    failed = [r for r in rows if r.phase == "Failed"]
    state = sweep.spec.state or "Running"
    if taken and state == "Running" and len(done) + len(taken) == n:
        counts = [(sum(1 for r in done if r.phase == p), p.lower()) for p in TERMINAL_PHASES]
        ended = ", ".join(f"{c} {p}" for c, p in counts if c)
        others = f"the other {len(done)} cells ended: {ended}" if done else "no other cell"
        return "Failed", NAME_TAKEN, f"{taken_summary(sweep, taken, of=n)}; {others}"
    if len(done) == n:
        if failed:
            which = ", ".join(f"#{r.index}" for r in failed[:10])
            return "Failed", "CellsFailed", f"{len(failed)} of {n} cells failed: {which}"
        if any(r.phase == "Cancelled" for r in rows):
            return "Cancelled", "Cancelled", f"cancelled; {n - len(failed)} of {n} cells finished"
        return "Succeeded", "CellsSucceeded", f"all {n} cells succeeded"
    if state == "Cancelled":
        if all(r.phase in TERMINAL_PHASES or r.object is None for r in rows):
            return "Cancelled", "Cancelled", f"cancelled with {len(done)} of {n} cells finished"
        return "Running", "Cancelling", "stopping the running cells"
    if state == "Suspended":
        return "Suspended", "Suspended", f"suspended with {len(done)} of {n} cells finished"
    running = sum(1 for r in rows if r.object and r.phase not in TERMINAL_PHASES)
    if running or done:
        return "Running", None, f"{len(done)} of {n} cells finished, {running} in progress"
    return "Pending", None, f"{n} cells to run"
