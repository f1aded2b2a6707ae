"""Warm capacity (``spec.scaledownWindow``, issue #21, ADR-0038): when a window is open, when it ends, and
what it costs. Pure: the scheduler (who may reuse a node) and billing (who charges the window) read the
same rules from the same Attempt fields, so they never disagree about when a window ended.

A run of a Job that set a scaledownWindow ends on a node that is still Ready: the scheduler records, with
the finish, ``status.warmSinceMs`` (the run's billing stop) and ``status.warmUntilMs`` (since + window).
From then the node is reserved for the run's project (its namespace): the next Attempt of that project that
fits goes there first (``spec.warmFrom`` names the *keeper*), and no other project's run is placed there.

The window ends at the earliest of

* ``warmUntilMs``: it ran out;
* the creation of the run that reused it (an Attempt whose ``spec.warmFrom`` is the keeper);
* ``warmEndMs``: ended early, by billing when the keeping Job's cap or the project's credit would be
  exceeded, or by the scheduler when the node stopped being Ready or the keeping Job was deleted.

The Job that kept the node pays for the window, at the rate of its run, as its Teardown segment.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Final

import msgspec

from nodus_schema.attempts import Attempt
from nodus_schema.jobs import JobSpec
from nodus_schema.meta import parse_time
from nodus_schema.quantities import parse_duration

__all__ = [
    "KEEPS_WARM_PHASES",
    "NO_WARM_REASONS",
    "keeps_warm",
    "open_at",
    "scaledown_window",
    "window_end_ms",
    "window_ms",
    "with_end",
]

KEEPS_WARM_PHASES: Final = frozenset({"Succeeded", "Failed", "Stopped"})
"""Runs that end with their node still in hand: the program exited, or Nodus stopped it."""
NO_WARM_REASONS: Final = frozenset(
    {"Lost", "NodeLost", "AgentLost", "LaunchFailed", "Preempted", "Interrupted", "GPUFault", "NodeDrained"}
)
"""Endings that say the capacity itself is gone or unfit: nothing to keep warm."""


def scaledown_window(spec: JobSpec) -> timedelta:
    """The Job's scaledownWindow (0 when unset or unreadable: admission refuses an unreadable one)."""
    if not spec.scaledown_window:
        return timedelta(0)
    try:
        return max(parse_duration(spec.scaledown_window), timedelta(0))
    except ValueError:
        return timedelta(0)


def keeps_warm(spec: JobSpec, phase: str, reason: str | None) -> bool:
    """Whether a run of a Job with this spec that ended so keeps its node warm for its project."""
    return (
        scaledown_window(spec) > timedelta(0)
        and phase in KEEPS_WARM_PHASES
        and (reason or "") not in NO_WARM_REASONS
    )


def window_end_ms(keeper: Attempt, reusers: Iterable[Attempt] = ()) -> int | None:
    """When the keeper's window ends (or ended), None when it never had one. ``reusers``: Attempts whose
    ``spec.warmFrom`` names it (normally at most one; the earliest creation counts)."""
    st = keeper.status
    if st.warm_since_ms is None or st.warm_until_ms is None:
        return None
    end = st.warm_until_ms
    if st.warm_end_ms is not None:
        end = min(end, st.warm_end_ms)
    for reuser in reusers:
        created = _epoch_ms(reuser.metadata.creation_timestamp)
        if created is not None:
            end = min(end, created)
    return max(end, st.warm_since_ms)


def open_at(keeper: Attempt, now_ms: int, reusers: Iterable[Attempt] = ()) -> bool:
    """Whether the keeper's window is still open at ``now_ms`` (a node reserved for its project)."""
    end = window_end_ms(keeper, reusers)
    return end is not None and now_ms < end


def window_ms(keeper: Attempt, now_ms: int, reusers: Iterable[Attempt] = ()) -> int:
    """How long the window has lasted by ``now_ms`` (all of it once it ended): what its Teardown charges."""
    end = window_end_ms(keeper, reusers)
    since = keeper.status.warm_since_ms
    if end is None or since is None:
        return 0
    return max(0, min(end, now_ms) - since)


def _epoch_ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(parse_time(text).timestamp() * 1000)
    except ValueError:
        return None


def with_end(attempt: Attempt, end_ms: int) -> Attempt | None:
    """``attempt`` with its window ended at ``end_ms`` (``warmEndMs``), for a compare-and-set; None when it
    kept no window or an end is already written (the scheduler and billing both end windows: first wins)."""
    st = attempt.status
    if st.warm_end_ms is not None or st.warm_until_ms is None:
        return None
    return msgspec.structs.replace(attempt, status=msgspec.structs.replace(st, warm_end_ms=end_ms))
