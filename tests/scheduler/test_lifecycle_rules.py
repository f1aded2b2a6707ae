"""The lifecycle's rules as pure functions: the counting and the clocks, without a bus (ADR-0015)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from nodus_scheduler.ruling import (
    compress,
    deadline_left,
    phase_of,
    queue_timeout_s,
    summarize,
    track_suspension,
    wanted_runs,
)
from nodus_schema.attempts import Attempt, AttemptSpec, AttemptStatus
from nodus_schema.jobs import Job, JobSpec, JobStatus
from nodus_schema.meta import Condition, ObjectMeta, format_time

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def at(seconds: float) -> str:
    return format_time(T0 + timedelta(seconds=seconds))


def run(
    index: int, n: int, phase: str, started: float | None = None, finished: float | None = None
) -> Attempt:
    return Attempt(
        metadata=ObjectMeta(name=f"j-{index}-a{n}", namespace="t"),
        spec=AttemptSpec(
            job="j", index=index, attempt=n, node="n", offering="o", region_class="us",
            rate_micros_per_hour=1, pricebook_version="v",
        ),
        status=AttemptStatus(
            phase=phase,
            start_time=at(started) if started is not None else None,
            finish_time=at(finished) if finished is not None else None,
        ),
    )  # fmt: skip


def job(**spec: Any) -> Job:
    body = {"image": "i", "command": ["c"], **spec}
    return Job(
        metadata=ObjectMeta(name="j", namespace="t", creation_timestamp=at(0)),
        spec=msgspec.convert(body, JobSpec),
    )


def test_losses_in_a_row_without_progress_count_and_progress_resets_them() -> None:
    quick = [run(0, 1, "Lost", 0, 30), run(0, 2, "Lost", 40, 70)]  # 30 s each: under 2m, no progress
    assert summarize(quick, min_progress_s=120).infra == {0: 2}
    progressed = [*quick, run(0, 3, "Lost", 100, 400)]  # 5 minutes of progress before the loss
    assert summarize(progressed, min_progress_s=120).infra == {0: 0}
    again = [*progressed, run(0, 4, "Lost", 410, 420)]
    view = summarize(again, min_progress_s=120)
    assert view.infra == {0: 1} and view.lost == 4 and view.failures == 0  # never the user's failure


def test_an_index_that_used_up_max_attempts_fails_the_job_with_capacity_lost() -> None:
    j = job(recovery={"maxAttempts": 2})
    view = summarize([run(0, 1, "Lost", 0, 1), run(0, 2, "Lost", 2, 3)], min_progress_s=120)
    phase, reason, message = phase_of(j, view, None, 1, [], T0)
    assert (phase, reason) == ("Failed", "CapacityLost")
    assert "2 times in a row" in message


def test_customer_failures_count_across_indexes() -> None:
    j = job(completions=3, parallelism=3, backoffLimit=1)
    view = summarize([run(0, 1, "Failed"), run(1, 1, "Failed"), run(2, 1, "Succeeded")])
    assert view.failures == 2
    assert phase_of(j, view, None, 3, [], T0)[:2] == ("Failed", "BackoffLimitExceeded")


def test_the_timeout_clock_stops_while_suspended_and_start_time_moves_on_resume() -> None:
    j = job(timeout="10m", state="Suspended")
    started = msgspec.structs.replace(j, status=JobStatus(start_time=at(0)))
    conditions: list[Condition] = []
    # Suspended at 4 minutes: the condition records when.
    status = track_suspension(started, started.status, conditions, T0 + timedelta(minutes=4))
    suspended = msgspec.structs.replace(
        started, status=msgspec.structs.replace(status, conditions=conditions)
    )
    # An hour later the clock still says 6 minutes are left.
    assert deadline_left(suspended, T0 + timedelta(hours=1)) == 6 * 60
    resumed_job = msgspec.structs.replace(
        suspended, spec=msgspec.structs.replace(suspended.spec, state="Running")
    )
    conds = list(conditions)
    later = T0 + timedelta(hours=1)
    resumed = track_suspension(resumed_job, suspended.status, conds, later)
    # startTime moved forward by the 56 minutes spent suspended; 6 minutes are still left.
    assert resumed.start_time == format_time(T0 + timedelta(minutes=56))
    after = msgspec.structs.replace(resumed_job, status=msgspec.structs.replace(resumed, conditions=conds))
    assert deadline_left(after, later) == 6 * 60
    assert [(c.type, c.status) for c in conds] == [("Suspended", "False")]


def test_queue_timeout_zero_waits_for_ever_and_the_default_is_a_day() -> None:
    assert queue_timeout_s(job(placement={"queueTimeout": "0s"})) is None
    assert queue_timeout_s(job()) == 24 * 3600
    j = job(placement={"queueTimeout": "1m"})
    waiting = [Condition(type="Scheduled", status="False", last_transition_time=at(0))]
    assert (
        phase_of(j, summarize([]), "0/1 nodes: 1 busy", 1, waiting, T0 + timedelta(seconds=30))[0] == "Queued"
    )
    phase, reason, message = phase_of(
        j, summarize([]), "0/1 nodes: 1 busy", 1, waiting, T0 + timedelta(minutes=2)
    )
    assert (phase, reason) == ("Failed", "CapacityUnavailable")
    assert message.endswith("0/1 nodes: 1 busy")


def test_completed_indexes_are_compressed_as_kubernetes_does() -> None:
    assert compress([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"
    assert compress([]) == ""


def test_a_finish_report_of_a_run_its_node_could_not_start_leaves_no_start_time() -> None:
    """reporting.apply: a run the node could not start (AttemptFinished, reason Lost, no AttemptStarted)
    never started, so billing covers it whole and no replacement restores from it; any other finish
    without a start (the AttemptStarted report lost) still reads as started when it finished."""
    from nodus_scheduler.reporting import apply as report
    from nodus_schema.messages import AttemptFinished

    pending = Attempt(
        metadata=ObjectMeta(name="a", namespace="t"),
        spec=AttemptSpec(
            job="j",
            index=0,
            attempt=1,
            node="n",
            offering="o",
            region_class="us",
            rate_micros_per_hour=1,
            pricebook_version="v",
        ),
    )

    def finish(reason: str) -> Attempt:
        msg = AttemptFinished(
            namespace="t",
            attempt="a",
            node="n",
            time="2027-01-15T08:00:09Z",
            exit_code=None,
            wall_millis=0,
            reason=reason,
            started_ms=1_800_000_000_000,
            stopped_ms=1_800_000_002_400,
        )
        done = report(pending, msg)
        assert done is not None
        return done

    lost = finish("Lost")
    assert (lost.status.phase, lost.status.start_time) == ("Lost", None)
    assert (lost.status.billing_start_ms, lost.status.billing_stop_ms) == (
        1_800_000_000_000,
        1_800_000_002_400,
    )
    assert finish("Error").status.start_time == "2027-01-15T08:00:09Z"


def test_a_jobs_mean_throughput_is_plain_digits_never_an_exponent() -> None:
    """measures(): an index that reported 670 units/s is "670" on the Job (str() of the normalised
    Decimal was "6.7E+2", and `nodus get sweep` showed it so)."""
    from nodus_scheduler.ruling import measures

    def ran(units: str) -> Attempt:
        return Attempt(status=AttemptStatus(phase="Succeeded", wall_millis=1_000, units_per_second=units))

    assert measures([ran("670")]) == (1, "670")
    assert measures([ran("600"), ran("800")]) == (1, "700")
    assert measures([ran("0.5"), ran("0.25")]) == (1, "0.375")


def test_the_runs_wanted_are_the_first_indexes_not_done_nor_running_up_to_parallelism() -> None:
    wide = job(completions=6, parallelism=3)
    view = summarize([run(0, 1, "Succeeded", 0, 10), run(1, 1, "Running", 5), run(2, 1, "Failed", 0, 10)])
    # Index 0 is done and 1 runs: two more fit; index 2 is tried again (its second run), then index 3.
    assert wanted_runs(wide, view, None) == [(2, 2), (3, 1)]
    assert wanted_runs(job(completions=6, parallelism=1), view, None) == []  # index 1 fills it
    assert wanted_runs(job(completions=6, parallelism=20), view, None) == [(2, 2), (3, 1), (4, 1), (5, 1)]
    assert wanted_runs(wide, view, "Suspended") == []  # a halted Job starts nothing
