"""When the meter holds a cost write back for the run's next event (``costing.starting``, ``costing.ending``):
pure, on a book and Attempts built here."""

from __future__ import annotations

import msgspec

from nodus_billing.costing import ENDING_MS, STARTING_MS, ending, starting
from nodus_billing.standing import Hold, State
from nodus_schema.attempts import JOB_LABEL, JOB_UID_LABEL, Attempt, AttemptStatus
from nodus_schema.jobs import Job, JobStatus
from nodus_schema.meta import ObjectMeta

NOW = 1_800_000_000_000
REF = "j@u"


def job(phase: str = "Running") -> Job:
    return Job(metadata=ObjectMeta(name="j", namespace="t", uid="u"), status=JobStatus(phase=phase))


def run(name: str, phase: str, stop_ms: int | None = None, uid: str = "u") -> Attempt:
    return Attempt(
        metadata=ObjectMeta(name=name, namespace="t", labels={JOB_LABEL: "j", JOB_UID_LABEL: uid}),
        spec=msgspec.structs.replace(Attempt().spec, job="j", rate_micros_per_hour=790_000),
        status=AttemptStatus(phase=phase, billing_stop_ms=stop_ms),
    )


def book(*holds: tuple[str, str, int]) -> State:
    """Holds of the Job: (id, status, placed at)."""
    state = State()
    for hold_id, status, placed in holds:
        state.holds[hold_id] = Hold(
            job=REF,
            project="t",
            month="2027-01",
            funded_until_ms=placed + 60_000,
            status=status,
            placed_ms=placed,
        )
    return state


def test_a_cost_waits_for_the_jobs_end_once_its_last_run_ended_moments_ago() -> None:
    captured = book(("a", "Captured", NOW - 5_000))
    assert ending(captured, job(), REF, [run("a", "Succeeded", NOW - 500)], NOW) == ENDING_MS - 500
    assert ending(captured, job(), REF, [run("a", "Succeeded", NOW + 60_000)], NOW) == ENDING_MS, "at most"


def test_a_cost_is_written_at_once_when_nothing_is_to_come() -> None:
    captured = book(("a", "Captured", NOW - 5_000))
    ended = [run("a", "Succeeded", NOW - 500)]
    assert ending(captured, job("Succeeded"), REF, ended, NOW) == 0, "the Job ended: final now"
    assert ending(captured, job(), REF, [run("a", "Succeeded", NOW - ENDING_MS)], NOW) == 0, "waited enough"
    assert ending(captured, job(), REF, [run("a", "Running")], NOW) == 0, "a run goes on"
    assert ending(book(("a", "Open", NOW - 5_000)), job(), REF, ended, NOW) == 0, "a hold is open"
    assert ending(captured, job(), REF, [], NOW) == 0, "no run"
    assert ending(captured, job(), REF, [run("a", "Succeeded", None)], NOW) == 0, "no stop time"
    assert ending(captured, job(), REF, [run("a", "Succeeded", NOW - 500, uid="older")], NOW) == 0, "not its"


def test_a_hold_waits_for_its_attempt_a_few_seconds_at_most() -> None:
    held = book(("a", "Open", NOW - 100))
    assert starting(held, REF, [], NOW), "its Attempt is coming"
    assert not starting(held, REF, [run("a", "Running")], NOW), "its Attempt came"
    assert not starting(book(("a", "Open", NOW - STARTING_MS)), REF, [], NOW), "it did not come in time"
