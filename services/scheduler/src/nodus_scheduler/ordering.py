"""Ordering: the binder's line of waiting Jobs. First come, first served across projects; earliest
deadline first inside one (``spec.completeByTime``, issue #21).

A Job's **place** is where it joined the line: its creation time, then its uid (ADR-0015). Its **group**
is its namespace (the project) and its placement profile (defaulted: Balanced). The line is built in two
steps:

1. Every waiting Job is sorted by place. This fixes which *positions* of the line each group holds: the
   sorted multiset of its members' places.
2. Inside each group, the members are dealt out to the group's own positions in order of urgency:
   ``completeByTime`` (none = last), then place.

So a deadline only reorders a project's own Jobs among the positions they already hold: a Job of another
project sees exactly the same positions taken by this project whatever deadlines it sets. A tenant that
writes ``completeByTime: 1970-01-01T00:00:00Z`` gains nothing it could not get by creating its Jobs in
another order; it can never jump another project's earlier Job. Inside one project and profile the
earliest deadline goes first, and Jobs without one keep their creation order behind those with one.

Why the profile is part of the group: Jobs of one profile ask for the same kind of placement (the
fastest, the cheapest, the balance of both), so earliest-deadline-first among them trades like for like.
Across profiles the project's own creation order stands: a deadline on a Cost Job (one that said it can
wait for cheap capacity) never moves the project's Speed Jobs back, nor the other way round.

Pure, O(n log n) in the length of the line (one sort by place, one sort per group), as the binder's sort
by place was.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, TypeVar

from nodus_schema.defaulting import DEFAULT_PROFILE
from nodus_schema.jobs import Job
from nodus_schema.meta import parse_time

K = TypeVar("K")

Group = tuple[str, str]
"""(namespace, placement profile): the Jobs whose order a deadline may change among themselves."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Place:
    """Where a Job stands: its place in line, its group, and its deadline."""

    created: tuple[str, str]
    """(creationTimestamp, uid): where the Job joined the line (a suspended Job keeps it)."""
    group: Group
    deadline: int | None = None
    """spec.completeByTime in microseconds since 1970 (negative before), or None."""

    @property
    def urgency(self) -> tuple[bool, int, tuple[str, str]]:
        """The order inside a group: the earliest deadline first, none last, then the place."""
        return (self.deadline is None, self.deadline or 0, self.created)


def deadline_micros(text: str | None) -> int | None:
    """``completeByTime`` as microseconds since 1970; None when unset or not a time (admission refuses one
    that does not parse, so a stored Job has none such: it is treated as no deadline, never as urgent)."""
    if not text:
        return None
    try:
        return (parse_time(text) - _EPOCH) // timedelta(microseconds=1)
    except (ValueError, OverflowError):
        return None


def place_of(job: Job) -> Place:
    meta, spec = job.metadata, job.spec
    profile = (spec.placement.profile if spec.placement else None) or DEFAULT_PROFILE
    return Place(
        created=(meta.creation_timestamp or "", meta.uid or ""),
        group=(meta.namespace or "", profile),
        deadline=deadline_micros(spec.complete_by_time),
    )


def in_line(entries: Iterable[tuple[K, Place]]) -> list[K]:
    """The keys of ``entries`` in the order the binder serves them (see the module's docstring)."""
    by_place = sorted(entries, key=lambda e: e[1].created)
    line = [key for key, _ in by_place]
    if all(place.deadline is None for _, place in by_place):
        return line  # no deadline anywhere: the line is the order of places
    positions: dict[Group, list[int]] = {}
    for i, (_, place) in enumerate(by_place):
        positions.setdefault(place.group, []).append(i)
    for held in positions.values():
        if len(held) < 2 or all(by_place[i][1].deadline is None for i in held):
            continue  # already in the order of places
        members = sorted(held, key=lambda i: by_place[i][1].urgency)
        for position, member in zip(held, members, strict=True):
            line[position] = by_place[member][0]
    return line
