"""What billing's leader reads from memory: the informers of the kinds it meters (issue #19).

The meter reads Jobs, their Attempts, their Sweeps and the funding records from shared informers
(:mod:`nodus_kit.informing`), never from the store per reconcile, so a resync over 10,000 stored Jobs walks
dicts instead of listing a namespace per Job. The indexes answer the meter's questions without a scan:

* Attempts by their Job (``BY_JOB``, the ``nodus.dev/job`` label within the namespace): the runs a
  reconcile captures, charges and extends;
* Jobs by their Sweep (``BY_SWEEP``, the ``nodus.dev/sweep`` label within the namespace): the cells a
  Sweep's new cap concerns;
* Jobs and Sweeps by the Pipeline that controls them (``BY_PIPELINE``, their controller ownerReference of
  kind Pipeline, within the namespace): the stages a Pipeline's new cap concerns, and through the Sweep
  stages, their cells (issue #22). The Pipelines themselves are read by the uid the reference names;
* funding records that block their Job, by project (``BLOCKED``): what a grant or a Budget may unblock;
* the books' settled holds by Job (``UNFILED``): the Jobs, final or gone, whose runs the meter files out of
  the book into the history bucket (``filing``, ``archiving``); and the Jobs the books have a record of
  (``BOOKED``): a deleted one's is folded into its book's totals (``forgetting``);
* the books' open holds by Job (``OPEN``): a light view of the ``accounts`` bucket that decodes each book's
  holds and skips its ledger (:class:`BookGlance`). It answers "is anything of this Job held?" for the
  meter's rest rule (:meth:`nodus_billing.metering.Metering.settled`) and lists the holds the expiry loop
  looks at, without reading a book. The books themselves are still read and written by compare-and-set
  (:class:`~nodus_billing.books.Books`): a reconcile that acts reads the book as stored.

Index values carry the namespace (``"team-a/train"``): an informer watches every namespace.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_billing.books import BUCKET
from nodus_kit.informing import Indexer, Informer
from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import ATTEMPT_TERMINAL, Attempt
from nodus_schema.billing import Funding
from nodus_schema.jobs import Job
from nodus_schema.meta import ObjectMeta
from nodus_schema.pipelines import Pipeline
from nodus_schema.sweeps import Sweep
from nodus_schema.wire import Wire

BY_JOB = "job"
BY_SWEEP = "sweep"
BY_PIPELINE = "pipeline"
BLOCKED = "blocked"
OPEN = "open"
UNFILED = "unfiled"
BOOKED = "booked"


def in_namespace(namespace: str | None, name: str) -> str:
    return f"{namespace or ''}/{name}"


def labelled(label: str) -> Indexer:
    """An indexer by the value of ``label`` within the object's namespace (objects without it: none)."""

    def index(obj: Any) -> Iterable[str]:
        value = obj.metadata.labels.get(label)
        return (in_namespace(obj.metadata.namespace, value),) if value else ()

    return index


def controlled_by(kind: str) -> Indexer:
    """An indexer by the name of the object's controller of ``kind`` (its ownerReference with ``controller:
    true``) within its namespace; only a controller counts, as the book decides (``putting``)."""

    def index(obj: Any) -> Iterable[str]:
        ref = next((o for o in obj.metadata.owner_references if o.controller), None)
        if ref is None or ref.kind != kind or not ref.name:
            return ()
        return (in_namespace(obj.metadata.namespace, ref.name),)

    return index


def blocked(record: Funding) -> Iterable[str]:
    """A funding record that blocks its Job, filed under its project."""
    return (record.metadata.namespace or "",) if record.blocked is not None else ()


class HoldGlance(Wire):
    """A hold as the expiry loop and the rest rule see it (the rest of :class:`standing.Hold` is skipped
    when decoding: the same JSON, read in part)."""

    job: str
    status: str = "Open"  # the book omits the default, as standing.Hold declares it
    funded_until_ms: int = 0


class JobGlance(Wire):
    """A Job's record in a book, none of it read: only that the book has one."""


class StateGlance(Wire):
    holds: dict[str, HoldGlance] = msgspec.field(default_factory=dict)
    jobs: dict[str, JobGlance] = msgspec.field(default_factory=dict)


class BookGlance(Wire):
    """A project's book without its ledger, balances, results and records, but the names of its Jobs
    (key: the project)."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    state: StateGlance = msgspec.field(default_factory=StateGlance)

    def open_holds(self) -> list[HoldGlance]:
        return [h for h in self.state.holds.values() if h.status == "Open"]


def glances(nc: NATS) -> ObjectStore[BookGlance]:
    """The ``accounts`` bucket read as glances (never written through this store)."""
    return ObjectStore(nc, BUCKET, BookGlance)


def open_holds(book: BookGlance) -> Iterable[str]:
    """A book filed under every Job (by name, whichever uid) that has an open hold in it."""
    project = book.metadata.name or ""
    return {in_namespace(project, h.job.rsplit("@", 1)[0]) for h in book.open_holds()}


def booked(book: BookGlance) -> Iterable[str]:
    """A book filed under every Job (by name, whichever uid) it has a record of."""
    project = book.metadata.name or ""
    return {in_namespace(project, ref.rsplit("@", 1)[0]) for ref in book.state.jobs}


def settled_holds(book: BookGlance) -> Iterable[str]:
    """A book filed under every Job (by name, whichever uid) that has a settled hold in it: what the meter
    files out of the book once the Job is final or gone (``filing``)."""
    project = book.metadata.name or ""
    return {
        in_namespace(project, h.job.rsplit("@", 1)[0])
        for h in book.state.holds.values()
        if h.status != "Open"
    }


@dataclass(frozen=True)
class Views:
    """The informers the meter reads; started by its controller (and the service, for the ones no
    controller watches), stopped by the service."""

    jobs: Informer[Job]
    attempts: Informer[Attempt]
    sweeps: Informer[Sweep]
    funding: Informer[Funding]
    books: Informer[BookGlance]
    pipelines: Informer[Pipeline]

    def all(self) -> list[Informer[Any]]:
        return [self.jobs, self.attempts, self.sweeps, self.funding, self.books, self.pipelines]

    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.all())

    def attempts_of(self, namespace: str | None, job: str) -> list[Attempt]:
        return self.attempts.by_index(BY_JOB, in_namespace(namespace, job))

    def running(self, namespace: str | None, job: str) -> bool:
        """Whether an Attempt of a Job of this name (any uid) has not ended."""
        return any(a.status.phase not in ATTEMPT_TERMINAL for a in self.attempts_of(namespace, job))

    def held(self, namespace: str | None, job: str) -> bool:
        """Whether a book holds an open hold of a Job of this name (any uid). Unsure (the view not listed
        yet) counts as held."""
        if not self.books.synced.is_set():
            return True
        return bool(self.books.by_index(OPEN, in_namespace(namespace, job)))

    def unfiled(self, namespace: str | None, job: str) -> bool:
        """Whether a book holds a settled hold of a Job of this name (any uid): one to file. Unsure (the
        view not listed yet) counts as not: the view's listing brings every such Job back (``Metering``)."""
        return bool(self.books.by_index(UNFILED, in_namespace(namespace, job)))

    def booked(self, namespace: str | None, job: str) -> bool:
        """Whether a book has a record of a Job of this name (any uid): a deleted one is forgotten
        (``forgetting``). Unsure (the view not listed yet) counts as not, as for :meth:`unfiled`."""
        return bool(self.books.by_index(BOOKED, in_namespace(namespace, job)))

    def blocks(self, job: Job) -> bool:
        """Whether billing blocks this Job (its funding record, of its uid). Unsure counts as blocked."""
        if not self.funding.synced.is_set():
            return True
        record = self.funding.get(job.metadata.namespace, job.metadata.name or "")
        return record is not None and record.job_uid == job.metadata.uid and record.blocked is not None

    def cells(self, namespace: str | None, sweep: str) -> list[Job]:
        return self.jobs.by_index(BY_SWEEP, in_namespace(namespace, sweep))

    def stages(self, namespace: str | None, pipeline: str) -> list[Job]:
        """The Jobs under a Pipeline of this name (any uid): its Job stages and its Sweep stages' cells."""
        at = in_namespace(namespace, pipeline)
        sweeps = self.sweeps.by_index(BY_PIPELINE, at)
        cells = [j for s in sweeps for j in self.cells(s.metadata.namespace, s.metadata.name or "")]
        return self.jobs.by_index(BY_PIPELINE, at) + cells

    def blocked_in(self, project: str) -> list[Funding]:
        return self.funding.by_index(BLOCKED, project)
