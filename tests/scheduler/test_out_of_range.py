"""A Job stored with a value outside the admitted ranges (written before admission checked them, or
straight into the store) cannot crash or hang the scheduler's reconcile: the lifecycle reads it within the
ranges (nodus_scheduler.ranging). A ttlSecondsAfterFinished of 2^63 and a timeout of 99999999999999h used
to raise OverflowError on every reconcile of the Job, for ever."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import msgspec
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_kit.storing import ObjectStore
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.expiring import Expirer
from nodus_scheduler.lifecycle import Lifecycle
from nodus_scheduler.ranging import within_ranges
from nodus_scheduler.ruling import next_check
from nodus_scheduler.viewing import World
from nodus_schema.attempts import Attempt
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Distributed, Job, JobSpec, JobStatus, Placement, Recovery, Resources
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.quantities import MAX_INT32
from nodus_testing.waiting import eventually

BIG = 2**63


def stored(namespace: str, name: str, **spec: object) -> Job:
    body = {"image": "x", "command": ["true"], "resources": {"gpu": "L4:1"}, **spec}
    job = default_job(
        Job(metadata=ObjectMeta(name=name, namespace=namespace), spec=msgspec.convert(body, JobSpec))
    )
    return job


@pytest_asyncio.fixture
async def world(nc: NATS) -> AsyncIterator[World]:
    """The scheduler's informers on the session's bus (no controller, no binder: what is looked at is
    the reconcile itself)."""
    w = World(nc, funding=False)
    await w.start()
    yield w
    await w.stop()


@pytest_asyncio.fixture
async def lifecycle(nc: NATS, world: World) -> Lifecycle:
    return Lifecycle(nc, load_catalog(), world)


async def _informed(world: World, job: Job) -> None:
    await eventually(lambda: world.jobs.get(job.metadata.namespace, job.metadata.name or "") is not None)


async def test_a_finished_job_with_a_ttl_of_2_63_is_reconciled_and_kept(
    nc: NATS, unique: str, world: World
) -> None:
    jobs = ObjectStore(nc, "jobs", Job)
    done = format_time(datetime.now(UTC) - timedelta(seconds=5))
    job = stored(unique, "done", ttlSecondsAfterFinished=BIG)
    job = msgspec.structs.replace(job, status=JobStatus(phase="Succeeded", completion_time=done))
    await _informed(world, await jobs.create(job))
    # ttlSecondsAfterFinished is the TTL controller's (nodus_scheduler.expiring)
    expirer = Expirer(nc, world, jobs, ObjectStore(nc, "attempts", Attempt))
    after = await expirer.reconcile((unique, "done"))  # raised OverflowError before
    assert after is not None and MAX_INT32 - 60 < after <= MAX_INT32
    assert (await jobs.get(unique, "done")).spec.ttl_seconds_after_finished == BIG  # the spec is untouched


async def test_a_waiting_job_with_a_timeout_past_a_timedelta_is_reconciled(
    nc: NATS, unique: str, world: World, lifecycle: Lifecycle
) -> None:
    jobs = ObjectStore(nc, "jobs", Job)
    await _informed(
        world,
        await jobs.create(
            stored(unique, "slow", timeout="99999999999999h", placement={"queueTimeout": "9" * 30 + "h"})
        ),
    )
    after = await lifecycle.reconcile((unique, "slow"))  # raised OverflowError before
    assert after is not None and after > 0
    status = (await jobs.get(unique, "slow")).status
    assert status.phase == "Queued"  # waiting for capacity, not failed, and reconciled again later


def test_within_ranges_clamps_what_the_lifecycle_reads_and_keeps_the_rest() -> None:
    job = stored("p", "j")
    assert within_ranges(job) is job  # nothing out of range: the same object
    spec = msgspec.structs.replace(
        job.spec,
        ttl_seconds_after_finished=BIG,
        timeout="99999999999999h",
        completions=BIG,
        parallelism=BIG,
        placement=Placement(queue_timeout="not a duration"),
        recovery=Recovery(min_progress_duration="99999999999999h"),
        distributed=Distributed(nodes=2, startup_timeout="999h"),
        resources=Resources(gpu="L4:1"),
    )
    clamped = within_ranges(msgspec.structs.replace(job, spec=spec)).spec
    assert clamped.ttl_seconds_after_finished == MAX_INT32
    assert clamped.timeout == "596523h14m7s"
    assert (clamped.completions, clamped.parallelism) == (10_000, 256)
    assert clamped.placement is not None and clamped.placement.queue_timeout == "24h"
    assert clamped.recovery is not None and clamped.recovery.min_progress_duration == "596523h14m7s"
    assert clamped.distributed is not None and clamped.distributed.startup_timeout == "1h0m0s"
    unreadable = msgspec.structs.replace(spec, timeout="soon", ttl_seconds_after_finished=-5)
    again = within_ranges(msgspec.structs.replace(job, spec=unreadable)).spec
    assert again.timeout is None and again.ttl_seconds_after_finished == 0


def test_the_next_check_of_a_clamped_finished_job_is_a_finite_timer() -> None:
    job = within_ranges(stored("p", "j", ttlSecondsAfterFinished=BIG))
    status = JobStatus(phase="Succeeded", completion_time=format_time(datetime.now(UTC)))
    assert next_check(job, status, datetime.now(UTC)) == float(MAX_INT32)
