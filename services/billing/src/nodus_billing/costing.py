"""``status.cost`` of a Job from its project's book (pure, no I/O): what the meter writes (``metering``)."""

from __future__ import annotations

from datetime import UTC, datetime

from nodus_billing.segmenting import RUNNING
from nodus_billing.standing import State, job_held, job_spent
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_UID_LABEL, Attempt
from nodus_schema.costs import Cost, CostSegments
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import format_time
from nodus_schema.quantities import micros_to_usd


def warm_pending(a: Attempt) -> bool:
    """A finished run whose node may still be kept warm (its hold, while open, is charged at its rate)."""
    return a.status.warm_until_ms is not None and a.status.warm_end_ms is None


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
    uid = job.metadata.uid
    mine = [a for a in attempts if a.metadata.labels.get(JOB_UID_LABEL) == uid]
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
