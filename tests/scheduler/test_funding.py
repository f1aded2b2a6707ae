"""Billing and the scheduler together (issue #7, ADR-0024): holds before runs, exact charges, caps that
suspend Jobs and Sweeps with MaxCostReached and resume them when raised, credits that run out.

The rig is the scheduler's (a real nats-server, the real scheduler, a scripted fleet) with the real billing
service in the same process, on short terms: holds fund 4 s ahead, usage is charged every 0.5 s, and a Job
is stopped while its holds still fund 1 s.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nodus_billing.accounting import fold
from nodus_billing.archiving import Archive
from nodus_billing.books import Books
from nodus_billing.holding import encode
from nodus_billing.metering import job_ref
from nodus_billing.standing import Hold
from nodus_kit import messaging
from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import Attempt
from nodus_schema.billing import GRANT_SUBJECT, HOLD_SUBJECT, GrantReply, GrantRequest, HoldReply, HoldRequest
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.ledger import charge_micros
from nodus_schema.messages import AttemptFinished, StartAttempt
from nodus_schema.meta import ObjectMeta, OwnerReference, parse_time
from nodus_schema.quantities import usd_to_micros
from nodus_schema.sweeps import SWEEP_LABEL, Sweep, SweepSpec
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)

TERMS = {
    "NODUS_HOLD_WINDOW_S": "4",
    "NODUS_METER_TICK_S": "0.5",
    "NODUS_STOP_MARGIN_S": "1",
    "NODUS_ORPHAN_HOLD_S": "10",
}
RATE = 790_000  # l4-x1-us, µ$/h


def forever(_: StartAttempt) -> tuple[float | None, int]:
    return (None, 0)


def expected_micros(a: Attempt) -> int:
    """A run's charge, worked out here from its times: whole seconds, one at least, rounded up."""
    created = parse_time(a.metadata.creation_timestamp or "")
    finished = parse_time(a.status.finish_time or "")
    seconds = max(1, int((finished - created).total_seconds()))
    return charge_micros(a.spec.rate_micros_per_hour, seconds * 1000)


async def book_ok(rig: Any, project: str) -> Any:
    state = await Books(rig.nc).read(project)
    assert fold(state.ledger.values()) == state.balances, "the ledger folds to the balances"
    assert sum(state.balances.values()) == 0, "double entry: every move has two sides"
    return state


async def filed_book(rig: Any, project: str) -> Any:
    """The project's book once every settled run is filed out of it (issue #23): no hold left but open
    ones, the ledger folding as ever."""

    async def filed() -> Any:
        state = await book_ok(rig, project)
        assert all(h.status == "Open" for h in state.holds.values()), state.holds
        return state

    # A billing killed after writing the final cost files them once its successor leads (a lease's TTL).
    return await eventually(filed, deadline_s=60, message="the settled runs are filed out of the book")


async def runs_of(rig: Any, project: str, state: Any) -> dict[str, Hold]:
    """Every run's hold: those filed (the history bucket) and those in the book ``state``."""
    return await Archive(rig.nc).runs(project, state)


async def test_a_run_is_held_before_it_starts_and_charged_exactly_once(make_rig: Callable[..., Any]) -> None:
    async with make_rig(funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        await rig.submit("once", completions=3, parallelism=3)

        async def done() -> Job:
            job = await rig.job("once")
            assert job.status.phase == "Succeeded" and job.status.cost and job.status.cost.final
            return job

        job = await eventually(done, deadline_s=30, message="the Job succeeds and its cost is final")
        attempts = await rig.attempts_of("once")
        want = sum(expected_micros(a) for a in attempts)
        assert usd_to_micros(job.status.cost.total_usd or "0") == want
        assert job.status.cost.held_usd == "0.00"
        state = await filed_book(rig, "t")
        ref = job_ref("once", job.metadata.uid)
        holds = await runs_of(rig, "t", state)
        assert {h.job for h in holds.values()} == {ref} and len(holds) == len(attempts)
        assert all(h.status == "Captured" for h in holds.values()), "every hold resolved"
        assert ref not in state.jobs, "filed out of the book, and the final Job's record folded in its totals"
        assert [(r.jobs, sum(r.months.values())) for r in state.forgotten] == [(1, want)]

        # The same finish report delivered three more times (new message ids, past the dedup window):
        # nothing more is charged.
        first = attempts[0]
        report = AttemptFinished(
            namespace="t",
            attempt=first.metadata.name or "",
            node=first.spec.node,
            time=first.status.finish_time or "",
            exit_code=0,
            wall_millis=1,
            reason="Completed",
        )
        js = rig.nc.jetstream()
        for i in range(3):
            await messaging.publish(
                js, f"nodus.report.{first.spec.node}.t.{report.attempt}", report, msg_id=f"again-{i}"
            )
        last = (await js.stream_info("NODUS_REPORTS")).state.last_seq

        async def handled() -> bool:
            info = await js.consumer_info("NODUS_REPORTS", "billing")
            return info.ack_floor.stream_seq >= last and rig.billing.meter.queue.idle()

        await eventually(handled, deadline_s=10, message="billing handled the repeated reports")
        again = await book_ok(rig, "t")
        assert again.balances == state.balances
        job = await rig.job("once")
        assert usd_to_micros(job.status.cost.total_usd or "0") == want


async def test_a_job_at_its_cap_is_suspended_and_resumes_when_the_cap_is_raised(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(forever, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        cap = "0.0015"  # about 7 s at this rate: two holds' worth
        await rig.submit("capped", maxCostUSD=cap, recovery={"continuity": "Checkpointed"})

        async def suspended() -> Job:
            job = await rig.job("capped")
            assert job.status.phase == "Suspended" and job.status.reason == "MaxCostReached", job.status
            assert job.status.cost and job.status.cost.final is not True
            return job

        job = await eventually(suspended, deadline_s=40, message="suspended with MaxCostReached")
        assert "maxCostUSD" in (job.status.message or "")
        attempts = await rig.attempts_of("capped")
        assert attempts and all(
            a.status.phase in ("Stopped", "Succeeded", "Failed", "Lost") for a in attempts
        )

        async def settled() -> int:
            j = await rig.job("capped")
            assert j.status.cost and j.status.cost.held_usd == "0.00"
            return usd_to_micros(j.status.cost.total_usd or "0")

        spent = await eventually(settled, deadline_s=20, message="the stopped run is captured")
        assert 0 < spent <= usd_to_micros(cap), "never above the cap"
        assert spent == sum(expected_micros(a) for a in attempts)
        await book_ok(rig, "t")

        await rig.set_spec("capped", max_cost_usd="1.00")

        async def resumed() -> bool:
            job = await rig.job("capped")
            return (
                job.status.phase in ("Running", "Provisioning") and len(await rig.attempts_of("capped")) > 1
            )

        await eventually(resumed, deadline_s=30, message="raising the cap resumes the Job")


async def test_a_sweep_cap_suspends_every_running_cell_and_raising_it_resumes_them(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(forever, nodes=4, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        sweeps = ObjectStore(rig.nc, "sweeps", Sweep)
        cap = "0.003"
        body = {"template": {"spec": {"image": "busybox", "resources": {"gpu": "L4:1"}}}, "maxCostUSD": cap}
        sweep = await sweeps.create(
            Sweep(metadata=ObjectMeta(name="sw", namespace="t"), spec=msgspec.convert(body, SweepSpec))
        )
        owner = OwnerReference(
            api_version="nodus.dev/v1", kind="Sweep", name="sw", uid=sweep.metadata.uid or "", controller=True
        )
        for i in range(3):  # cells as the sweep controller creates them: labelled and owned from the start
            body = {
                "image": "busybox",
                "resources": {"gpu": "L4:1"},
                "recovery": {"continuity": "Checkpointed"},
            }
            meta = ObjectMeta(
                name=f"sw-{i}", namespace="t", labels={SWEEP_LABEL: "sw"}, owner_references=[owner]
            )
            await rig.jobs.create(default_job(Job(metadata=meta, spec=msgspec.convert(body, JobSpec))))

        async def all_suspended() -> list[Job]:
            jobs = [await rig.job(f"sw-{i}") for i in range(3)]
            assert all(j.status.phase == "Suspended" and j.status.reason == "MaxCostReached" for j in jobs), [
                (j.status.phase, j.status.reason) for j in jobs
            ]
            assert all(j.status.cost and j.status.cost.held_usd == "0.00" for j in jobs)
            return jobs

        jobs = await eventually(all_suspended, deadline_s=60, message="every cell suspended at the Sweep cap")
        total = sum(usd_to_micros((j.status.cost.total_usd if j.status.cost else None) or "0") for j in jobs)
        assert 0 < total <= usd_to_micros(cap), f"spent {total} µ$ over the Sweep cap"
        await book_ok(rig, "t")

        def raise_cap(s: Sweep) -> Sweep:
            spec = msgspec.structs.replace(s.spec, max_cost_usd="1.00")
            meta = msgspec.structs.replace(s.metadata, generation=(s.metadata.generation or 1) + 1)
            return msgspec.structs.replace(s, spec=spec, metadata=meta)

        await sweeps.mutate("t", "sw", raise_cap)

        async def all_running() -> bool:
            jobs = [await rig.job(f"sw-{i}") for i in range(3)]
            return all(j.status.phase in ("Running", "Provisioning") for j in jobs)

        await eventually(all_running, deadline_s=30, message="raising the Sweep cap resumes every cell")


async def test_a_project_out_of_credits_waits_with_insufficient_credits_until_granted(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(funding=True) as rig:
        await rig.start_billing(**TERMS)  # no starting credits

        await rig.submit("poor")

        async def blocked() -> Job:
            job = await rig.job("poor")
            assert job.status.phase == "Suspended" and job.status.reason == "InsufficientCredits", job.status
            return job

        job = await eventually(blocked, deadline_s=20, message="blocked for want of credits")
        assert "grant" in (job.status.message or "").lower()
        assert not await rig.attempts_of("poor"), "nothing ran unfunded"

        grant = GrantRequest(project="t", grant_id="g1", amount_micros=1_000_000)
        reply = await messaging.request(rig.nc, GRANT_SUBJECT, grant, GrantReply)
        assert reply.ok and reply.account and reply.account.available_micros == 1_000_000

        async def succeeded() -> bool:
            return (await rig.job("poor")).status.phase == "Succeeded"

        await eventually(succeeded, deadline_s=30, message="granted credits let the Job run")
        await book_ok(rig, "t")


# -- billing killed over and over ----------------------------------------------------------------------

COMPLETIONS = 200
KILLS = 20


def _billing(url: str, seed: Path | None, log: Any) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NODUS_NATS_URL": url,
        "NODUS_NATS_NKEY_SEED": str(seed),
        "NODUS_REPLICA": "crashing",  # the same name: a new process takes its own (dead) lease at once
        "NODUS_LOG_LEVEL": "WARNING",
        "NODUS_RESYNC_S": "1",
        "NODUS_STARTING_CREDITS_USD": "100",
        **TERMS,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "nodus_billing"], env=env, stdout=log, stderr=subprocess.STDOUT
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_killing_billing_twenty_times_during_200_completions_charges_every_run_exactly_once(
    make_rig: Callable[..., Any], tmp_path: Path
) -> None:
    rng = random.Random(11)

    def short_run(_: StartAttempt) -> tuple[float, int]:
        return (rng.uniform(0.05, 0.6), 0)

    async with make_rig(short_run, nodes=8, funding=True) as rig:
        log = (tmp_path / "billing.log").open("ab")
        proc = _billing(rig.server.url, rig.server.harness_seed, log)
        await rig.submit("paid", completions=COMPLETIONS, parallelism=8)
        try:
            for kill in range(KILLS):
                # Some progress, then kill -9 wherever it stands: mid-commit, mid-capture, mid-status.
                floor = min(len(rig.fleet.started) + 6, COMPLETIONS)
                await eventually(
                    lambda floor=floor: (
                        len(rig.fleet.started) >= floor or len(rig.fleet.started) >= COMPLETIONS
                    ),
                    deadline_s=60,
                    message=f"no progress before kill {kill + 1}",
                )
                proc.kill()
                proc.wait(timeout=10)
                proc = _billing(rig.server.url, rig.server.harness_seed, log)

            async def final() -> Job:
                job = await rig.job("paid")
                assert job.status.phase == "Succeeded" and job.status.cost and job.status.cost.final, (
                    job.status
                )
                return job

            job = await eventually(final, deadline_s=180, message="the Job's cost never became final")
            state = await filed_book(rig, "t")  # the meter files a final Job's runs out of the book
        finally:
            proc.kill()
            proc.wait(timeout=10)
            log.close()
        attempts = await rig.attempts_of("paid")
        assert sum(1 for a in attempts if a.status.phase == "Succeeded") == COMPLETIONS
        want = sum(expected_micros(a) for a in attempts)
        assert job.status.cost is not None
        assert usd_to_micros(job.status.cost.total_usd or "0") == want, (
            "status.cost exact to the micro-dollar"
        )
        holds = await runs_of(rig, "t", state)
        assert set(holds) == {a.metadata.name for a in attempts}, "every run was funded by its own hold"
        assert all(h.status == "Captured" and h.usage is not None for h in holds.values()), (
            "each resolved once"
        )
        assert sum(h.charged_micros for h in holds.values()) == want, "no double charge, nothing lost"
        assert state.balances["project:t:available"] == 100_000_000 - want
        assert job_ref("paid", job.metadata.uid) not in state.jobs, "its record folded in the book's totals"
        assert sum(sum(r.months.values()) for r in state.forgotten) == want, "filed or not, spent exactly"
        # The book stays small: a settled run leaves one netted entry (none once filed), no results.
        settled = {f"hold:{h}:settled" for h in state.holds}
        assert {e for e in state.ledger if e.startswith("hold:")} <= settled
        assert not [k for k in state.results if k.startswith("hold:")]
        assert len(encode(state)) < 1024 * len(state.holds) + 4096 + 64 * len(holds), "under 1 KB a run"


async def test_a_run_lost_with_its_capacity_shows_what_it_cost_and_the_work_lost_on_the_job(
    make_rig: Callable[..., Any],
) -> None:
    def first_hangs(start: StartAttempt) -> tuple[float | None, int]:
        return (None, 0) if start.attempt_no == 1 else (0.0, 0)

    async with make_rig(first_hangs, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        await rig.submit("spot", recovery={"continuity": "Checkpointed"})

        async def running() -> str:
            running = [a for a in await rig.attempts_of("spot") if a.status.phase == "Running"]
            assert running and running[0].status.start_time
            return running[0].metadata.name or ""

        first = await eventually(running, deadline_s=20, message="the first run starts")
        started = parse_time((await rig.attempts.get("t", first)).status.start_time or "")
        # Two seconds of work (by the clock the times are stamped with), then the capacity goes.
        await eventually(lambda: (datetime.now(UTC) - started).total_seconds() >= 2.5, deadline_s=10)
        rig.fleet.lose(first)

        async def finished() -> Job:
            job = await rig.job("spot")
            assert job.status.phase == "Succeeded" and job.status.cost and job.status.cost.final, job.status
            assert job.status.recovery is not None
            return job

        job = await eventually(finished, deadline_s=30, message="the replacement succeeds, cost final")
        rec = job.status.recovery
        assert rec is not None and rec.lost_runs == 1 and [r.attempt for r in rec.runs] == [first]
        lost = rec.runs[0]
        assert lost.reason is not None and lost.cost_usd is not None and lost.lost_usd is not None
        assert lost.lost_seconds >= 2 and rec.lost_gpu_seconds == lost.lost_seconds * lost.gpus
        assert usd_to_micros(lost.lost_usd) <= usd_to_micros(lost.cost_usd), (
            "lost work is part of what it cost"
        )
        attempts = await rig.attempts_of("spot")
        assert usd_to_micros(job.status.cost.total_usd or "0") == sum(expected_micros(a) for a in attempts)
        segments = job.status.cost.by_segment
        assert segments is not None and segments.restore_usd is not None, "the replacement's start is Restore"


async def test_a_hold_nobody_extends_expires_and_gives_its_credits_back(make_rig: Callable[..., Any]) -> None:
    async with make_rig(funding=True, scheduler=False) as rig:
        await rig.start_billing(
            NODUS_STARTING_CREDITS_USD="1",
            **{**TERMS, "NODUS_ORPHAN_HOLD_S": "3600", "NODUS_HOLD_EXPIRY_S": "1"},
        )
        job = await rig.submit("left")
        ask = HoldRequest(
            namespace="t",
            job="left",
            job_uid=job.metadata.uid or "",
            attempt="left-never-created",
            rate_micros_per_hour=RATE,
            window_millis=1000,
        )
        reply = await messaging.request(rig.nc, HOLD_SUBJECT, ask, HoldReply)
        assert reply.ok and reply.hold_micros > 0
        again = await messaging.request(rig.nc, HOLD_SUBJECT, ask, HoldReply)
        assert again == reply, "asking again for the same Attempt is the same hold"

        async def expired() -> Any:
            state = await book_ok(rig, "t")
            assert state.holds["left-never-created"].status == "Expired"
            return state

        state = await eventually(expired, deadline_s=20, message="the hold expires")
        assert state.balances["project:t:available"] == 1_000_000, "all of it back: nothing was charged"


async def test_a_settled_job_costs_the_meter_one_read_however_often_it_comes_back(
    make_rig: Callable[..., Any],
) -> None:
    """#19's idle cost: every resync brings every stored Job back to the meter. A Job that ended with its
    cost final is not listed against its namespace nor weighed against its project's book again."""
    async with make_rig(funding=True) as rig:
        billing = await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        await rig.submit("done")

        async def final() -> Job:
            job = await rig.job("done")
            assert job.status.phase == "Succeeded" and job.status.cost and job.status.cost.final
            return job

        job = await eventually(final, deadline_s=30, message="the Job succeeds and its cost is final")
        # And its runs filed out of the book (issue #23), as billing's view of the books shows.
        await eventually(
            lambda: not billing.views.unfiled("t", "done"), deadline_s=10, message="its runs are filed"
        )
        metering = billing.metering
        lists, reads = 0, 0
        list_attempts, read_book = metering.attempts.list, metering.books.read

        async def counted_list(*args: Any, **kwargs: Any) -> Any:
            nonlocal lists
            lists += 1
            return await list_attempts(*args, **kwargs)

        async def counted_read(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await read_book(*args, **kwargs)

        metering.attempts.list = counted_list  # type: ignore[method-assign]
        metering.books.read = counted_read  # type: ignore[method-assign]
        try:
            for _ in range(20):
                assert await metering.reconcile(("t", "done")) is None
        finally:
            metering.attempts.list = list_attempts  # type: ignore[method-assign]
            metering.books.read = read_book  # type: ignore[method-assign]
        assert (lists, reads) == (0, 0)
        assert (await rig.job("done")).status.cost == job.status.cost, "and nothing of it changes"
