"""Gangs: a distributed Job runs each index as N members on N nodes that start together and restart together
(ADR-0016). This module holds what the lifecycle and the binder need to know about gangs, pure and
testable on its own:

* :func:`shape_of`: the gang of a Job spec (nodes, GPUs per node, network class, launcher, assembly
  budget), or None for a plain Job;
* :func:`choose_gang`: all-or-nothing placement of N members within one network class (Colocated: one
  provider and region class; Regional: one region class; Global: anywhere), reserving each chosen node in
  the capacity index and releasing every one of them when the gang does not fit whole;
* :class:`GangAttempt` and :func:`gang_attempts`: the member Attempts of a Job grouped by gang attempt,
  and what the store says about each: whether it is complete, assembled, why it must be torn down
  (:meth:`GangAttempt.trouble`), and how it ended (:meth:`GangAttempt.verdict`).

Everything here is derived from the store (the Attempts and their ``endedBy`` marks) and the clock, so a
scheduler that restarts decides the same again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from nodus_scheduler.capacity import CapacityIndex
from nodus_scheduler.placing import NoPlacement, Placement, demand_of, place_demand, request_of
from nodus_schema.attempts import ATTEMPT_TERMINAL, GANG_LABEL, Attempt
from nodus_schema.catalog import Catalog, Offering
from nodus_schema.jobs import JobSpec
from nodus_schema.meta import parse_time
from nodus_schema.quantities import parse_duration

__all__ = [
    "ABANDON_AFTER_S",
    "ASSEMBLY_TIMEOUT",
    "GANG_INCOMPLETE",
    "GangAttempt",
    "Shape",
    "choose_gang",
    "gang_attempts",
    "shape_of",
]

DEFAULT_STARTUP_TIMEOUT: Final = "15m"
DEFAULT_MAX_ASSEMBLY_RETRIES: Final = 2
DEFAULT_NETWORK: Final = "Colocated"
DEFAULT_LAUNCHER: Final = "Plain"
TORCH_PORT: Final = 29500
"""The rendezvous port of torch.distributed (torchrun's and DeepSpeed's default MASTER_PORT)."""
RAY_PORT: Final = 6379
"""The Ray head's GCS port (``ray start --head``'s default)."""
RAY_LAUNCHERS: Final = frozenset({"Ray", "Verl"})

ASSEMBLY_TIMEOUT: Final = "AssemblyTimeout"
"""``endedBy`` of the members of a gang attempt that did not assemble within startupTimeout."""
GANG_INCOMPLETE: Final = "GangIncomplete"
"""``endedBy`` of the members of a gang attempt whose other members were never created (a crash between
the creates): they were never assigned, so the scheduler finishes them itself."""
GANG_RESTART: Final = "GangRestart"
"""The stop reason of the members of a gang attempt that another member's failure or loss ended."""
ABANDON_AFTER_S: Final = 5.0
"""A gang attempt with members missing this long after its first member was created is abandoned."""


# ---------------------------------------------------------------------------------------------------------
# The shape of a gang
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shape:
    """What spec.distributed asks for, with the reference's defaults for what it leaves unset."""

    nodes: int
    gpus_per_node: int | None
    network: str = DEFAULT_NETWORK
    launcher: str = DEFAULT_LAUNCHER
    startup_timeout: str = DEFAULT_STARTUP_TIMEOUT
    max_assembly_retries: int = DEFAULT_MAX_ASSEMBLY_RETRIES

    @property
    def startup_timeout_s(self) -> float:
        return parse_duration(self.startup_timeout).total_seconds()

    @property
    def master_port(self) -> int:
        return RAY_PORT if self.launcher in RAY_LAUNCHERS else TORCH_PORT

    def topology(self, gpus_per_node: int | None = None) -> str | None:
        """``"<nodes>x<gpusPerNode>"`` (status.topology), with ``gpus_per_node`` where the spec names none."""
        per_node = self.gpus_per_node or gpus_per_node
        return f"{self.nodes}x{per_node}" if per_node else None


def shape_of(spec: JobSpec) -> Shape | None:
    """The gang a Job spec asks for (``distributed``, or ``resources.nodes`` above 1 not yet folded into it),
    or None for a plain Job."""
    d = spec.distributed
    res_nodes = spec.resources.nodes if spec.resources is not None else None
    if d is None and not (res_nodes is not None and res_nodes > 1):
        return None
    request = request_of(spec)
    per_node = (d.gpus_per_node if d is not None else None) or (
        request.count if request is not None else None
    )
    if d is not None and d.nodes:
        nodes = d.nodes
    elif d is not None and d.total_gpus and per_node:
        nodes = d.total_gpus // per_node
    else:
        nodes = res_nodes or 1
    if d is None:
        return Shape(nodes=max(nodes, 1), gpus_per_node=per_node)
    return Shape(
        nodes=max(nodes, 1),
        gpus_per_node=per_node,
        network=d.network or DEFAULT_NETWORK,
        launcher=d.launcher or DEFAULT_LAUNCHER,
        startup_timeout=d.startup_timeout or DEFAULT_STARTUP_TIMEOUT,
        max_assembly_retries=(
            d.max_assembly_retries if d.max_assembly_retries is not None else DEFAULT_MAX_ASSEMBLY_RETRIES
        ),
    )


# ---------------------------------------------------------------------------------------------------------
# Placing a gang: all members or none, in one network class
# ---------------------------------------------------------------------------------------------------------


def _domain(offering: Offering, network: str, book: Catalog) -> frozenset[str] | None:
    """The offerings a gang whose first member landed on ``offering`` may use for the others; None: any."""
    if network == "Global":
        return None
    if network == "Regional":
        return frozenset(o.id for o in book.offerings if o.region_class == offering.region_class)
    return frozenset(
        o.id
        for o in book.offerings
        if o.region_class == offering.region_class and o.provider == offering.provider
    )


def _domain_label(offering: Offering, network: str) -> str:
    if network == "Global":
        return "any region"
    if network == "Regional":
        return f"region {offering.region_class}"
    return f"{offering.provider} {offering.region_class}"


def choose_gang(
    index: CapacityIndex,
    spec: JobSpec,
    book: Catalog,
    shape: Shape,
    *,
    release: Callable[[str], None],
    ceiling_micros: int | None = None,
    now: datetime | None = None,
) -> list[Placement] | str:
    """``shape.nodes`` free nodes for one gang attempt, rank 0 first, every one marked busy in ``index``;
    or why no gang fits, with every node it tried released again (``release``: the node is as busy as the
    store says).

    The first member is the best node placement would choose; the others must share its network class
    (the offerings of its provider and region class for Colocated, of its region class for Regional, any
    for Global). When they do not fit there, that whole class is set aside and the next best node outside
    it starts the next try, so a gang is refused only when no class holds ``nodes`` free nodes that fit.
    """
    base = demand_of(spec, ceiling_micros)
    if shape.gpus_per_node and base.gpu_types is not None:
        base = dataclasses.replace(base, count=shape.gpus_per_node)  # gpusPerNode per node
    everything = base.offerings or frozenset(o.id for o in book.offerings)
    excluded: set[str] = set()
    best: tuple[int, str, str] | None = None  # (members placed, where, why the next did not fit)
    nothing = ""
    while True:
        allowed = everything - excluded
        if not allowed:
            break
        demand = dataclasses.replace(base, offerings=frozenset(allowed)) if excluded else base
        first = place_demand(index, demand, book, now)
        if isinstance(first, NoPlacement):
            nothing = first.message
            break
        picked = [first]
        index.mark_busy(_name(first))
        domain = _domain(first.offering, shape.network, book)
        within = demand if domain is None else dataclasses.replace(base, offerings=domain & everything)
        why = ""
        while len(picked) < shape.nodes:
            more = place_demand(index, within, book, now)
            if isinstance(more, NoPlacement):
                why = more.message
                break
            index.mark_busy(_name(more))
            picked.append(more)
        if len(picked) == shape.nodes:
            return picked
        for p in picked:
            release(_name(p))
        where = _domain_label(first.offering, shape.network)
        if not base.offerings:  # the offerings set aside are the network class's doing, not the user's
            why = why.replace("offering not allowed", f"outside {where}")
        if best is None or len(picked) > best[0]:
            best = (len(picked), where, why)
        if domain is None:
            break  # Global: one class, tried
        excluded |= domain
    head = f"gang of {shape.nodes} nodes"
    if best is None:
        return f"{head}: {nothing}"
    placed, where, why = best
    return (
        f"{head} ({shape.network}): only {placed}/{shape.nodes} members fit together, in {where}; {why}"
        f", counting the {placed} held for this gang as busy"
    )


def _name(p: Placement) -> str:
    return p.node.metadata.name or ""


# ---------------------------------------------------------------------------------------------------------
# What the store says about a gang attempt
# ---------------------------------------------------------------------------------------------------------


@dataclass
class GangAttempt:
    """The members of one gang attempt (one index, one attempt number), by rank."""

    index: int
    number: int
    size: int
    members: dict[int, Attempt] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        first = next(iter(self.members.values()))
        return first.metadata.labels.get(GANG_LABEL, "")

    @property
    def complete(self) -> bool:
        """Every member was created (rank 0 to size - 1)."""
        return set(self.members) >= set(range(self.size))

    @property
    def active(self) -> bool:
        """Some member has not finished: the index is busy (a new gang attempt waits for every member)."""
        return any(a.status.phase not in ATTEMPT_TERMINAL for a in self.members.values())

    @property
    def ranked(self) -> list[Attempt]:
        return [self.members[r] for r in sorted(self.members)]

    @property
    def created(self) -> datetime | None:
        stamps = [
            a.metadata.creation_timestamp for a in self.members.values() if a.metadata.creation_timestamp
        ]
        return min(parse_time(s) for s in stamps) if stamps else None

    @property
    def ended_by(self) -> str | None:
        """The scheduler's mark on a member (AssemblyTimeout, GangIncomplete), if any."""
        return next((a.status.ended_by for a in self.ranked if a.status.ended_by), None)

    @property
    def assembled(self) -> bool:
        """Every member started and the gang was not torn down for not assembling."""
        return (
            self.complete
            and self.ended_by is None
            and all(a.status.start_time for a in self.members.values())
        )

    @property
    def started(self) -> int:
        """Members running or done (they reported started)."""
        return sum(a.status.phase != "Pending" for a in self.members.values())

    def deadline(self, shape: Shape) -> datetime | None:
        """When the assembly budget runs out: startupTimeout after the first member was created."""
        created = self.created
        return None if created is None else created + timedelta(seconds=shape.startup_timeout_s)

    def representative(self) -> Attempt:
        """The member the Job's counters show: the least advanced unfinished one (a Pending member while the
        gang assembles, so the Job is Running only once every member runs), else rank 0."""
        order = {"Pending": 0, "Running": 1}
        live = [a for a in self.ranked if a.status.phase in order]
        if live:
            return min(live, key=lambda a: order[a.status.phase])
        return self.ranked[0]

    def trouble(self, now: datetime, shape: Shape, in_flight: Iterable[str] = ()) -> str | None:
        """Why this unfinished gang attempt must be torn down now, or None while it is healthy (or not yet
        judgeable): GangIncomplete, AssemblyTimeout, or GangRestart (a member failed, was lost or stopped)."""
        if not self.active:
            return None
        created = self.created
        if not self.complete:
            if self.name in set(in_flight) or created is None:
                return None  # the binder is creating its members right now
            return GANG_INCOMPLETE if (now - created).total_seconds() >= ABANDON_AFTER_S else None
        if self.ended_by is not None:
            return self.ended_by
        if any(a.status.phase in ATTEMPT_TERMINAL and a.status.phase != "Succeeded" for a in self.ranked):
            return GANG_RESTART
        deadline = self.deadline(shape)
        pending = any(a.status.phase == "Pending" for a in self.members.values())
        if pending and deadline is not None and now >= deadline:
            return ASSEMBLY_TIMEOUT
        return None

    def verdict(self) -> str | None:
        """How the gang attempt ended, once every member has: Succeeded; AssemblyTimeout; Abandoned (never
        complete: nobody ran); Lost (a member lost its node: infrastructure, recovery.maxAttempts); Failed
        (a member failed: the customer's, backoffLimit); Stopped (stopped on request: counts nowhere).
        None while a member is unfinished."""
        if self.active:
            return None
        phases = {a.status.phase for a in self.members.values()}
        if self.complete and phases == {"Succeeded"}:
            return "Succeeded"
        if self.ended_by == ASSEMBLY_TIMEOUT:
            return ASSEMBLY_TIMEOUT
        if self.ended_by == GANG_INCOMPLETE or not self.complete:
            return "Abandoned"
        if "Lost" in phases:
            return "Lost"  # a peer's crash after a node vanished is the loss's doing, not the program's
        if "Failed" in phases:
            return "Failed"
        return "Stopped"

    def ran_for(self) -> float:
        """Seconds the whole gang ran: from its last member's start to its first member's end (0 if it never
        assembled)."""
        starts = [a.status.start_time for a in self.members.values()]
        ends = [a.status.finish_time for a in self.members.values() if a.status.finish_time]
        if not self.complete or not all(starts) or not ends:
            return 0.0
        began = max(parse_time(s) for s in starts if s)
        ended = min(parse_time(e) for e in ends)
        return max((ended - began).total_seconds(), 0.0)

    def describe(self) -> str:
        """What broke the gang, for events and messages: the first member that ended otherwise than well."""
        for a in self.ranked:
            if a.status.phase in ATTEMPT_TERMINAL and a.status.phase != "Succeeded":
                why = a.status.reason or a.status.phase
                return f"member {a.spec.rank} on {a.spec.node} ended {a.status.phase} ({why})"
        return "a member ended"


def gang_attempts(attempts: Iterable[Attempt], size: int) -> list[GangAttempt]:
    """The member Attempts grouped by (index, gang attempt number), in that order; ``size`` is the Job's gang
    size, for members that do not record theirs."""
    groups: dict[tuple[int, int], GangAttempt] = {}
    for a in attempts:
        key = (a.spec.index, a.spec.attempt)
        g = groups.get(key)
        if g is None:
            g = groups[key] = GangAttempt(a.spec.index, a.spec.attempt, a.spec.gang_size or size)
        g.members[a.spec.rank if a.spec.rank is not None else 0] = a
    return [groups[k] for k in sorted(groups)]
