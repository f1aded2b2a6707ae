"""Gangs (ADR-0016) against the real scheduler service and a scripted fleet on its own nats-server: placed
together or not at all, in one network class; assembled within startupTimeout or placed again; restarted
together when a member fails or is lost; launcher variables in every member's StartAttempt."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodus_scheduler.capacity import CapacityIndex
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.ganging import Shape, choose_gang, gang_attempts, shape_of
from nodus_scheduler.ruling import summarize_gangs
from nodus_schema.attempts import GANG_LABEL, RANK_LABEL, Attempt, AttemptSpec, AttemptStatus
from nodus_schema.jobs import Distributed, JobSpec, Resources
from nodus_schema.messages import StartAttempt
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow

HANG: tuple[float | None, int] = (None, 0)  # runs until stopped
QUICK: tuple[float | None, int] = (0.2, 0)


def gang(nodes: int = 2, **distributed: Any) -> dict[str, Any]:
    return {"distributed": {"nodes": nodes, **distributed}}


async def phase(rig: Any, name: str, want: str, deadline_s: float = 20.0) -> Any:
    async def check() -> Any:
        job = await rig.job(name)
        assert job.status.phase == want, (job.status.phase, job.status.reason, job.status.message)
        return job

    return await eventually(check, deadline_s=deadline_s, message=f"{name} never became {want}")


async def unschedulable(rig: Any, name: str) -> Any:
    async def check() -> Any:
        job = await rig.job(name)
        assert (job.status.phase, job.status.reason) == ("Queued", "Unschedulable"), job.status
        return job

    return await eventually(check, message=f"{name} never said why it waits")


async def members(rig: Any, name: str) -> list[Attempt]:
    return sorted(await rig.attempts_of(name), key=lambda a: (a.spec.attempt, a.spec.rank))


def running_gang(rig: Any, job: str, number: int, size: int = 2) -> Callable[[], list[StartAttempt]]:
    """A predicate: every member of gang attempt ``number`` of ``job`` runs on the fleet, rank order."""

    def check() -> list[StartAttempt]:
        runs = [s for s in rig.fleet.running.values() if s.job == job and s.attempt_no == number]
        return sorted(runs, key=lambda s: s.node_rank or 0) if len(runs) == size else []

    return check


# -- placement ---------------------------------------------------------------------------------------------


async def test_a_gang_is_placed_together_with_torchrun_variables(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: QUICK, nodes=0) as rig:
        await rig.fleet.add_nodes(3, offering="l4-x4-us")
        await rig.submit("tr", resources={"gpu": "L4:4"}, **gang(2, launcher="Torchrun"))
        job = await phase(rig, "tr", "Succeeded")
        assert (job.status.topology, job.status.succeeded, job.status.attempts) == ("2x4", 1, 1)
        a0, a1 = await members(rig, "tr")
        # One Attempt per member, named and labelled as one gang attempt, each with its rank.
        gang_name = a0.metadata.labels[GANG_LABEL]
        assert a1.metadata.labels[GANG_LABEL] == gang_name and gang_name.endswith("-0-a1")
        assert (a0.metadata.name, a1.metadata.name) == (f"{gang_name}-m0", f"{gang_name}-m1")
        assert [(a.spec.rank, a.metadata.labels[RANK_LABEL], a.spec.gang_size) for a in (a0, a1)] == [
            (0, "0", 2),
            (1, "1", 2),
        ]
        assert a0.spec.node != a1.spec.node
        assert a0.spec.master_node == a1.spec.master_node == a0.spec.node
        assert all(a.status.phase == "Succeeded" for a in (a0, a1))
        # The launcher's view in each member's StartAttempt: node rank, sizes, the master (rank 0's node).
        s0, s1 = sorted(rig.fleet.started, key=lambda s: s.node_rank or 0)
        for s, node_rank in ((s0, 0), (s1, 1)):
            assert (s.gang, s.node_rank, s.nodes, s.gpus_per_node) == (gang_name, node_rank, 2, 4)
            assert (s.rank, s.world_size, s.launcher) == (node_rank * 4, 8, "Torchrun")
            assert (s.master_addr, s.master_port) == (a0.spec.node, 29500)
        assert rig.fleet.overlaps == []


async def test_a_gang_waits_whole_when_only_one_node_fits(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: QUICK, nodes=1) as rig:
        await rig.submit("two", **gang(2))
        job = await unschedulable(rig, "two")
        message = job.status.message or ""
        assert message.startswith("gang of 2 nodes (Colocated): only 1/2 members fit together"), message
        assert await rig.attempts_of("two") == []  # nothing was created for half a gang
        # The node it tried is not left reserved: a plain Job runs on it.
        await rig.submit("one")
        await phase(rig, "one", "Succeeded")
        assert (await rig.job("two")).status.phase == "Queued"


async def test_colocated_never_spans_providers_or_regions(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: QUICK, nodes=0) as rig:
        # One region class (us), two providers: vela sells H100 SXM, atlas H100 PCIe.
        await rig.fleet.add_nodes(1, prefix="vela", offering="h100-sxm-80g-x1-us")
        await rig.fleet.add_nodes(1, prefix="atlas", offering="h100-pcie-80g-x1-us")
        await rig.submit("colo", resources={"gpu": "H100:1"}, **gang(2, network="Colocated"))
        job = await unschedulable(rig, "colo")
        assert "(Colocated): only 1/2 members fit together" in (job.status.message or "")
        assert "outside vela us" in (job.status.message or "")
        await rig.submit("reg", resources={"gpu": "H100:1"}, **gang(2, network="Regional"))
        await phase(rig, "reg", "Succeeded")
        assert {a.spec.offering for a in await rig.attempts_of("reg")} == {
            "h100-sxm-80g-x1-us",
            "h100-pcie-80g-x1-us",
        }
        # One provider (atlas), two region classes: Regional refuses, Global spans them.
        await rig.fleet.add_nodes(1, prefix="us", offering="l4-x1-us", region="us")
        await rig.fleet.add_nodes(1, prefix="eu", offering="l4-x1-eu", region="eu")
        await rig.submit("reg-l4", **gang(2, network="Regional"))
        job = await unschedulable(rig, "reg-l4")
        assert "(Regional): only 1/2 members fit together, in region us" in (job.status.message or "")
        await rig.submit("glob", **gang(2, network="Global"))
        await phase(rig, "glob", "Succeeded")
        assert {a.spec.region_class for a in await rig.attempts_of("glob")} == {"us", "eu"}
        assert (await rig.job("colo")).status.phase == "Queued"
        assert await rig.attempts_of("colo") == [] and await rig.attempts_of("reg-l4") == []


# -- restart together ----------------------------------------------------------------------------------------


async def test_a_lost_member_restarts_the_whole_gang(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: HANG if s.attempt_no == 1 else QUICK, nodes=4) as rig:
        await rig.submit("lost", backoffLimit=0, **gang(2))
        first = await eventually(running_gang(rig, "lost", 1), message="the first gang never ran")

        async def assembled() -> bool:  # the scheduler has both starts: only an assembled gang restores
            ones = [m for m in await members(rig, "lost") if m.spec.attempt == 1 and m.status.start_time]
            return len(ones) == 2

        await eventually(assembled, message="the scheduler never recorded the first gang's starts")
        rig.fleet.go_silent(first[1].node)  # rank 1's node vanishes
        job = await phase(rig, "lost", "Succeeded", deadline_s=45)
        assert (job.status.failed, job.status.attempts) == (0, 2)  # infrastructure: backoffLimit untouched
        a = await members(rig, "lost")
        assert [(m.spec.attempt, m.spec.rank, m.status.phase, m.status.reason) for m in a] == [
            (1, 0, "Stopped", "Stopped"),  # stopped with its lost peer
            (1, 1, "Lost", "NodeLost"),
            (2, 0, "Succeeded", "Completed"),
            (2, 1, "Succeeded", "Completed"),
        ]
        assert first[1].node not in {m.spec.node for m in a[2:]}
        # The new gang attempt restores, rank for rank, what the assembled one saved.
        second = sorted((s for s in rig.fleet.started if s.attempt_no == 2), key=lambda s: s.node_rank or 0)
        assert [s.restore_from for s in second] == [first[0].attempt, first[1].attempt]
        assert rig.fleet.overlaps == []  # never members of two gang attempts of one index at once


async def test_gang_restarts_count_against_max_attempts(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: HANG, nodes=2) as rig:
        await rig.submit("flaky", recovery={"maxAttempts": 2}, **gang(2))
        for number in (1, 2):
            runs = await eventually(running_gang(rig, "flaky", number), message=f"gang {number} never ran")
            rig.fleet.lose(runs[0].attempt)  # rank 0's agent restarted under it: a loss, not a failure
        job = await phase(rig, "flaky", "Failed")
        assert job.status.reason == "CapacityLost"
        assert "gang lost a member 2 times in a row" in (job.status.message or "")
        assert (job.status.failed, job.status.attempts) == (0, 2)
        assert len(rig.fleet.started) == 4 and rig.fleet.running == {}
        assert rig.fleet.overlaps == []


async def test_a_failed_member_restarts_the_gang_against_backoff_limit(make_rig: Callable[..., Any]) -> None:
    def script(s: StartAttempt) -> tuple[float | None, int]:
        if s.attempt_no == 1:
            return (0.0, 3) if s.node_rank == 1 else HANG  # rank 1 crashes; rank 0 would run on
        return QUICK

    async with make_rig(script, nodes=2) as rig:
        await rig.submit("crash", backoffLimit=1, **gang(2))
        job = await phase(rig, "crash", "Succeeded")
        assert (job.status.failed, job.status.attempts) == (1, 2)  # one gang failure, not one per member
        a = await members(rig, "crash")
        assert [(m.spec.attempt, m.spec.rank, m.status.phase) for m in a] == [
            (1, 0, "Stopped"),
            (1, 1, "Failed"),
            (2, 0, "Succeeded"),
            (2, 1, "Succeeded"),
        ]
        assert rig.fleet.overlaps == []


# -- assembly ------------------------------------------------------------------------------------------------


async def test_a_gang_that_does_not_assemble_is_placed_again(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: HANG if s.attempt_no == 1 else QUICK, nodes=3) as rig:
        rig.fleet.hold = lambda s: s.attempt_no == 1 and s.node_rank == 1  # stuck starting, the first time
        await rig.submit("slow", **gang(2, startupTimeout="2s"))
        job = await phase(rig, "slow", "Succeeded")
        assert (job.status.attempts, job.status.failed) == (2, 0)
        a = await members(rig, "slow")
        assert [(m.spec.attempt, m.status.phase, m.status.ended_by) for m in a] == [
            (1, "Stopped", "AssemblyTimeout"),
            (1, "Stopped", "AssemblyTimeout"),
            (2, "Succeeded", None),
            (2, "Succeeded", None),
        ]
        assert rig.fleet.overlaps == []


async def test_a_gang_fails_after_max_assembly_retries(make_rig: Callable[..., Any]) -> None:
    async with make_rig(lambda s: HANG, nodes=2) as rig:
        rig.fleet.hold = lambda s: s.node_rank == 1  # rank 1 never starts
        await rig.submit("stuck", **gang(2, startupTimeout="1s", maxAssemblyRetries=1))
        job = await phase(rig, "stuck", "Failed")
        assert job.status.reason == "AssemblyTimeout"
        assert "2 times in a row (1 + maxAssemblyRetries 1)" in (job.status.message or "")
        a = await members(rig, "stuck")
        assert [(m.spec.attempt, m.status.phase, m.status.ended_by) for m in a] == [
            (n, "Stopped", "AssemblyTimeout") for n in (1, 1, 2, 2)
        ]
        assert rig.fleet.running == {}


# -- the rules alone (no rig) --------------------------------------------------------------------------------

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def _index(*nodes: tuple[str, str, str]) -> CapacityIndex:
    return CapacityIndex.of(
        [
            Node(
                metadata=ObjectMeta(name=name),
                spec=NodeSpec(offering=offering, region_class=region),
                status=NodeStatus(phase="Ready", last_heartbeat_time=format_time(NOW)),
            )
            for name, offering, region in nodes
        ],
        now=NOW,
    )


def _h100_gang(network: str) -> tuple[JobSpec, Shape]:
    spec = JobSpec(
        image="x", resources=Resources(gpu="H100:1"), distributed=Distributed(nodes=2, network=network)
    )
    shape = shape_of(spec)
    assert shape is not None and shape.nodes == 2
    return spec, shape


def test_choose_gang_sets_aside_a_class_that_cannot_hold_the_gang() -> None:
    # The best node (Balanced: SXM) is alone at its provider; the two PCIe nodes of atlas hold the gang.
    index = _index(
        ("a-vela", "h100-sxm-80g-x1-us", "us"),
        ("b-atlas", "h100-pcie-80g-x1-us", "us"),
        ("c-atlas", "h100-pcie-80g-x1-us", "us"),
    )
    spec, shape = _h100_gang("Colocated")
    book = load_catalog()
    picked = choose_gang(index, spec, book, shape, release=index.mark_free, now=NOW)
    assert not isinstance(picked, str), picked
    assert [p.node.metadata.name for p in picked] == ["b-atlas", "c-atlas"]  # rank 0 first
    assert (index.is_busy("a-vela"), index.is_busy("b-atlas"), index.is_busy("c-atlas")) == (
        False,
        True,
        True,
    )


def test_choose_gang_holds_nothing_when_no_class_fits() -> None:
    index = _index(("a-vela", "h100-sxm-80g-x1-us", "us"), ("b-atlas", "h100-pcie-80g-x1-us", "us"))
    spec, shape = _h100_gang("Colocated")
    why = choose_gang(index, spec, load_catalog(), shape, release=index.mark_free, now=NOW)
    assert isinstance(why, str) and why.startswith("gang of 2 nodes (Colocated): only 1/2 members fit"), why
    assert not index.is_busy("a-vela") and not index.is_busy("b-atlas")
    spec, shape = _h100_gang("Regional")
    picked = choose_gang(index, spec, load_catalog(), shape, release=index.mark_free, now=NOW)
    assert not isinstance(picked, str) and len(picked) == 2


def _member(n: int, rank: int, phase: str, **status: Any) -> Attempt:
    created = format_time(NOW + timedelta(minutes=n))
    return Attempt(
        metadata=ObjectMeta(
            name=f"j-0123abcd-0-a{n}-m{rank}",
            namespace="t",
            creation_timestamp=created,
            labels={GANG_LABEL: f"j-0123abcd-0-a{n}", RANK_LABEL: str(rank)},
        ),
        spec=AttemptSpec(
            job="j",
            index=0,
            attempt=n,
            node=f"n{rank}",
            offering="l4-x1-us",
            region_class="us",
            rate_micros_per_hour=1,
            pricebook_version="v",
            rank=rank,
            gang_size=2,
            master_node="n0",
        ),
        status=AttemptStatus(phase=phase, **status),
    )


def test_a_gang_attempt_counts_once_by_how_it_ended() -> None:
    started = {"start_time": format_time(NOW), "finish_time": format_time(NOW + timedelta(seconds=5))}
    attempts = [
        _member(1, 0, "Failed", **started),  # a crash after a peer's node vanished: the loss's doing
        _member(1, 1, "Lost", **started),
        _member(2, 0, "Failed", **started),
        _member(2, 1, "Failed", **started),  # two members failed: one gang failure
        _member(3, 0, "Stopped", ended_by="AssemblyTimeout"),
        _member(3, 1, "Stopped", ended_by="AssemblyTimeout"),
        _member(4, 0, "Stopped", ended_by="GangIncomplete"),  # its rank 1 was never created
        _member(5, 0, "Running", start_time=format_time(NOW)),
        _member(5, 1, "Pending"),
    ]
    gangs = gang_attempts(attempts, 2)
    assert [g.verdict() for g in gangs] == ["Lost", "Failed", "AssemblyTimeout", "Abandoned", None]
    view = summarize_gangs(attempts, Shape(nodes=2, gpus_per_node=1))
    assert (view.failures, view.lost, view.infra, view.assembly, view.tries) == (1, 1, {0: 1}, {0: 1}, {0: 5})
    assert view.active[0].status.phase == "Pending"  # the Job is Running only once every member runs
    assert view.assembling == {0: (1, 2)}
    late = NOW + timedelta(minutes=5, seconds=901)
    assert gangs[-1].trouble(late, Shape(nodes=2, gpus_per_node=1)) == "AssemblyTimeout"
    assert gangs[-1].trouble(late, Shape(nodes=2, gpus_per_node=1, startup_timeout="20m")) is None
