"""The lifecycle's rules, pure: what a Job's Attempts say (:func:`summarize`, gangs too), its phase, its
deadlines, backoff and attempt limits, when to look again. :mod:`nodus_scheduler.lifecycle` reads the
store, asks these, and writes what they decide; the tests of the rules need no bus.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Final

import msgspec

from nodus_scheduler.cataloging import catalog_for, pin_pricebook
from nodus_scheduler.ganging import (
    ABANDON_AFTER_S,
    ASSEMBLY_TIMEOUT,
    GangAttempt,
    Shape,
    gang_attempts,
)
from nodus_scheduler.placing import HEARTBEAT_GRACE
from nodus_schema.attempts import (
    ATTEMPT_TERMINAL,
    Attempt,
    OutputRecord,
)
from nodus_schema.billing import Block
from nodus_schema.catalog import Catalog
from nodus_schema.jobs import TERMINAL_PHASES, Job, JobStatus
from nodus_schema.messages import StopReason
from nodus_schema.meta import (
    Condition,
    find_condition,
    format_time,
    now_rfc3339,
    parse_time,
    set_condition,
)
from nodus_schema.nodes import Node
from nodus_schema.quantities import parse_duration

log = logging.getLogger(__name__)

DEFAULT_BACKOFF_LIMIT: Final = 6
DEFAULT_MAX_ATTEMPTS: Final = 3
DEFAULT_MIN_PROGRESS_S: Final = 120.0
RECHECK_S: Final = 10.0
"""Even with no event, look at every unfinished Job this often (a safety net, not the trigger)."""
REASSIGN_AFTER_S: Final = 5.0
"""A run still Pending this long after its Attempt was created gets its assignment published again."""


# ---------------------------------------------------------------------------------------------------------
# What the Attempts say
# ---------------------------------------------------------------------------------------------------------


@dataclass
class View:
    """What the Attempts of one Job say, index by index."""

    succeeded: dict[int, Attempt] = field(default_factory=dict)
    active: dict[int, Attempt] = field(default_factory=dict)
    failures: int = 0  # customer failures, across all indexes (backoffLimit)
    infra: dict[int, int] = field(default_factory=dict)  # losses in a row without progress, per index
    lost: int = 0  # every lost run (onInterruption: Fail)
    tries: dict[int, int] = field(default_factory=dict)  # the highest attempt number per index
    last: dict[int, Attempt] = field(default_factory=dict)  # the latest finished run per index
    # Gangs (a distributed Job): the entries above are per gang attempt, shown by one of its members.
    gang: Shape | None = None
    gangs: list[GangAttempt] = field(default_factory=list)  # every gang attempt, by index then number
    assembly: dict[int, int] = field(default_factory=dict)  # timed-out assemblies in a row, per index
    assembling: dict[int, tuple[int, int]] = field(default_factory=dict)  # active: (members started, size)


_BY_NUMBER: Final = operator.attrgetter("spec.attempt")  # in C: a pass sorts every Attempt of the Job


def summarize(attempts: list[Attempt], min_progress_s: float = DEFAULT_MIN_PROGRESS_S) -> View:
    v = View()
    for a in sorted(attempts, key=_BY_NUMBER):
        i, phase = a.spec.index, a.status.phase
        v.tries[i] = max(v.tries.get(i, 0), a.spec.attempt)
        if phase == "Succeeded":
            v.succeeded[i] = a
        elif phase == "Failed":
            v.failures += 1
        elif phase == "Lost":
            v.lost += 1
            # A run that lasted minProgressDuration made progress: the losses in a row start again.
            v.infra[i] = 0 if run_seconds(a) >= min_progress_s else v.infra.get(i, 0) + 1
        elif phase not in ATTEMPT_TERMINAL:
            v.active[i] = a
        if phase in ATTEMPT_TERMINAL:
            v.last[i] = a
    return v


def summarize_gangs(
    attempts: list[Attempt], shape: Shape, min_progress_s: float = DEFAULT_MIN_PROGRESS_S
) -> View:
    """:func:`summarize` for a gang Job: each gang attempt counts once, by how it ended
    (:meth:`GangAttempt.verdict`): a failure against backoffLimit, a loss against recovery.maxAttempts
    (forgiven when the whole gang ran minProgressDuration), a timed-out assembly against
    maxAssemblyRetries (counted in a row: a gang that assembled starts the count again)."""
    v = View(gang=shape)
    for g in gang_attempts(attempts, shape.nodes):
        i = g.index
        v.gangs.append(g)
        v.tries[i] = max(v.tries.get(i, 0), g.number)
        shown = g.representative()
        verdict = g.verdict()
        if g.assembled:
            v.assembly[i] = 0
        if verdict is None:
            v.active[i] = shown
            v.assembling[i] = (g.started, g.size)
            continue
        v.last[i] = shown
        if verdict == "Succeeded":
            v.succeeded[i] = shown
        elif verdict == "Failed":
            v.failures += 1
        elif verdict == "Lost":
            v.lost += 1
            v.infra[i] = 0 if g.ran_for() >= min_progress_s else v.infra.get(i, 0) + 1
        elif verdict == ASSEMBLY_TIMEOUT:
            v.assembly[i] = v.assembly.get(i, 0) + 1
    return v


def run_seconds(a: Attempt) -> float:
    """Seconds the program ran (from its start report to the end of the run), 0 if it never started."""
    if not a.status.start_time or not a.status.finish_time:
        return 0.0
    return (parse_time(a.status.finish_time) - parse_time(a.status.start_time)).total_seconds()


# ---------------------------------------------------------------------------------------------------------
# Rules (pure)
# ---------------------------------------------------------------------------------------------------------


def alive(node: Node, now: datetime) -> bool:
    """Whether the node's agent is there: it beat within the grace. (Its phase says whether it takes new
    work; a node that is draining or cordoned still runs what it has.)"""
    beat = node.status.last_heartbeat_time
    return beat is not None and now - parse_time(beat) <= HEARTBEAT_GRACE


def continuity_of(job: Job) -> str:
    r = job.spec.recovery
    return (r.continuity if r else None) or "Checkpointed"


def max_attempts_of(job: Job) -> int:
    r = job.spec.recovery
    return (r.max_attempts if r else None) or DEFAULT_MAX_ATTEMPTS


def min_progress_of(job: Job) -> float:
    r = job.spec.recovery
    text = r.min_progress_duration if r else None
    return parse_duration(text).total_seconds() if text else DEFAULT_MIN_PROGRESS_S


def backoff_limit_of(job: Job) -> int:
    return job.spec.backoff_limit if job.spec.backoff_limit is not None else DEFAULT_BACKOFF_LIMIT


def over_backoff(job: Job, view: View) -> bool:
    return view.failures > backoff_limit_of(job)


def interrupted_fail(job: Job, view: View) -> bool:
    r = job.spec.recovery
    return bool(view.lost) and r is not None and r.on_interruption == "Fail"


def suspended_since(conditions: list[Condition]) -> datetime | None:
    c = find_condition(conditions, "Suspended")
    return parse_time(c.last_transition_time) if c and c.status == "True" and c.last_transition_time else None


def deadline_left(job: Job, now: datetime) -> float | None:
    """Seconds left of spec.timeout: counted from status.startTime, frozen while Suspended."""
    if not job.spec.timeout:
        return None
    total = parse_duration(job.spec.timeout).total_seconds()
    if not job.status.start_time:
        return total
    until = suspended_since(job.status.conditions) or now
    return total - (until - parse_time(job.status.start_time)).total_seconds()


def halt_reason(job: Job, now: datetime, block: Block | None = None) -> StopReason | None:
    """Why the Job's runs must stop now (the reason its StopAttempts carry), or None."""
    if job.spec.state == "Cancelled":
        return StopReason.CANCELLED
    if job.spec.state == "Suspended":
        return StopReason.SUSPENDED
    if block is not None:
        # Billing will not fund it: suspended (with a checkpoint) until it will. Its codes are
        # FUNDING_REASONS, each a StopReason of the same name.
        return StopReason(block.reason)
    left = deadline_left(job, now)
    return StopReason.DEADLINE_EXCEEDED if left is not None and left <= 0 else None


def track_suspension(
    job: Job, status: JobStatus, conditions: list[Condition], now: datetime, block: Block | None = None
) -> JobStatus:
    """The Suspended condition, and on resume startTime moved forward by the time spent suspended (so the
    timeout does not count it: Kubernetes resets startTime on resume for the same reason). Billing's block
    (MaxCostReached, ...) suspends as spec.state Suspended does, with billing's reason."""
    since = suspended_since(conditions)
    stamp = format_time(now)
    if job.spec.state == "Suspended" or (block is not None and job.spec.state != "Cancelled"):
        reason, message = (
            ("Suspended", "spec.state is Suspended")
            if block is None
            else (
                block.reason,
                f"{block.message}. {block.fix}",
            )
        )
        current = find_condition(conditions, "Suspended")
        if since is None or (current is not None and current.reason != reason):
            set_condition(
                conditions,
                Condition(type="Suspended", status="True", reason=reason, message=message),
                now=stamp,
            )
        return status
    if since is not None:
        set_condition(
            conditions,
            Condition(type="Suspended", status="False", reason="Resumed", message="the Job runs again"),
            now=stamp,
        )
        if status.start_time:
            moved = parse_time(status.start_time) + (now - since)
            status = msgspec.structs.replace(status, start_time=format_time(moved))
    return status


def queue_waited(conditions: list[Condition], job: Job, now: datetime) -> float:
    c = find_condition(conditions, "Scheduled")
    since = c.last_transition_time if c is not None and c.status == "False" else None
    start = since or job.metadata.creation_timestamp
    return (now - parse_time(start)).total_seconds() if start else 0.0


def queue_timeout_s(job: Job) -> float | None:
    text = job.spec.placement.queue_timeout if job.spec.placement else None
    seconds = parse_duration(text or "24h").total_seconds()
    return None if seconds == 0 else seconds  # 0s waits for ever


def phase_of(
    job: Job,
    view: View,
    unplaced: str | None,
    completions: int,
    conditions: list[Condition],
    now: datetime,
    block: Block | None = None,
) -> tuple[str, str | None, str]:
    spec, active = job.spec, len(view.active)
    if spec.state == "Cancelled":
        if not active:
            return "Cancelled", "Cancelled", "the Job was cancelled"
        return "Running", "Cancelling", f"the Job was cancelled; stopping {active} runs"
    if halt_reason(job, now) == "DeadlineExceeded":
        if not active:
            return "Failed", "DeadlineExceeded", f"the Job ran past its timeout of {spec.timeout}"
        return "Running", "DeadlineExceeded", f"past its timeout of {spec.timeout}; stopping {active} runs"
    if over_backoff(job, view) and not active:
        return (
            "Failed",
            "BackoffLimitExceeded",
            f"{view.failures} failed runs exceeded backoffLimit {backoff_limit_of(job)}; "
            "see the attempts' exit codes",
        )
    if len(view.succeeded) >= completions:
        return "Succeeded", "Completed", f"{completions}/{completions} indexes succeeded"
    if interrupted_fail(job, view) and not active:
        return "Failed", "CapacityLost", "a run lost its capacity and recovery.onInterruption is Fail"
    gang = view.gang
    if gang is not None and assembly_exhausted(view) and not active:
        i = next(i for i, n in sorted(view.assembly.items()) if n > gang.max_assembly_retries)
        return (
            "Failed",
            "AssemblyTimeout",
            f"index {i}'s gang of {gang.nodes} nodes did not assemble within startupTimeout "
            f"{gang.startup_timeout}, {view.assembly[i]} times in a row "
            f"(1 + maxAssemblyRetries {gang.max_assembly_retries})",
        )
    max_attempts = max_attempts_of(job)
    exhausted = [i for i, n in view.infra.items() if n >= max_attempts and i not in view.succeeded]
    if exhausted and not active:
        what = (
            f"index {exhausted[0]}'s gang lost a member"
            if gang is not None
            else f"index {exhausted[0]} lost its capacity"
        )
        return (
            "Failed",
            "CapacityLost",
            f"{what} {max_attempts} times in a row (recovery.maxAttempts)",
        )
    if spec.state == "Suspended":
        if not active:
            return "Suspended", "Suspended", "the Job is suspended"
        return "Running", "Suspended", f"suspending: stopping {active} runs"
    if block is not None:
        if not active:
            return "Suspended", block.reason, f"{block.message}. {block.fix}"
        return "Running", block.reason, f"suspending: stopping {active} runs: {block.message}"
    if any(a.status.phase == "Running" for a in view.active.values()):
        return "Running", None, f"{active} running, {len(view.succeeded)}/{completions} succeeded"
    if active:
        if gang is not None:
            started = sum(n for n, _ in view.assembling.values())
            size = sum(n for _, n in view.assembling.values())
            return (
                "Provisioning",
                None,
                f"{'a gang' if active == 1 else f'{active} gangs'} of {gang.nodes} assembling: "
                f"{started}/{size} members started",
            )
        return "Provisioning", None, f"{active} starting"
    limit = queue_timeout_s(job)
    waited = queue_waited(conditions, job, now)
    if limit is not None and waited >= limit:
        why = f": {unplaced}" if unplaced else ""
        wait = job.spec.placement.queue_timeout if job.spec.placement else None
        return "Failed", "CapacityUnavailable", f"no capacity within queueTimeout {wait or '24h'}{why}"
    return "Queued", "Unschedulable" if unplaced else None, unplaced or "waiting for capacity"


def next_check(job: Job, status: JobStatus, now: datetime, gang: float | None = None) -> float | None:
    """When to look again without an event: a deadline, a queue timeout, a TTL, a gang's assembly budget,
    else the safety net."""
    if status.phase in TERMINAL_PHASES:
        ttl = job.spec.ttl_seconds_after_finished
        return float(ttl) if ttl is not None else None
    checks = [RECHECK_S]
    if gang is not None:
        checks.append(max(gang, 0.05))
    left = deadline_left(msgspec.structs.replace(job, status=status), now)
    if left is not None:
        checks.append(max(left, 0.05))
    limit = queue_timeout_s(job)
    if status.phase == "Queued" and limit is not None:
        checks.append(max(limit - queue_waited(status.conditions, job, now), 0.05))
    return min(checks)


def wanted_runs(job: Job, view: View, halt: str | None) -> list[tuple[int, int]]:
    """(index, attempt number) of the runs to start now, up to parallelism; none when halted."""
    spec = job.spec
    if halt or over_backoff(job, view) or interrupted_fail(job, view):
        return []
    max_attempts = max_attempts_of(job)
    if any(n >= max_attempts for i, n in view.infra.items() if i not in view.succeeded):
        return []  # an index used up its replacements: the Job fails (see phase_of)
    if assembly_exhausted(view):
        return []  # an index's gang never assembled, 1 + maxAssemblyRetries times: the Job fails
    free = (spec.parallelism or 1) - len(view.active)
    runs: list[tuple[int, int]] = []
    succeeded, active, tries = view.succeeded, view.active, view.tries
    for i in range(spec.completions or 1):
        if len(runs) >= free:
            break  # the first ``free`` indexes to run, not a list of all that wait
        if i not in succeeded and i not in active:
            runs.append((i, tries.get(i, 0) + 1))
    return runs


def assembly_exhausted(view: View) -> bool:
    """An index's gang timed out assembling 1 + maxAssemblyRetries times in a row."""
    gang = view.gang
    return gang is not None and any(
        n > gang.max_assembly_retries for i, n in view.assembly.items() if i not in view.succeeded
    )


def gang_check(view: View, now: datetime) -> float | None:
    """Seconds until a gang attempt of the view must be judged again without an event: the end of an
    assembly's budget, or the moment an incomplete gang attempt is abandoned."""
    shape = view.gang
    if shape is None:
        return None
    times: list[datetime] = []
    for g in view.gangs:
        created = g.created
        if not g.active or created is None:
            continue
        if not g.complete:
            times.append(created + timedelta(seconds=ABANDON_AFTER_S))
        elif any(a.status.phase == "Pending" for a in g.members.values()):
            deadline = g.deadline(shape)
            if deadline is not None:
                times.append(deadline)
            times.append(created + timedelta(seconds=REASSIGN_AFTER_S))
    return min((t - now).total_seconds() for t in times) if times else None


def lost_on(node: Node | None) -> Callable[[Attempt], Attempt | None]:
    """:func:`as_lost` with the node's last heartbeat (its own clock) as where billing stops."""
    beat = node.status.last_heartbeat_time if node is not None else None
    heartbeat_ms = int(parse_time(beat).timestamp() * 1000) if beat else None
    return functools.partial(as_lost, heartbeat_ms=heartbeat_ms)


def as_lost(a: Attempt, heartbeat_ms: int | None = None) -> Attempt | None:
    """The Attempt lost with its node. ``heartbeat_ms``, the node's last heartbeat (its own clock), is
    where billing stops: what the program ran until then is charged, the rest up to the loss is covered
    by Nodus (nodus_billing.segmenting)."""
    if a.status.phase in ATTEMPT_TERMINAL:
        return None
    return msgspec.structs.replace(
        a,
        status=msgspec.structs.replace(
            a.status,
            phase="Lost",
            reason="NodeLost",
            finish_time=now_rfc3339(),
            message=f"node {a.spec.node} stopped heartbeating",
            billing_stop_ms=heartbeat_ms,
        ),
    )


def previous_run(lookup: Callable[[str | None, str], Attempt | None], attempt: Attempt) -> str | None:
    """The run this one continues: the index's previous Attempt, if it ever started."""
    if attempt.spec.attempt <= 1:
        return None
    meta = attempt.metadata
    name = (meta.name or "").rsplit("-a", 1)[0] + f"-a{attempt.spec.attempt - 1}"
    prev = lookup(meta.namespace, name)
    return name if prev is not None and prev.status.start_time else None


def explain_placement(why: str, previous: Attempt | None) -> str:
    if previous is not None:
        why += f"; replaces {previous.metadata.name} ({previous.status.reason or previous.status.phase})"
    return why


def measures(succeeded: list[Attempt]) -> tuple[int | None, str | None]:
    """Wall seconds (the longest index: they run side by side) and mean throughput of the indexes."""
    walls = [a.status.wall_millis for a in succeeded if a.status.wall_millis is not None]
    units = [Decimal(a.status.units_per_second) for a in succeeded if a.status.units_per_second]
    wall = (max(walls) + 500) // 1000 if walls else None
    # Plain digits, never an exponent: str() of a normalised 670 is "6.7E+2", which tables showed as is.
    mean = format((sum(units, Decimal(0)) / len(units)).normalize(), "f") if units else None
    return wall, mean


def outputs_of(succeeded: Mapping[int, Attempt]) -> list[OutputRecord]:
    """Every output the indexes committed, by index then as each Attempt listed them."""
    return [o for _, a in sorted(succeeded.items()) for o in a.status.outputs]


def compress(indexes: list[int]) -> str:
    """Kubernetes' completedIndexes form: [0,1,2,3,5] -> "0-3,5"."""
    out: list[str] = []
    start = prev = None
    for i in indexes:
        if start is None:
            start = prev = i
        elif prev is not None and i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


def job_status(
    job: Job, view: View, unplaced: str | None, now: datetime, catalog: Catalog, block: Block | None = None
) -> JobStatus:
    """The Job's status from what its Attempts say: counts, the phase and its reason, the conditions, and
    on a terminal phase the completion time, wall time, throughput and outputs."""
    spec, old = job.spec, job.status
    completions = spec.completions or 1
    conditions = [msgspec.structs.replace(c) for c in old.conditions]  # set_condition changes in place
    status = msgspec.structs.replace(
        old,
        active=len(view.active),
        succeeded=len(view.succeeded),
        failed=view.failures,
        attempts=sum(view.tries.values()),
        completed_indexes=compress(sorted(view.succeeded)) or None,
        observed_generation=job.metadata.generation,
    )
    status = pin_pricebook(status, catalog)  # placed and priced at this version from now on
    if view.gang is not None and not status.topology and view.gangs:
        # "<nodes>x<gpusPerNode>", once the gang is placed (unless resolved at admission).
        placed = view.gangs[0].ranked[0].spec.offering
        offering = catalog_for(job, catalog).offering(placed)
        status = msgspec.structs.replace(
            status, topology=view.gang.topology(offering.gpus_per_node if offering else None)
        )
    if view.tries and not status.start_time:
        status = msgspec.structs.replace(status, start_time=format_time(now))
    status = track_suspension(job, status, conditions, now, block)
    phase, reason, message = phase_of(job, view, unplaced, completions, conditions, now, block)
    if phase in TERMINAL_PHASES:
        wall, units = measures(list(view.succeeded.values()))
        status = msgspec.structs.replace(
            status,
            completion_time=old.completion_time or format_time(now),
            wall_seconds=wall,
            units_per_second=units,
            outputs=outputs_of(view.succeeded),
        )
    stamp = format_time(now)
    gen = job.metadata.generation
    scheduled = "True" if view.active or view.succeeded or phase in TERMINAL_PHASES else "False"
    set_condition(
        conditions,
        Condition(
            type="Scheduled",
            status=scheduled,
            reason="Placed" if scheduled == "True" else "Unschedulable" if unplaced else "Waiting",
            message=None if scheduled == "True" else unplaced or "waiting for capacity",
            observed_generation=gen,
        ),
        now=stamp,
    )
    if phase not in ("Queued", "Pending"):
        set_condition(
            conditions,
            Condition(
                type="Complete" if phase == "Succeeded" else "Failed" if phase == "Failed" else "Running",
                status="True",
                reason=reason or phase,
                message=message,
                observed_generation=gen,
            ),
            now=stamp,
        )
    return msgspec.structs.replace(status, phase=phase, reason=reason, message=message, conditions=conditions)
