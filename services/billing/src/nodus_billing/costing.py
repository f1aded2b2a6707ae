"""``status.cost`` of a Job from its project's book (pure, no I/O): what the meter writes (``metering``), and
when it holds a write back for the next event of the run (``starting``, ``ending``)."""

from __future__ import annotations

from datetime import UTC, datetime

from nodus_billing.segmenting import RUNNING
from nodus_billing.standing import State, job_held, job_spent
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_UID_LABEL, Attempt
from nodus_schema.costs import Cost, CostSegments
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import format_time
from nodus_schema.quantities import micros_to_usd

STARTING_MS = 5000
"""How long a hold's cost waits for the Attempt it was placed for (``starting``)."""
ENDING_MS = 2000
"""How long the cost of a Job whose runs all ended waits for the scheduler to end the Job (``ending``)."""


def warm_pending(a: Attempt) -> bool:
    """A finished run whose node may still be kept warm (its hold, while open, is charged at its rate)."""
    return a.status.warm_until_ms is not None and a.status.warm_end_ms is None


def runs_of(job: Job, attempts: list[Attempt]) -> list[Attempt]:
    """The Attempts of this Job itself (its uid): a Job created again under its name has its own."""
    uid = job.metadata.uid
    return [a for a in attempts if a.metadata.labels.get(JOB_UID_LABEL) == uid]


def runs_shown(job: Job, mine: list[Attempt]) -> bool:
    """Whether ``mine`` (the Attempts of the Job's uid at hand) holds the latest run of every index the
    Job's status counts. The scheduler writes ``status.attempts`` (the sum over indexes of the highest
    attempt number, a gang's members counting once) with the phase, from the Attempts it saw; a view of
    the Attempts that lags the view of the Jobs (each follows its own watch, and one resumes after a lost
    server before the other) shows an ended Job without its last runs. A cost judged final on that view
    would leave those runs out for good (their holds too, when the book read lags as well), so it waits
    for them: a watch delivers in order, so the latest run of an index comes after all of its others."""
    tries: dict[int, int] = {}
    for a in mine:
        tries[a.spec.index] = max(tries.get(a.spec.index, 0), a.spec.attempt)
    return sum(tries.values()) >= (job.status.attempts or 0)


def cost_of(job: Job, ref: str, state: State, attempts: list[Attempt]) -> Cost:
    """status.cost of a Job from the book: spent, held, rate, segments, funding, final."""
    holds = {h: hold for h, hold in state.holds.items() if hold.job == ref}
    open_ = {h: hold for h, hold in holds.items() if hold.status == "Open"}
    segments: dict[str, int] = {}
    covered: set[str] = set()
    for hold in holds.values():
        if hold.usage is not None:
            for seg, amount in hold.usage.segments.items():
                segments[seg] = segments.get(seg, 0) + amount
            covered |= set(hold.usage.covered)
        elif hold.charged_micros:
            segments[RUNNING] = segments.get(RUNNING, 0) + hold.charged_micros
    live = {a.metadata.name for a in attempts if a.status.phase not in ATTEMPT_TERMINAL or warm_pending(a)}
    rate = sum(hold.rate_micros_per_hour for h, hold in open_.items() if h in live)
    mine = runs_of(job, attempts)
    final = (
        job.status.phase in TERMINAL_PHASES
        and not open_
        and all(a.status.phase in ATTEMPT_TERMINAL for a in mine)
        and runs_shown(job, mine)
    )
    until = max((hold.funded_until_ms for hold in open_.values()), default=None)
    return Cost(
        total_usd=micros_to_usd(job_spent(state, ref)),
        held_usd=micros_to_usd(job_held(state, ref)),
        rate_usd_per_hour=micros_to_usd(rate),
        limit_usd=job.spec.max_cost_usd,
        by_segment=_segments(segments, covered) if segments or covered else None,
        funded_until_time=format_time(datetime.fromtimestamp(until / 1000, UTC)) if until else None,
        final=final,
    )


def _segments(amounts: dict[str, int], covered: set[str]) -> CostSegments:
    def usd(seg: str) -> str | None:
        return micros_to_usd(amounts[seg]) if seg in amounts else None

    return CostSegments(
        boot_usd=usd("Boot"),
        running_usd=usd("Running"),
        restore_usd=usd("Restore"),
        teardown_usd=usd("Teardown"),
        covered_by_nodus=sorted(covered),
    )


def starting(state: State, ref: str, attempts: list[Attempt], now: int) -> bool:
    """Whether a hold of the Job was placed moments ago for an Attempt the views do not show yet: the
    scheduler creates the Attempt right after its hold, and its event meters the Job again, so the cost
    is written then, once, with what is held and the run's rate (issue #23: not once for each). An
    Attempt that does not come within :data:`STARTING_MS` does not hold the cost back any longer."""
    names = {a.metadata.name for a in attempts}
    return any(
        hold.job == ref and hold.status == "Open" and h not in names and now - hold.placed_ms < STARTING_MS
        for h, hold in state.holds.items()
    )


def ending(state: State, job: Job, ref: str, attempts: list[Attempt], now: int) -> int:
    """How long the cost write waits (ms; 0: none) for the scheduler to end the Job: every run of it (its
    uid) ended moments ago, none kept warm, no hold of it open, and the Job has not ended. The scheduler
    ends it (or starts its next run) right after its last run ends, and that event meters the Job again, so
    one write shows the captured runs and ``final`` (issue #23: not one for each, nor a write that loses its
    compare-and-set to the scheduler's). No later than :data:`ENDING_MS` after the last run's end: a Job
    left waiting (Suspended, a retry to come) is written then."""
    if job.status.phase in TERMINAL_PHASES:
        return 0
    mine = runs_of(job, attempts)
    if not mine or any(a.status.phase not in ATTEMPT_TERMINAL or warm_pending(a) for a in mine):
        return 0
    if any(hold.job == ref and hold.status == "Open" for hold in state.holds.values()):
        return 0
    ended = max(a.status.billing_stop_ms or 0 for a in mine)
    return max(0, min(ENDING_MS, ended + ENDING_MS - now))
