"""A Sweep's cells are the Jobs it controls, never a Job that only looks like one (ADR-0007, docs/sweeps.md).

Kubernetes' ControllerRef rule: the sweep controller acts only on Jobs named ``<sweep>-<index>`` whose
controller ownerReference (``controller: true``) carries the Sweep's uid. The rest of what a Job says about
itself (the ``nodus.dev/sweep`` and ``nodus.dev/cell`` labels, a plain ownerReference, a controller
reference to a Sweep of the same name with another uid) decides nothing, since any editor can write it (and
Jobs written before the gateway refused such fields may still be in the bucket). A cell whose name another
Job holds is never adopted: it is reported (row Pending with no object, condition and reason
CellNameTaken, a Warning event), the other cells go on, and once the name is free the cell is created.

The service tests run the real controller on a nats-server of this module's own (authenticated, as every
bus is) with the resync made too slow to matter, so what they see follows from events; the test writes
the cells' status as the scheduler and billing would. Not the session's server: there a new leader first
lists every Job and looks at every Sweep the whole suite left behind, which took the first test here past
60 s on CI (2026-12-05) while what it checks is the ownership rule, not a leader's start over a full bucket
(bench/growth_bench.py measures that). The rest is the cell rules over the jobs informer's indexes and the
phase rule, pure.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.informing import Informer
from nodus_kit.keying import Event
from nodus_kit.leasing import Lease
from nodus_kit.servicing import Settings
from nodus_kit.storing import ObjectStore
from nodus_schema.costs import Cost
from nodus_schema.defaulting import default_sweep
from nodus_schema.errors import REASONS
from nodus_schema.jobs import Job, JobSpec, JobStatus
from nodus_schema.messages import ObjectEvent
from nodus_schema.meta import ObjectMeta, OwnerReference, find_condition
from nodus_schema.sweeps import CELL_LABEL, SWEEP_LABEL, Sweep, SweepCell, SweepSpec
from nodus_schema.wire import API_VERSION
from nodus_sweeps.cells import CELLS, SLOTS, by_cell, by_slot, dependents, owned, slot_of, taken
from nodus_sweeps.reconciling import SweepReconciler, _phase
from nodus_sweeps.service import SweepsService
from nodus_testing.natsserver import NatsServer
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.timeout(90)

FIX = "or rename the Sweep"


# -- the rig: the controller on the module's bus -----------------------------------------------------------


@pytest.fixture(scope="module")
def bus_server() -> Iterator[NatsServer]:
    with NatsServer(tie_to_parent=True) as server:
        yield server


@pytest.fixture(scope="module")
def nats_url(bus_server: NatsServer) -> str:
    """This module's server (the name of the session's fixture it stands in for)."""
    return bus_server.url


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def nc(bus_server: NatsServer) -> AsyncIterator[NATS]:
    """The tests' connection to this module's server, its streams and buckets declared."""
    conn = await connect(bus_server.url, "ownership-tests", nkey_seed=bus_server.harness_seed)
    await declaring.ensure(conn.jetstream())
    yield conn
    await conn.close()


@contextlib.asynccontextmanager
async def controller(nats_url: str, nc: NATS) -> AsyncIterator[SweepsService]:
    env = {"NODUS_NATS_URL": nats_url, "NODUS_REPLICA": "ownership", "NODUS_RESYNC_S": "600"}
    svc = SweepsService(Settings.from_env("nodus-sweeps", env))
    svc.nc = nc
    await svc.start()
    try:
        # A controller of an earlier test killed on this bus may still hold the lease until its TTL runs
        # out: what the tests time starts once this replica leads, not while it waits its turn.
        lease = Lease(nc, "sweep-controller", "ownership")
        await eventually(
            lambda: _holds(lease), deadline_s=45, message="the test's controller never took the lease"
        )
        yield svc
    finally:
        svc.stopping.set()
        await svc.stop()


async def _holds(lease: Lease) -> bool:
    return await lease.current_holder() == "ownership"


class Rig:
    def __init__(self, nc: NATS, ns: str) -> None:
        self.nc, self.ns = nc, ns
        self.sweeps = ObjectStore(nc, "sweeps", Sweep)
        self.jobs = ObjectStore(nc, "jobs", Job)
        self.events: list[ObjectEvent] = []

    async def follow_events(self) -> Any:
        decoder = msgspec.json.Decoder(ObjectEvent)

        async def got(msg: Any) -> None:
            self.events.append(decoder.decode(msg.data))

        return await self.nc.subscribe(f"nodus.events.{self.ns}.sweeps.>", cb=got)

    async def create_sweep(self, name: str, values: list[str], **spec: Any) -> Sweep:
        body = {
            "template": {"spec": {"image": "busybox", "resources": {"gpu": "L4:1"}}},
            "matrix": {"params": {"X": values}},
            **spec,
        }
        sweep = Sweep(
            metadata=ObjectMeta(name=name, namespace=self.ns, generation=1),
            spec=msgspec.convert(body, SweepSpec),
        )
        return await self.sweeps.create(default_sweep(sweep))

    async def sweep(self, name: str) -> Sweep:
        return await self.sweeps.get(self.ns, name)

    async def set_state(self, name: str, state: str) -> None:
        def change(s: Sweep) -> Sweep:
            meta = msgspec.structs.replace(s.metadata, generation=(s.metadata.generation or 1) + 1)
            return msgspec.structs.replace(
                s, metadata=meta, spec=msgspec.structs.replace(s.spec, state=state)
            )

        await self.sweeps.mutate(self.ns, name, change)

    async def create_job(
        self, name: str, labels: dict[str, str] | None = None, owners: list[OwnerReference] | None = None
    ) -> Job:
        meta = ObjectMeta(name=name, namespace=self.ns, labels=labels or {}, owner_references=owners or [])
        return await self.jobs.create(Job(metadata=meta, spec=JobSpec(image="busybox")))

    async def finish(self, name: str, units: str, cost: str, phase: str = "Succeeded") -> None:
        """Write what the scheduler and billing write on a Job that ended."""

        def change(j: Job) -> Job:
            status = JobStatus(
                phase=phase,
                units_per_second=units,
                wall_seconds=10,
                cost=Cost(total_usd=cost, final=True),
            )
            return msgspec.structs.replace(j, status=status)

        await self.jobs.mutate(self.ns, name, change)

    async def job_or_none(self, name: str) -> Job | None:
        try:
            return await self.jobs.get(self.ns, name)
        except Exception:
            return None


def controlled(job: Job | None, sweep: Sweep) -> bool:
    return job is not None and any(
        o.controller and o.kind == "Sweep" and o.uid == sweep.metadata.uid
        for o in job.metadata.owner_references
    )


def ref(name: str, uid: str, *, controller: bool | None = True, kind: str = "Sweep") -> OwnerReference:
    return OwnerReference(api_version=API_VERSION, kind=kind, name=name, uid=uid, controller=controller)


# -- bug (a): a Job made before the Sweep, with a cell's name --------------------------------------------


async def test_a_job_made_before_the_sweep_is_not_adopted_and_its_cell_is_created_once_it_is_gone(
    nc: NATS, nats_url: str, unique: str
) -> None:
    rig = Rig(nc, unique)
    sub = await rig.follow_events()
    mine = await rig.create_job("train-1")  # a user's Job: no labels, no owner
    async with controller(nats_url, nc):
        sweep = await rig.create_sweep("train", ["a", "b", "c"], maxParallel=4)

        async def reported() -> Sweep:
            s = await rig.sweep("train")
            assert controlled(await rig.job_or_none("train-0"), sweep), "the other cells are created"
            assert controlled(await rig.job_or_none("train-2"), sweep)
            assert len(s.status.cells) == 3
            taken = s.status.cells[1]
            assert (taken.phase, taken.object) == ("Pending", None), "the user's Job is not the cell"
            cond = find_condition(s.status.conditions, "CellNameTaken")
            assert cond is not None and cond.status == "True" and cond.reason == "CellNameTaken"
            assert "#1" in (cond.message or "") and "delete or rename the Job train-1, " + FIX in (
                cond.message or ""
            )
            assert (s.status.phase, s.status.reason) == ("Running", "CellNameTaken"), s.status
            return s

        await eventually(reported, deadline_s=20, message="cell 1 is reported taken, 0 and 2 run")
        event = await eventually(
            lambda: next((e for e in rig.events if e.reason == "CellNameTaken"), None),
            deadline_s=10,
            message="a Warning event says which cell and which Job",
        )
        assert (
            event is not None
            and event.severity == "Warning"
            and event.kind == "Sweep"
            and event.name == "train"
        )
        assert "cell #1" in event.message and "train-1" in event.message and FIX in event.message

        # The user's Job is left as it was (no owner added, nothing changed); its result counts for nothing.
        untouched = await rig.jobs.get(unique, "train-1")
        assert untouched.metadata.uid == mine.metadata.uid and untouched.metadata.owner_references == []
        assert untouched.metadata.resource_version == mine.metadata.resource_version
        await rig.finish("train-1", units="99999", cost="0.000001")
        await rig.finish("train-0", units="10", cost="0.20")
        await rig.finish("train-2", units="20", cost="0.30")

        async def ended() -> Sweep:
            s = await rig.sweep("train")
            assert (s.status.phase, s.status.reason) == ("Failed", "CellNameTaken"), s.status
            assert "1 of 3 cells not created" in (s.status.message or "") and "train-1" in (
                s.status.message or ""
            )
            assert s.status.best is not None and (s.status.best.by_cost, s.status.best.by_throughput) == (
                0,
                2,
            )
            assert s.status.cost is not None and s.status.cost.total_usd == "0.50", (
                "the user's cost is not ours"
            )
            assert s.status.completion_time
            return s

        await eventually(ended, deadline_s=20, message="the Sweep ends with the cells it could run")

        # The name is freed: the cell is created (from the delete's event alone; resync is 600 s), and the
        # Sweep runs again and finishes like any other.
        await rig.jobs.delete(unique, "train-1")

        async def created() -> Job:
            job = await rig.job_or_none("train-1")
            assert controlled(job, sweep), job
            assert job is not None and job.metadata.labels[CELL_LABEL] == "1"
            return job

        await eventually(created, deadline_s=20, message="the freed name becomes the real cell 1")

        async def running_again() -> bool:
            s = await rig.sweep("train")
            assert s.status.cells[1].object == "train-1"
            cond = find_condition(s.status.conditions, "CellNameTaken")
            assert cond is not None and cond.status == "False"
            failed = find_condition(s.status.conditions, "Failed")
            assert failed is not None and failed.status == "False", "it has not failed any more"
            return s.status.phase == "Running" and s.status.completion_time is None

        await eventually(running_again, deadline_s=20, message="the Sweep runs again, not completed")
        await rig.finish("train-1", units="30", cost="0.10")

        async def succeeded() -> bool:
            s = await rig.sweep("train")
            assert s.status.best is not None and (s.status.best.by_cost, s.status.best.by_throughput) == (
                1,
                1,
            )
            return (s.status.phase, s.status.reason) == ("Succeeded", "CellsSucceeded")

        await eventually(succeeded, deadline_s=20, message="with every cell its own, the Sweep succeeds")
    await sub.unsubscribe()


# -- bug (b): a Job with the Sweep's labels and an ownerReference ------------------------------------------


async def test_a_job_with_the_labels_and_an_owner_reference_is_never_counted_changed_or_collected(
    nc: NATS, nats_url: str, unique: str
) -> None:
    rig = Rig(nc, unique)
    async with controller(nats_url, nc):
        sweep = await rig.create_sweep("grid", ["a", "b", "c"], maxParallel=2)
        uid = sweep.metadata.uid or ""

        async def first_two() -> bool:
            return controlled(await rig.job_or_none("grid-0"), sweep) and controlled(
                await rig.job_or_none("grid-1"), sweep
            )

        await eventually(first_two, deadline_s=20, message="maxParallel 2: cells 0 and 1")
        # Another editor's Jobs, written as if the gateway let them through: the next cell's name with the
        # labels and a plain ownerReference to the Sweep, and a Job of another name claiming cell 0 with a
        # controller reference carrying the Sweep's uid.
        labels = {SWEEP_LABEL: "grid"}
        await rig.create_job("grid-2", {**labels, CELL_LABEL: "2"}, [ref("grid", uid, controller=None)])
        await rig.create_job("rogue", {**labels, CELL_LABEL: "0"}, [ref("grid", uid)])

        async def taken() -> bool:
            s = await rig.sweep("grid")
            cond = find_condition(s.status.conditions, "CellNameTaken")
            assert cond is not None and cond.status == "True" and "grid-2" in (cond.message or "")
            assert "no controller" in (cond.message or ""), cond.message
            assert "rogue" not in (cond.message or ""), "a Job without a cell's name is no cell at all"
            return (s.status.cells[0].object, s.status.cells[2].object) == ("grid-0", None)

        await eventually(taken, deadline_s=20, message="cell 2's name is taken; rogue is nothing")

        # State propagation reaches the Sweep's cells only.
        await rig.set_state("grid", "Suspended")

        async def suspended() -> bool:
            return await _all_state(rig, ("grid-0", "grid-1"), "Suspended")

        await eventually(suspended, deadline_s=20, message="the Sweep's own cells are suspended")
        for name in ("grid-2", "rogue"):
            assert (await rig.jobs.get(unique, name)).spec.state is None, f"{name} is not the Sweep's"
        await rig.set_state("grid", "Running")
        await eventually(
            lambda: _all_state(rig, ("grid-0", "grid-1"), "Running"), deadline_s=20, message="resumed"
        )

        # Their results never become the Sweep's: not a row, not the best, not the cost.
        await rig.finish("rogue", units="99999", cost="0.000001")
        await rig.finish("grid-2", units="88888", cost="0.000002")
        await rig.finish("grid-0", units="10", cost="0.20")
        await rig.finish("grid-1", units="20", cost="0.30")

        async def ended() -> Sweep:
            s = await rig.sweep("grid")
            assert (s.status.phase, s.status.reason) == ("Failed", "CellNameTaken"), s.status
            assert [c.units_per_second for c in s.status.cells] == ["10", "20", None]
            assert s.status.best is not None and (s.status.best.by_cost, s.status.best.by_throughput) == (
                0,
                1,
            )
            assert s.status.cost is not None and s.status.cost.total_usd == "0.50"
            return s

        await eventually(ended, deadline_s=20, message="only the Sweep's cells count")

        # Deleting the Sweep collects its cells and nothing else.
        await rig.sweeps.delete(unique, "grid")

        async def collected() -> bool:
            return all([await rig.job_or_none(n) is None for n in ("grid-0", "grid-1")])

        await eventually(collected, deadline_s=20, message="the Sweep's cells go with it")
        assert await rig.job_or_none("grid-2") is not None, "a Job the Sweep does not control stays"
        assert await rig.job_or_none("rogue") is not None


async def _all_state(rig: Rig, names: tuple[str, ...], state: str) -> bool:
    return all([(await rig.jobs.get(rig.ns, n)).spec.state == state for n in names])


# -- a Sweep deleted and created again under the same name --------------------------------------------------


async def test_a_same_named_sweep_never_adopts_an_earlier_ones_cell(
    nc: NATS, nats_url: str, unique: str
) -> None:
    rig = Rig(nc, unique)
    # A cell of an earlier Sweep "again" that was never collected, finished with a fine result.
    labels = {SWEEP_LABEL: "again", CELL_LABEL: "0"}
    old = await rig.create_job("again-0", labels, [ref("again", "0d1d-earlier-uid")])
    await rig.finish("again-0", units="99999", cost="0.000001")
    # The new Sweep is there before the controller's first pass: a controller that saw the old cell with
    # no Sweep of its name would collect it, as the Sweep's garbage (the last test).
    sweep = await rig.create_sweep("again", ["a", "b"])
    async with controller(nats_url, nc):
        await eventually(
            lambda: _controlled_name(rig, "again-1", sweep), deadline_s=20, message="cell 1 is created"
        )

        async def reported() -> bool:
            s = await rig.sweep("again")
            cond = find_condition(s.status.conditions, "CellNameTaken")
            assert cond is not None and "an earlier Sweep of this name" in (cond.message or ""), s.status
            assert s.status.cells[0].object is None and s.status.cells[0].phase == "Pending"
            return True

        await eventually(reported, deadline_s=20, message="the earlier Sweep's cell is reported, not adopted")
        await rig.finish("again-1", units="5", cost="0.05")

        async def ended() -> bool:
            s = await rig.sweep("again")
            assert s.status.best is not None and s.status.best.by_throughput == 1, s.status.best
            return (s.status.phase, s.status.reason) == ("Failed", "CellNameTaken")

        await eventually(ended, deadline_s=20, message="the earlier result is never this Sweep's best")
        still = await rig.jobs.get(unique, "again-0")
        assert (
            still.metadata.uid == old.metadata.uid
            and still.metadata.owner_references == old.metadata.owner_references
        )


async def _controlled_name(rig: Rig, name: str, sweep: Sweep) -> bool:
    return controlled(await rig.job_or_none(name), sweep)


# -- a Sweep deleted while no controller ran --------------------------------------------------------------


async def test_the_cells_of_a_sweep_deleted_while_no_controller_ran_are_collected_when_one_starts(
    nc: NATS, nats_url: str, unique: str
) -> None:
    """Nothing will ever change these Jobs again (their runs ended), so no event brings their Sweep: the
    controller finds them when it starts leading (resync is 600 s). With no delete seen, every Job named
    as a cell whose controller is a Sweep of that name goes, whatever the uid; nothing else does."""
    rig = Rig(nc, unique)
    labels = {SWEEP_LABEL: "gone", CELL_LABEL: "0"}
    await rig.create_job("gone-0", labels, [ref("gone", "uid-of-the-deleted-sweep")])
    await rig.create_job("gone-1", labels, [ref("gone", "uid-of-the-deleted-sweep", controller=None)])
    await rig.create_job("gone-2", labels)
    async with controller(nats_url, nc):
        await eventually(
            lambda: _absent(rig, "gone-0"), deadline_s=20, message="the deleted Sweep's cell is collected"
        )
        for name in ("gone-1", "gone-2"):
            assert await rig.job_or_none(name) is not None, f"{name} has no Sweep as its controller"


async def _absent(rig: Rig, name: str) -> bool:
    return await rig.job_or_none(name) is None


# -- the index and the phase rule, pure -------------------------------------------------------------------


def _job(
    name: str, rv: int, owners: list[OwnerReference] | None = None, labels: dict[str, str] | None = None
) -> Job:
    meta = ObjectMeta(
        name=name,
        namespace="ns",
        uid=f"uid-{name}",
        resource_version=str(rv),
        labels=labels or {},
        owner_references=owners or [],
    )
    return Job(metadata=meta)


def test_a_cells_name_is_the_sweep_name_and_a_plain_decimal_index() -> None:
    assert slot_of("lr-0") == ("lr", 0)
    assert slot_of("a-1-12") == ("a-1", 12)
    for name in ("lr", "lr-", "-3", "lr-01", "lr-x", "lr-\u0663"):
        assert slot_of(name) is None, name


def _views() -> tuple[Informer[Sweep], Informer[Job], SweepReconciler]:
    """The service's informers, never connected (only their views are used), and the reconciler's mapper
    over them."""
    sweeps = Informer(ObjectStore(NATS(), "sweeps", Sweep), name="sweeps")
    jobs = Informer(ObjectStore(NATS(), "jobs", Job), indexers={SLOTS: by_slot, CELLS: by_cell}, name="jobs")
    return sweeps, jobs, SweepReconciler(NATS(), sweeps, jobs)


def test_the_index_counts_only_jobs_whose_controller_reference_carries_the_uid() -> None:
    sweeps, jobs, rec = _views()
    woken: list[tuple[str, str]] = []
    jobs.add_handler(lambda e: woken.extend(rec.wakes(e)))  # as the controller's watches() calls it
    labels = {SWEEP_LABEL: "s", CELL_LABEL: "0"}
    jobs.apply(_job("s-0", 1, [ref("s", "U")], labels))  # the cell
    jobs.apply(_job("s-1", 2, [ref("s", "U", controller=None)], labels))  # a plain reference
    jobs.apply(_job("s-2", 3, [ref("s", "OLD")], labels))  # an earlier Sweep's
    jobs.apply(_job("s-3", 4, [ref("s", "U", kind="Workflow")]))  # another kind's, same uid
    jobs.apply(_job("s-4", 5, [ref("t", "U")]))  # a Sweep of another name, same uid
    jobs.apply(_job("rogue", 6, [ref("s", "U")], labels))  # no cell's name: never in the slot
    jobs.apply(_job("s-5", 7))  # nothing at all: in the slot (the name is taken), wakes nobody
    key = ("ns", "s")
    assert set(owned(jobs, key, "U")) == {"s-0"}
    assert set(taken(jobs, key, "U")) == {"s-1", "s-2", "s-3", "s-4", "s-5"}
    assert set(owned(jobs, key, "OLD")) == {"s-2"}, "the uid decides, never the labels"
    assert owned(jobs, key, None) == {}
    assert sorted(j.metadata.name or "" for j in dependents(jobs, key)) == ["s-0", "s-2"]
    assert woken == [key] * 4, "a Job that claims a Sweep (label, reference) wakes it; s-3, s-5 do not"
    sweeps.apply(_sweep())  # now a Sweep the controller knows
    jobs.apply(_job("s-5", 8), deleted=True)
    assert woken[-1] == key and "s-5" not in taken(jobs, key, "U"), "a freed name wakes a known Sweep"
    jobs.apply(_job("s-0", 0, [ref("s", "OTHER")]))  # an older revision never wins
    assert set(owned(jobs, key, "U")) == {"s-0"} and owned(jobs, key, "OTHER") == {}


def test_a_job_whose_controller_changes_moves_between_the_sweeps_it_counts_for() -> None:
    """The indexes follow a change of the controller reference (a cell orphaned, a name reused)."""
    _, jobs, rec = _views()
    key = ("ns", "s")
    jobs.apply(_job("s-0", 1, [ref("s", "U")]))
    jobs.apply(_job("s-0", 2))  # orphaned (propagationPolicy=Orphan removes the reference)
    assert owned(jobs, key, "U") == {} and set(taken(jobs, key, "U")) == {"s-0"}
    assert dependents(jobs, key) == [], "an orphan is never collected"
    jobs.apply(_job("s-0", 3, [ref("s", "V")]))
    assert set(owned(jobs, key, "V")) == {"s-0"} and set(taken(jobs, key, "U")) == {"s-0"}
    jobs.apply(_job("s-0", 4, [ref("s", "V")]), deleted=True)
    assert jobs.by_index(SLOTS, "ns/s") == [] and jobs.index_values(CELLS) == []
    assert rec.wakes(Event("ADDED", _job("x-1", 5), 5)) == [], "no claim, and a Sweep nobody knows"


def _rows(*phases: str) -> list[SweepCell]:
    return [
        SweepCell(index=i, repetition=0, phase=p, object=None if p == "Pending" else f"s-{i}")
        for i, p in enumerate(phases)
    ]


def _sweep(state: str = "Running") -> Sweep:
    spec = msgspec.convert({"template": {"spec": {"image": "x"}}, "state": state}, SweepSpec)
    return Sweep(metadata=ObjectMeta(name="s", namespace="ns"), spec=spec)


def test_a_taken_cell_ends_the_sweep_failed_once_every_other_cell_has_ended() -> None:
    taken = {1: _job("s-1", 1)}
    assert _phase(_sweep(), _rows("Succeeded", "Pending", "Running"), taken)[:2] == ("Running", None)
    phase, reason, message = _phase(_sweep(), _rows("Succeeded", "Pending", "Failed"), taken)
    assert (phase, reason) == ("Failed", "CellNameTaken")
    assert "1 of 3 cells not created" in message and "1 succeeded, 1 failed" in message and FIX in message
    assert _phase(_sweep(), _rows("Pending"), {0: _job("s-0", 1)})[:2] == ("Failed", "CellNameTaken")
    assert _phase(_sweep("Cancelled"), _rows("Succeeded", "Pending"), taken)[:2] == ("Cancelled", "Cancelled")
    assert _phase(_sweep("Suspended"), _rows("Succeeded", "Pending"), taken)[:2] == ("Suspended", "Suspended")
    assert _phase(_sweep(), _rows("Succeeded", "Succeeded"))[:2] == ("Succeeded", "CellsSucceeded")


def test_cell_name_taken_is_a_registered_reason() -> None:
    assert REASONS["CellNameTaken"].http_status == 409 and REASONS["CellNameTaken"].k8s_reason == "Conflict"
