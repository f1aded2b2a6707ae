"""The simulated fleet (issue #5): many fake node agents in one process, against a real nats-server.

Each test runs its own fleet, named after the ``unique`` token (its nodes, durable consumers and Node
records are its own) in namespace ``unique`` (its reports are its own), and deletes what it registered.
The scheduler test runs the real scheduler service in-process on a fresh nats-server of its own, since
the scheduler takes every Job and every Node in sight. Nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from nodus_agent.attemptdir import RUNNING, Record
from nodus_agent.journaling import Entry, Journal
from nodus_agent.running import AGENT_RESTARTED, STOPPED_BEFORE_START
from nodus_agent.simulating import (
    ASSIGNMENTS,
    LABEL_SIMULATED,
    LOST_ON_REVIVE,
    FleetSettings,
    SimulatedFleet,
    main,
    node_name,
    plan_run,
    run_rng,
    shape_of,
)
from nodus_kit import declaring, messaging
from nodus_kit.connecting import connect
from nodus_kit.selecting import Selector
from nodus_kit.servicing import Settings
from nodus_kit.storing import ObjectStore
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import EnvVar, Job, JobSpec
from nodus_schema.messages import (
    AttemptFinished,
    AttemptProgress,
    AttemptStarted,
    NodeBeat,
    Report,
    StartAttempt,
    StopAttempt,
    StopReason,
    beat_subject,
)
from nodus_schema.meta import ObjectMeta, parse_time
from nodus_schema.nodes import Node
from nodus_testing.natsserver import NatsServer
from nodus_testing.waiting import eventually

MakeFleet = Callable[..., Awaitable[SimulatedFleet]]


# -- harness ----------------------------------------------------------------------------------------------
@dataclass
class Reports:
    """Every report of one namespace the stream stored (an ordered consumer from the first message)."""

    items: list[Report] = field(default_factory=list)
    decoder: msgspec.json.Decoder[Report] = field(default_factory=lambda: msgspec.json.Decoder(Report))

    async def on_msg(self, msg: Msg) -> None:
        self.items.append(self.decoder.decode(msg.data))

    def of(self, kind: type[Any], attempt: str) -> list[Any]:
        return [r for r in self.items if isinstance(r, kind) and r.attempt == attempt]

    async def finished(self, attempt: str, deadline_s: float = 10.0) -> AttemptFinished:
        found = await eventually(
            lambda: self.of(AttemptFinished, attempt), deadline_s, message=f"{attempt} never finished"
        )
        return found[0]  # type: ignore[no-any-return]


@pytest_asyncio.fixture
async def reports(nc: NATS, unique: str) -> AsyncIterator[Reports]:
    got = Reports()
    sub: Subscription = await nc.jetstream().subscribe(
        f"nodus.report.*.{unique}.>",
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        cb=got.on_msg,
    )
    yield got
    await sub.unsubscribe()


@contextlib.asynccontextmanager
async def fleets(nc: NATS, fleet: str, workdir: Path) -> AsyncIterator[MakeFleet]:
    """Start fleets named ``fleet``; on the way out each is stopped and its records deleted."""
    made: list[SimulatedFleet] = []

    async def make(**knobs: Any) -> SimulatedFleet:
        defaults: dict[str, Any] = {"nodes": 2, "heartbeat_s": 0.5, "progress_s": 0.0, "workdir": workdir}
        # The records refreshed at each beat unless a test says otherwise (the beats between: ADR-0042).
        defaults["record_s"] = knobs.get("heartbeat_s", defaults["heartbeat_s"])
        simulated = await SimulatedFleet(nc, FleetSettings(fleet=fleet, **{**defaults, **knobs})).start()
        made.append(simulated)
        return simulated

    try:
        yield make
    finally:
        for simulated in made:
            if simulated.registered:
                await simulated.stop()
            await simulated.forget()


@pytest_asyncio.fixture
async def make_fleet(nc: NATS, unique: str, tmp_path: Path) -> AsyncIterator[MakeFleet]:
    """``await make_fleet(nodes=..., **FleetSettings knobs)``: started, stopped and forgotten at the end."""
    async with fleets(nc, unique, tmp_path / "fleet") as make:
        yield make


def start_msg(ns: str, node: str, attempt: str, seconds: str = "30", **fields: Any) -> StartAttempt:
    env = [EnvVar(name="NODUS_SIM_SECONDS", value=seconds), EnvVar(name="NODUS_SIM_SIGMA", value="0")]
    base: dict[str, Any] = {"job": "train", "index": 0, "attempt_no": 1, "env": env}
    return StartAttempt(**{**base, **fields}, namespace=ns, attempt=attempt, node=node)


async def assign(nc: NATS, node: str, msg: StartAttempt | StopAttempt, msg_id: str) -> int:
    ack = await messaging.publish(nc.jetstream(), f"nodus.assign.{node}", msg, msg_id=msg_id)
    return int(ack.seq)


async def consumed(nc: NATS, durable: str, seq: int) -> None:
    """Until the fleet has answered every assignment up to stream sequence ``seq``."""

    async def done() -> bool:
        info = await nc.jetstream().consumer_info(ASSIGNMENTS, durable)
        return int(info.delivered.stream_seq or 0) >= seq and info.num_ack_pending == 0

    await eventually(done, message=f"assignment {seq} was never acknowledged")


# -- sampling (pure) --------------------------------------------------------------------------------------
def test_offering_names_give_the_node_shape() -> None:
    h100 = shape_of("h100-sxm-80g-x8-us")
    assert (h100.variant, h100.gpus, h100.region_class, h100.memory) == ("H100-SXM-80G", 8, "us", "80Gi")
    l4 = shape_of("l4-x1-eu")
    assert (l4.variant, l4.gpus, l4.region_class, l4.memory) == ("L4", 1, "eu", "24Gi")
    assert h100.speed == 24 * l4.speed  # 8 GPUs, each 3x an L4
    with pytest.raises(ValueError, match="does not follow"):
        shape_of("big-gpu")


def test_samples_are_a_function_of_the_seed_and_the_attempt() -> None:
    cfg = FleetSettings(median_s=10.0, sigma=0.5)
    shape = shape_of("l4-x1-us")

    def plan(seed: int, index: int, attempt: str = "a") -> Any:
        msg = StartAttempt(namespace="ns", job="j", attempt=attempt, index=index, attempt_no=1, node="n")
        return plan_run(msg, shape, cfg, run_rng(seed, msg))

    # The attempt's name carries the Job's uid: it must not change the sample (repeatable across runs).
    assert plan(1, 0, "j-1234abcd-0-a1") == plan(1, 0, "j-feedbeef-0-a1")
    runs = [plan(1, i) for i in range(200)]
    assert runs != [plan(2, i) for i in range(200)]
    seconds = sorted(r.seconds for r in runs)
    assert 7.0 < seconds[100] < 14.0  # the median, give or take the sample
    assert all(r.reason == "Completed" and r.exit_code == 0 for r in runs)
    for r in runs:  # decimal strings, exact, around 100 units/s for an L4
        assert r.units_per_second == Decimal(str(r.units_per_second)) and 80 < r.units_per_second < 125


def test_the_job_env_sets_time_exit_failures_and_throughput() -> None:
    cfg = FleetSettings(median_s=10.0, sigma=0.5)
    shape = shape_of("h100-sxm-80g-x1-us")

    def plan(*env: tuple[str, str], attempt_no: int = 1, timeout: int | None = None) -> Any:
        msg = StartAttempt(
            namespace="ns", job="j", attempt="a", index=0, attempt_no=attempt_no, node="n",
            env=[EnvVar(name=k, value=v) for k, v in env], timeout_seconds=timeout,
        )  # fmt: skip
        return plan_run(msg, shape, cfg, random.Random(7))

    fixed = plan(("NODUS_SIM_SECONDS", "2.5"), ("NODUS_SIM_SIGMA", "0"))
    assert (fixed.seconds, fixed.reason, fixed.exit_code) == (2.5, "Completed", 0)
    failed = plan(("NODUS_SIM_EXIT", "3"))
    assert (failed.reason, failed.exit_code, failed.message) == ("Error", 3, "the program exited with code 3")
    assert plan(("NODUS_SIM_FAILURE_RATE", "1")).exit_code == 1
    assert plan(("NODUS_SIM_FAILURE_RATE", "0"), ("NODUS_SIM_EXIT", "3")).exit_code == 0
    assert plan(("NODUS_SIM_FAIL_ATTEMPTS", "1")).exit_code == 1
    assert plan(("NODUS_SIM_FAIL_ATTEMPTS", "1"), attempt_no=2).exit_code == 0
    late = plan(("NODUS_SIM_SECONDS", "60"), ("NODUS_SIM_SIGMA", "0"), timeout=5)
    assert (late.seconds, late.reason, late.exit_code) == (5.0, "DeadlineExceeded", 143)
    rate = plan(("NODUS_SIM_UNITS_PER_SECOND", "812.5")).units_per_second
    assert rate is not None and abs(rate - Decimal("812.5")) < 100
    bad = plan(("NODUS_SIM_SECONDS", "soon"))
    assert (bad.reason, bad.exit_code) == ("Error", None) and "NODUS_SIM_SECONDS='soon'" in (
        bad.message or ""
    )
    # The same draws whatever the knobs: an exit override does not shift the sampled time.
    assert plan(("NODUS_SIM_EXIT", "3")).seconds == plan().seconds


def test_the_command_line_refuses_bad_knobs_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--nodes", "10", "--offerings", "big-gpu"])
    assert "does not follow" in capsys.readouterr().err


# -- registration and heartbeats --------------------------------------------------------------------------
async def test_200_nodes_register_ready_and_heartbeat(nc: NATS, unique: str, make_fleet: MakeFleet) -> None:
    fleet = await make_fleet(
        nodes=200, offerings=("h100-sxm-80g-x8-us", "l4-x1-us"), pool="sims", heartbeat_s=1.0, chunk=64
    )
    store = ObjectStore(nc, "nodes", Node)

    async def listed() -> list[Node]:
        return (await store.list(selector=Selector.equals({LABEL_SIMULATED: unique}))).items

    nodes = {n.metadata.name: n for n in await listed()}
    assert sorted(nodes) == sorted(node_name(unique, i) for i in range(200))
    for i in (0, 1):
        node = nodes[node_name(unique, i)]
        offering, gpus, variant = [("h100-sxm-80g-x8-us", 8, "H100-SXM-80G"), ("l4-x1-us", 1, "L4")][i]
        assert (node.spec.offering, node.spec.region_class, node.spec.pool) == (offering, "us", "sims")
        assert node.status.phase == "Ready" and node.status.fake_gpus is True
        assert [g.variant for g in node.status.gpus] == [variant] * gpus
        assert node.metadata.labels["nodus.dev/offering"] == offering
    # Four durable consumers (64 + 64 + 64 + 8 nodes), each filtering its nodes' assignment subjects.
    sizes = []
    for chunk in fleet.chunks:
        info = await nc.jetstream().consumer_info(ASSIGNMENTS, chunk.durable)
        sizes.append(len(info.config.filter_subjects or []))
    assert sizes == [64, 64, 64, 8]

    first = {name: parse_time(n.status.last_heartbeat_time or "") for name, n in nodes.items()}

    async def all_beat_again() -> bool:
        now = await listed()
        return len(now) == 200 and all(
            n.status.phase == "Ready"
            and parse_time(n.status.last_heartbeat_time or "") > first[n.metadata.name]
            for n in now
        )

    await eventually(all_beat_again, deadline_s=8, interval_s=0.25, message="not every node heartbeat")
    assert fleet.stats["heartbeat_failures"] == 0


async def test_between_record_refreshes_each_node_beats_on_the_bus(
    nc: NATS, unique: str, make_fleet: MakeFleet
) -> None:
    # ADR-0042: a beat is a core message on nodus.beat.<node>; the record is written every record_s.
    fleet = await make_fleet(nodes=10, heartbeat_s=0.2, record_s=600)
    store = ObjectStore(nc, "nodes", Node)
    revisions = {name: (await store.get(None, name)).metadata.resource_version for name in fleet.nodes}
    heard: dict[str, list[int]] = {name: [] for name in fleet.nodes}

    async def on_beat(msg: Msg) -> None:
        name = msg.subject.removeprefix("nodus.beat.")
        if name in heard:
            heard[name].append(msgspec.json.decode(msg.data, type=NodeBeat).time_ms)

    sub = await nc.subscribe(beat_subject("*"), cb=on_beat)
    try:
        await eventually(
            lambda: all(len(times) >= 5 for times in heard.values()),
            deadline_s=10,
            message="not every node beat five times on the bus",
        )
    finally:
        await sub.unsubscribe()
    assert all(times == sorted(times) for times in heard.values())
    # Five beats each and at most one record write each (its first refresh falls somewhere in 600 s):
    # a beat that wrote the record would have made five.
    changed = [
        name
        for name in fleet.nodes
        if (await store.get(None, name)).metadata.resource_version != revisions[name]
    ]
    assert len(changed) <= 2
    assert fleet.stats["heartbeat_failures"] == 0


# -- runs -------------------------------------------------------------------------------------------------
async def test_a_run_reports_started_progress_and_finished_with_throughput(
    nc: NATS, unique: str, make_fleet: MakeFleet, reports: Reports
) -> None:
    fleet = await make_fleet(progress_s=0.1)
    node = node_name(unique, 0)
    await assign(nc, node, start_msg(unique, node, "run-1", seconds="0.5"), f"{unique}/run-1:start")
    done = await reports.finished("run-1")
    assert (done.reason, done.exit_code, done.node, done.message) == ("Completed", 0, node, None)
    assert done.wall_millis == 500
    assert len(reports.of(AttemptStarted, "run-1")) == 1
    progress = reports.of(AttemptProgress, "run-1")
    assert progress and all(Decimal(p.units_per_second) > 0 for p in progress)
    assert done.units_per_second is not None and Decimal(done.units_per_second) > 0
    assert "E" not in done.units_per_second  # a canonical decimal string, as the real agent sends
    assert fleet.stats["finished:Completed"] == 1


async def test_a_redelivered_start_never_runs_twice(
    nc: NATS, unique: str, make_fleet: MakeFleet, reports: Reports
) -> None:
    fleet = await make_fleet()
    node, durable = node_name(unique, 1), f"simfleet-{unique}-0"
    msg = start_msg(unique, node, "run-2", seconds="0.3")
    await assign(nc, node, msg, "first")
    await eventually(lambda: reports.of(AttemptStarted, "run-2"), message="never started")
    # The same StartAttempt again under another id (a re-publish after the stream's duplicate window),
    # while it runs and after it finished: the journal, not the message, decides.
    await consumed(nc, durable, await assign(nc, node, msg, "again-while-running"))
    assert (fleet.stats["started"], fleet.stats["duplicate"]) == (1, 1)
    first = await reports.finished("run-2")
    await consumed(nc, durable, await assign(nc, node, msg, "again-when-finished"))
    assert (fleet.stats["started"], fleet.stats["resent"]) == (1, 1)
    assert fleet.stats["finished:Completed"] == 1 and reports.of(AttemptFinished, "run-2") == [first]


async def test_a_fleet_restarted_on_its_journal_reports_left_behind_runs_lost(
    nc: NATS, unique: str, make_fleet: MakeFleet, reports: Reports
) -> None:
    fleet = await make_fleet()
    node = node_name(unique, 0)
    msg = start_msg(unique, node, "run-3", seconds="60")
    await assign(nc, node, msg, "start-3")
    await eventually(lambda: reports.of(AttemptStarted, "run-3"), message="never started")
    await fleet.halt()  # as SIGKILL: nothing reported
    again = await make_fleet()  # same name, same journal
    lost = await reports.finished("run-3")
    assert (lost.reason, lost.exit_code, lost.message) == ("Lost", None, AGENT_RESTARTED)
    await consumed(nc, f"simfleet-{unique}-0", await assign(nc, node, msg, "start-3-again"))
    assert again.stats["started"] == 0 and again.stats["resent"] == 1


async def test_stop_attempt_stops_a_run(
    nc: NATS, unique: str, make_fleet: MakeFleet, reports: Reports
) -> None:
    fleet = await make_fleet()
    node = node_name(unique, 0)
    await assign(nc, node, start_msg(unique, node, "run-4", seconds="60"), "start-4")
    await eventually(lambda: reports.of(AttemptStarted, "run-4"), message="never started")
    await assign(
        nc, node, StopAttempt(namespace=unique, attempt="run-4", reason=StopReason.JOB_DELETED), "stop-4"
    )
    stopped = await reports.finished("run-4")
    assert (stopped.reason, stopped.exit_code, stopped.message) == (
        "Stopped",
        143,
        "asked to stop (JobDeleted)",
    )
    assert stopped.wall_millis < 60_000
    # A stop for an attempt never seen: Stopped at once, and a late start does not run it.
    await assign(
        nc, node, StopAttempt(namespace=unique, attempt="run-5", reason=StopReason.JOB_DELETED), "stop-5"
    )
    never = await reports.finished("run-5")
    assert (never.reason, never.message) == ("Stopped", STOPPED_BEFORE_START)
    seq = await assign(nc, node, start_msg(unique, node, "run-5"), "start-5")
    await consumed(nc, f"simfleet-{unique}-0", seq)
    assert fleet.stats["started"] == 1 and reports.of(AttemptStarted, "run-5") == []


async def test_a_vanished_node_stops_heartbeating_and_reporting(
    nc: NATS, unique: str, make_fleet: MakeFleet, reports: Reports
) -> None:
    fleet = await make_fleet(nodes=2, heartbeat_s=0.25)
    gone, alive = node_name(unique, 0), node_name(unique, 1)
    await assign(nc, gone, start_msg(unique, gone, "run-6", seconds="60"), "start-6")
    await eventually(lambda: reports.of(AttemptStarted, "run-6"), message="never started")
    await fleet.vanish(gone)
    store = ObjectStore(nc, "nodes", Node)
    last = (await store.get(None, gone)).status.last_heartbeat_time or ""

    async def the_other_beat_on() -> bool:
        beat = (await store.get(None, alive)).status.last_heartbeat_time or ""
        return (parse_time(beat) - parse_time(last)).total_seconds() >= 2  # whole seconds: > one beat

    await eventually(the_other_beat_on, deadline_s=6, interval_s=0.1, message="the live node stopped too")
    assert (await store.get(None, gone)).status.last_heartbeat_time == last
    assert reports.of(AttemptFinished, "run-6") == []
    # Its assignments wait in the stream: not run, not acknowledged.
    await assign(nc, gone, start_msg(unique, gone, "run-7"), "start-7")
    await eventually(lambda: fleet.stats["started"] == 1 and not reports.of(AttemptStarted, "run-7"))
    # Back again (an agent restart on the same host): the run it lost is reported Lost.
    await fleet.revive(gone)
    lost = await reports.finished("run-6")
    assert (lost.reason, lost.message) == ("Lost", LOST_ON_REVIVE)


# -- consuming: the kit's Consumer -----------------------------------------------------------------------
async def test_assignments_no_node_of_the_fleet_can_run_are_dead_lettered(
    nc: NATS, unique: str, make_fleet: MakeFleet, reports: Reports
) -> None:
    fleet = await make_fleet()
    node, durable = node_name(unique, 0), f"simfleet-{unique}-0"
    letters = await nc.subscribe(f"nodus.dead.{ASSIGNMENTS}.{durable}")
    elsewhere = msgspec.structs.replace(start_msg(unique, node, "run-8"), node="somewhere-else")
    await assign(nc, node, elsewhere, "start-8")
    await assign(nc, node, start_msg(unique, node, "Not_A_Label"), "start-9")
    reasons = [(await letters.next_msg(timeout=10)).headers or {} for _ in range(2)]
    assert sorted(r[messaging.DEAD_REASON] for r in reasons) == [
        "StartAttempt for node 'somewhere-else' reached node " + repr(node),
        "attempt 'Not_A_Label' is not a DNS label",
    ]
    assert {r[messaging.DEAD_SUBJECT] for r in reasons} == {f"nodus.assign.{node}"}
    await letters.unsubscribe()
    # Dead letters are terminated: nothing waits in the stream, nothing ran.
    await consumed(nc, durable, await assign(nc, node, start_msg(unique, node, "run-10", "0.1"), "s-10"))
    assert (fleet.stats["dead"], fleet.stats["started"]) == (2, 1)
    assert reports.of(AttemptStarted, "run-8") == []


async def test_a_journal_that_cannot_be_written_stops_the_fleet_taking_work(
    nc: NATS, unique: str, tmp_path: Path, reports: Reports, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[BaseException] = []
    settings = FleetSettings(fleet=unique, nodes=1, heartbeat_s=0.5, progress_s=0.0, workdir=tmp_path)
    fleet = await SimulatedFleet(nc, settings, on_fatal=failures.append).start()
    try:

        async def full_disk() -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(fleet.journal, "sync", full_disk)
        node, durable = node_name(unique, 0), f"simfleet-{unique}-0"
        seq = await assign(nc, node, start_msg(unique, node, "run-11"), "start-11")
        await eventually(lambda: failures, message="the fleet never gave up on its journal")
        assert isinstance(failures[0], OSError)
        # Not recorded, so neither reported nor acknowledged: it comes again, to a fleet that can record it.
        info = await nc.jetstream().consumer_info(ASSIGNMENTS, durable)
        assert int(info.ack_floor.stream_seq or 0) < seq
        assert reports.of(AttemptStarted, "run-11") == []
    finally:
        await fleet.stop(forget=True)


def test_handlers_side_by_side_share_one_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Consumer runs a fetched batch's handlers side by side; their records reach disk together."""
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def counted(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counted)
    journal = Journal(tmp_path / "journal.jsonl")
    journal.load()
    fsyncs.clear()  # the compaction's own

    async def handle(i: int) -> None:
        journal.append(Entry(namespace="ns", attempt=f"a{i}", node="n", record=Record(phase=RUNNING)))
        await journal.sync()

    async def batches() -> None:
        for _ in range(3):
            await asyncio.gather(*(handle(i) for i in range(64)))

    asyncio.run(batches())
    journal.close()
    assert len(fsyncs) == 3
    assert len(Journal(tmp_path / "journal.jsonl").load()) == 64


# -- with the real scheduler ------------------------------------------------------------------------------
@pytest.mark.slow
async def test_a_job_of_40_indexes_runs_to_exact_counts_on_simulated_nodes(
    unique: str, tmp_path: Path
) -> None:
    from nodus_scheduler.service import SchedulerService  # the real one, in this process

    with NatsServer() as server:  # the scheduler takes every Job and Node in sight: a server of its own
        nc = await connect(server.url, "test", nkey_seed=server.harness_seed)
        await declaring.ensure(nc.jetstream())
        env = {
            "NODUS_NATS_URL": server.url,
            "NODUS_NATS_NKEY_SEED": str(server.harness_seed),
            "NODUS_REPLICA": unique,
            "NODUS_RESYNC_S": "2",
            "NODUS_FUNDING": "off",  # no billing here
        }
        scheduler = SchedulerService(Settings.from_env("nodus-scheduler", env))
        task = asyncio.create_task(scheduler.run())
        try:
            async with fleets(nc, unique, tmp_path / "fleet") as make:
                fleet = await make(nodes=24, offerings=("l4-x1-us",), heartbeat_s=1.0, progress_s=0.2)
                body = {
                    "image": "busybox",
                    "command": ["true"],
                    "resources": {"gpu": "L4:1"},
                    "completions": 40,
                    "parallelism": 20,
                    "env": [
                        {"name": "NODUS_SIM_SECONDS", "value": "0.4"},
                        {"name": "NODUS_SIM_SIGMA", "value": "0.3"},
                    ],
                }
                jobs = ObjectStore(nc, "jobs", Job)
                job = Job(
                    metadata=ObjectMeta(name="sim", namespace=unique), spec=msgspec.convert(body, JobSpec)
                )
                await jobs.create(default_job(job))

                async def succeeded() -> Job:
                    if task.done():
                        task.result()  # a crashed scheduler shows its traceback, not a timeout
                    got = await jobs.get(unique, "sim")
                    assert got.status.phase == "Succeeded", (got.status.phase, got.status.message)
                    return got

                done = await eventually(
                    succeeded, deadline_s=40, interval_s=0.1, message="the Job never ended"
                )
                st = done.status
                assert (st.succeeded, st.failed, st.completed_indexes) == (40, 0, "0-39")
                assert (fleet.stats["started"], fleet.stats["finished:Completed"]) == (40, 40)
                assert fleet.stats["duplicate"] == 0 and fleet.stats["dead"] == 0
                assert 1 < fleet.peak_runs <= 20
                assert st.units_per_second is not None and 80 < Decimal(st.units_per_second) < 125
        finally:
            scheduler.stopping.set()
            await asyncio.wait_for(task, 20)
            await nc.close()
