"""The binder's line (issue #21): first come, first served across projects and profiles; earliest
completeByTime first among the places a project and profile already hold. Pure: examples, then properties."""

from __future__ import annotations

import random
from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st

from nodus_scheduler.binding import Demand
from nodus_scheduler.ordering import Place, deadline_micros, in_line, place_of
from nodus_schema.jobs import Job, JobSpec, Placement
from nodus_schema.meta import ObjectMeta

EARLY = deadline_micros("1970-01-01T00:00:00Z")


def at(second: int, namespace: str = "a", deadline: str | None = None, profile: str = "Balanced") -> Place:
    return Place(
        created=(f"2026-11-30T05:00:{second:02d}Z", f"uid-{second:02d}"),
        group=(namespace, profile),
        deadline=deadline_micros(deadline),
    )


def line(**places: Place) -> list[str]:
    return in_line(places.items())


def test_without_deadlines_the_line_is_first_come_first_served() -> None:
    assert line(c=at(3), a=at(1), b=at(2, "other")) == ["a", "b", "c"]


def test_a_deadline_takes_its_projects_earliest_place() -> None:
    # a (no deadline) came first, b (a deadline) later: b takes a's place, a takes b's.
    assert line(a=at(1), b=at(2, deadline="2030-01-01T00:00:00Z")) == ["b", "a"]


def test_earliest_deadline_first_then_none_last_then_creation() -> None:
    got = line(
        a=at(1),
        b=at(2, deadline="2030-06-01T00:00:00Z"),
        c=at(3, deadline="2030-01-01T00:00:00Z"),
        d=at(4),
        e=at(5, deadline="2030-01-01T00:00:00+00:00"),  # the same instant as c, written otherwise
    )
    assert got == ["c", "e", "b", "a", "d"]


def test_an_early_deadline_never_jumps_another_projects_earlier_job() -> None:
    # The attacker's completeByTime is 1970; the victim's Job came first and keeps its place.
    assert line(victim=at(1, "victim"), attacker=at(2, "attacker", "1970-01-01T00:00:00Z")) == [
        "victim",
        "attacker",
    ]
    # With Jobs of its own in the line, the attacker only reorders them among their own places.
    got = line(
        mine1=at(1, "attacker"),
        victim=at(2, "victim"),
        mine2=at(3, "attacker", "1970-01-01T00:00:00Z"),
    )
    assert got == ["mine2", "victim", "mine1"]


def test_profiles_are_groups_of_their_own() -> None:
    got = line(
        speed=at(1, profile="Speed"),
        cost_old=at(2, profile="Cost"),
        cost_urgent=at(3, deadline="2030-01-01T00:00:00Z", profile="Cost"),
    )
    assert got == ["speed", "cost_urgent", "cost_old"]


def test_a_deadline_that_does_not_parse_counts_as_none() -> None:
    assert deadline_micros("tomorrow") is None and deadline_micros(None) is None
    assert EARLY == 0 and deadline_micros("1969-12-31T23:59:59Z") == -1_000_000


def test_a_jobs_place_defaults_its_profile_and_reads_its_deadline() -> None:
    meta = ObjectMeta(namespace="p", name="j", uid="u1", creation_timestamp="2026-11-30T05:00:00Z")
    plain = place_of(Job(metadata=meta, spec=JobSpec()))
    assert plain == Place(created=("2026-11-30T05:00:00Z", "u1"), group=("p", "Balanced"), deadline=None)
    spec = JobSpec(placement=Placement(profile="Speed"), complete_by_time="1970-01-01T00:00:01Z")
    assert place_of(Job(metadata=meta, spec=spec)) == Place(
        created=("2026-11-30T05:00:00Z", "u1"), group=("p", "Speed"), deadline=1_000_000
    )
    # The binder's Demand works its place out once.
    demand = Demand(Job(metadata=meta, spec=spec), [(0, 1)])
    assert demand.place is demand.place and demand.place.group == ("p", "Speed")


# -- properties --------------------------------------------------------------------------------------------

DEADLINES = st.one_of(st.none(), st.integers(min_value=-(10**15), max_value=10**15))
ENTRY = st.tuples(
    st.integers(min_value=0, max_value=30),  # creation second: ties happen, the uid breaks them
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["Balanced", "Speed"]),
    DEADLINES,
)


@st.composite
def lines(draw: st.DrawFn) -> dict[str, Place]:
    entries = draw(st.lists(ENTRY, max_size=40))
    return {
        f"j{i}": Place(created=(f"t{second:02d}", f"u{i:03d}"), group=(ns, profile), deadline=deadline)
        for i, (second, ns, profile, deadline) in enumerate(entries)
    }


def by_place(places: dict[str, Place]) -> list[str]:
    return sorted(places, key=lambda k: places[k].created)


@given(lines())
def test_the_line_is_a_permutation(places: dict[str, Place]) -> None:
    got = in_line(places.items())
    assert sorted(got) == sorted(places) and len(got) == len(places)


@given(lines())
def test_each_group_keeps_the_positions_its_places_hold(places: dict[str, Place]) -> None:
    """FIFO across groups: position i belongs to the same group with or without deadlines."""
    got = in_line(places.items())
    assert [places[k].group for k in got] == [places[k].group for k in by_place(places)]


@given(lines(), st.sampled_from([("a", "Balanced"), ("b", "Speed")]), st.data())
def test_no_group_moves_another_by_its_deadlines(
    places: dict[str, Place], group: tuple[str, str], data: st.DataObject
) -> None:
    """Whatever deadlines one group sets (1970 included), every other group's Jobs stay where they were."""
    before = in_line(places.items())
    changed = {
        k: Place(p.created, p.group, data.draw(DEADLINES)) if p.group == group else p
        for k, p in places.items()
    }
    after = in_line(changed.items())
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        if places[old].group != group:
            assert new == old, i


@given(lines())
def test_inside_a_group_the_earliest_deadline_goes_first(places: dict[str, Place]) -> None:
    got = in_line(places.items())
    members: dict[tuple[str, str], list[Place]] = defaultdict(list)
    for k in got:
        members[places[k].group].append(places[k])
    for group in members.values():
        assert [p.urgency for p in group] == sorted(p.urgency for p in group)


@given(lines(), st.randoms(use_true_random=False))
def test_the_order_is_stable_whatever_order_the_line_was_filled_in(
    places: dict[str, Place], rnd: random.Random
) -> None:
    items = list(places.items())
    rnd.shuffle(items)
    assert in_line(items) == in_line(places.items())


@given(lines())
def test_without_deadlines_nothing_changes(places: dict[str, Place]) -> None:
    plain = {k: Place(p.created, p.group) for k, p in places.items()}
    assert in_line(plain.items()) == by_place(plain)
