"""The history of settled runs (issue #23): what the meter files out of a project's book, one record per
Job in the ``history`` bucket (key ``<project>.<job>-<uid>``), and what the usage report reads back.

A book is written whole at every commit of its project, so a hold that settled long ago would cost every
later commit its bytes (a 1,000-cell Sweep filled the bus's largest message). Once a Job is final (its
cost written final) or gone, the meter writes its settled holds and their netted entries here first, then
files them out of the book (``filing.File``). A crash in between leaves a record the book still holds too:
the report reads the book's copy (the same hold) and the next pass files it. Records are only ever added
to, never changed in what they say: a hold's record is final once it settled.
"""

from __future__ import annotations

from typing import Final

import msgspec
from nats.aio.client import Client as NATS

from nodus_billing.accounting import Entry
from nodus_billing.filing import fileable
from nodus_billing.standing import Hold, State
from nodus_kit.errors import AlreadyExists
from nodus_kit.storing import ObjectStore
from nodus_schema.meta import ObjectMeta
from nodus_schema.wire import API_VERSION, Wire

BUCKET: Final = "history"


class JobHistory(Wire):
    """The settled runs of one Job filed out of its project's book (namespace: the project)."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "BillingHistory")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    job: str = ""
    """The book's name of the Job (``<name>@<uid>``)."""
    holds: dict[str, Hold] = msgspec.field(default_factory=dict)
    entries: dict[str, Entry] = msgspec.field(default_factory=dict)
    """Each hold's netted ledger entry as the book had it (``hold:<id>:settled``; none for a run that
    charged nothing)."""
    sweep: str | None = None
    """The book's name of the Job's Sweep (a cell), which the usage report names once the book has
    forgotten the Job (``forgetting``; records written before it say None: the book still has those)."""


def record_name(ref: str) -> str:
    """The history record's name of a Job: ``<name>-<uid>`` (the book's ``<name>@<uid>``; ``@`` is no
    key character)."""
    name, at, uid = ref.rpartition("@")
    return f"{name}-{uid}" if at else ref


def settled_of(state: State, ref: str) -> dict[str, Hold]:
    """The Job's holds in the book that :class:`filing.File` takes out (``filing.fileable``)."""
    job = state.jobs.get(ref)
    if job is None:
        return {}
    return {h: hold for h, hold in state.holds.items() if fileable(hold, ref, job)}


class Archive:
    def __init__(self, nc: NATS) -> None:
        self.store = ObjectStore(nc, BUCKET, JobHistory)

    async def record(self, project: str, ref: str, state: State) -> list[str]:
        """Write the Job's settled holds in ``state`` (and their entries) to its history record, adding to
        what it holds; the ids written (to file next)."""
        holds = settled_of(state, ref)
        if not holds:
            return []
        entries = {e: state.ledger[e] for h in holds if (e := f"hold:{h}:settled") in state.ledger}
        name = record_name(ref)
        meta = ObjectMeta(name=name, namespace=project)
        sweep = state.jobs[ref].sweep  # settled_of found the record
        try:
            await self.store.create(
                JobHistory(metadata=meta, job=ref, holds=holds, entries=entries, sweep=sweep)
            )
        except AlreadyExists:

            def add(current: JobHistory) -> JobHistory | None:
                if holds.keys() <= current.holds.keys() and current.sweep == sweep:
                    return None  # written by an earlier pass that did not get to file them
                merged = {**current.holds, **holds}
                return msgspec.structs.replace(
                    current, holds=merged, entries={**current.entries, **entries}, sweep=sweep
                )

            await self.store.mutate(project, name, add)
        return sorted(holds)

    async def records(self, project: str) -> list[JobHistory]:
        """Every Job's history record of the project."""
        return list((await self.store.list(project)).items)

    async def holds(self, project: str) -> dict[str, Hold]:
        """Every hold filed out of the project's book, by id."""
        return filed_holds(await self.records(project))

    async def runs(self, project: str, state: State) -> dict[str, Hold]:
        """Every run's hold of the project: those filed, and those in its book ``state`` (the book's copy
        of one in both: written by a pass that did not get to file it)."""
        return {**(await self.holds(project)), **state.holds}


def filed_holds(records: list[JobHistory]) -> dict[str, Hold]:
    """The holds of these history records, by id."""
    return {h: hold for record in records for h, hold in record.holds.items()}
