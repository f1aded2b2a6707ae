"""Exact metering (issue #18): a run is billed from the node's reported start to its reported stop, in
milliseconds on the node's clock, rounded up once per allocation; a run lost with its node is charged as
Running until the node's last heartbeat, and the rest is covered by Nodus."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nodus_billing.segmenting import BOOT, RESTORE, RUNNING, TEARDOWN, charged, usage_of
from nodus_schema.attempts import Attempt, AttemptSpec, AttemptStatus
from nodus_schema.ledger import charge_micros
from nodus_schema.meta import ObjectMeta

RATE = 2_990_000  # µ$/h
T0 = 1_800_000_000_000  # an epoch ms


def run(
    *,
    created: str = "2027-01-15T08:00:00Z",
    finished: str = "2027-01-15T08:00:09Z",
    start_ms: int | None = T0,
    program_ms: int | None = T0 + 1_500,
    stop_ms: int | None = T0 + 4_200,
    phase: str = "Succeeded",
    reason: str | None = "Completed",
    start_time: str | None = "2027-01-15T08:00:01Z",
) -> Attempt:
    spec = AttemptSpec(
        job="j",
        index=0,
        attempt=1,
        node="n",
        offering="h100-sxm-80g-x1-us",
        region_class="us",
        rate_micros_per_hour=RATE,
        pricebook_version="v",
    )
    status = AttemptStatus(
        phase=phase,
        reason=reason,
        start_time=start_time,
        finish_time=finished,
        billing_start_ms=start_ms,
        program_start_ms=program_ms,
        billing_stop_ms=stop_ms,
    )
    return Attempt(metadata=ObjectMeta(name="j-a1", creation_timestamp=created), spec=spec, status=status)


def test_billing_counts_from_the_nodes_start_to_its_stop_rounded_up_once() -> None:
    usage = usage_of(run(), replacement=False, now_ms=T0 + 60_000)
    # 4.2 s on the node's clock -> 5 s billed, whatever the stamps (created 08:00:00, finished 08:00:09).
    assert usage.billed_millis == 5_000
    assert charged(usage) == charge_micros(RATE, 5_000)
    # Boot: 1.5 s from the node's start to the program's launch; the rest is Running.
    boot = charge_micros(RATE, 1_500)
    assert usage.segments == {BOOT: boot, RUNNING: charge_micros(RATE, 5_000) - boot}
    assert usage.covered == {}


@given(
    created_s=st.integers(0, 59),
    finished_extra_s=st.integers(0, 30),
    start=st.integers(T0, T0 + 10_000_000),
    boot=st.integers(0, 600_000),
    running=st.integers(0, 3_600_000),
)
def test_identical_runs_are_billed_identically_whenever_the_control_plane_stamped_them(
    created_s: int, finished_extra_s: int, start: int, boot: int, running: int
) -> None:
    """The same run on the node (its boot and run time) costs the same, wherever its control-plane stamps
    fall and whenever it ran: 2 s cells billed 2 s or 3 s is what this forbids."""
    base = run(start_ms=T0, program_ms=T0 + boot, stop_ms=T0 + boot + running)
    moved = run(
        created=f"2027-01-15T08:00:{created_s:02d}Z",
        finished=f"2027-01-15T08:{1 + finished_extra_s:02d}:00Z",
        start_ms=start,
        program_ms=start + boot,
        stop_ms=start + boot + running,
    )
    a = usage_of(base, replacement=False, now_ms=T0)
    b = usage_of(moved, replacement=False, now_ms=T0)
    assert (a.billed_millis, a.segments) == (b.billed_millis, b.segments)
    assert a.billed_millis == max(1_000, -(-(boot + running) // 1_000) * 1_000)


def test_a_replacement_starts_with_restore() -> None:
    usage = usage_of(run(), replacement=True, now_ms=T0)
    assert set(usage.segments) == {RESTORE, RUNNING}


def test_a_run_lost_with_its_node_is_charged_until_the_last_heartbeat_and_the_rest_is_covered() -> None:
    # The node began at T0, launched at +1.5 s, beat last at +60 s; the loss was seen 15 s later (the
    # scheduler stamps the finish at detection, and the last heartbeat as billing's stop).
    lost = run(
        phase="Lost",
        reason="NodeLost",
        stop_ms=T0 + 60_000,
        start_time="2027-01-15T08:00:01Z",
        finished="2027-01-15T08:01:15Z",
        created="2027-01-15T08:00:00Z",
    )
    # The finish stamp is on the control plane's clock; here it is the node's T0 + 75 s.
    lost.status.finish_time = _iso(T0 + 75_000)
    usage = usage_of(lost, replacement=False, now_ms=T0 + 80_000)
    assert usage.segments == {RUNNING: charge_micros(RATE, 59_000)}  # 58.5 s of program, rounded up once
    assert usage.covered == {BOOT: charge_micros(RATE, 1_500), TEARDOWN: charge_micros(RATE, 15_000)}
    assert usage.billed_millis == 59_000


def test_a_run_lost_before_its_program_started_is_covered_whole() -> None:
    lost = run(phase="Lost", reason="NodeLost", program_ms=None, start_time=None, stop_ms=T0 + 3_000)
    usage = usage_of(lost, replacement=False, now_ms=T0 + 9_000)
    assert usage.segments == {} and charged(usage) == 0
    assert usage.covered == {BOOT: charge_micros(RATE, 3_000)}


def test_a_report_without_the_nodes_times_falls_back_to_the_stamps() -> None:
    old = run(start_ms=None, program_ms=None, stop_ms=None)
    usage = usage_of(old, replacement=False, now_ms=T0)
    # created 08:00:00, started 08:00:01, finished 08:00:09: 9 s, Boot 1 s.
    assert usage.billed_millis == 9_000
    assert usage.segments == {BOOT: charge_micros(RATE, 1_000), RUNNING: charge_micros(RATE, 9_000) - 831}


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    from nodus_schema.meta import format_time

    return format_time(datetime.fromtimestamp(ms / 1000, UTC))


def test_a_start_that_failed_on_the_node_is_covered_whole_though_a_start_time_was_stamped() -> None:
    """The node reported its times but no launch (the start failed there): covered whole, whatever
    startTime an older scheduler stamped from the finish report (the simulator found a second charged)."""
    failed = run(phase="Lost", reason="Lost", program_ms=None, stop_ms=T0 + 2_400)
    failed.status.start_time = failed.status.finish_time
    usage = usage_of(failed, replacement=False, now_ms=T0 + 9_000)
    assert usage.segments == {} and charged(usage) == 0
    assert usage.covered == {BOOT: charge_micros(RATE, 3_000)}


def test_a_checkout_that_failed_is_billed_as_boot_and_never_as_running() -> None:
    """spec.source could not be fetched (ADR-0036): the GPU was held while the node tried, which is the
    customer's (the repository, ref or blob is theirs), but the program never ran."""
    failed = run(phase="Failed", reason="SourceUnavailable", program_ms=None, start_time=None)
    usage = usage_of(failed, replacement=False, now_ms=T0 + 60_000)
    assert usage.segments.get(RUNNING, 0) == 0
    assert usage.segments[BOOT] == charge_micros(RATE, 5_000)
    assert usage.covered == {}
