"""The books: one billing :class:`State` per project in the ``accounts`` bucket, changed only by ``apply``.

Every change is a compare-and-set of the project's book. Concurrent callers for the same project are
committed together (group commit): the operations of everyone waiting are applied in arrival order to one
read of the book and written back in one KV update, so a burst of holds costs one fsync, not one each. A
lost race (another replica wrote first) reads the book again and applies the same operations again;
since every operation is idempotent by its id (ADR-0023), nothing is applied twice.

An operation may be given as a function of the state (``Planner``): it is called inside the commit, on
the state it will apply to, so amounts that depend on what was charged before (a meter tick, a capture)
are computed under the same compare-and-set that posts them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec
from nats.aio.client import Client as NATS

from nodus_billing.holding import Grant, Op, apply
from nodus_billing.standing import Result, State
from nodus_kit.errors import AlreadyExists, Conflict, NotFound
from nodus_kit.storing import ObjectStore
from nodus_schema.meta import ObjectMeta
from nodus_schema.wire import API_VERSION, Wire

log = logging.getLogger(__name__)

BUCKET: Final = "accounts"
CAS_RETRIES: Final = 50

Planner = Callable[[State], Op | None]
"""Decides an operation on the state it will be applied to (None: nothing to do)."""
Step = Op | Planner


class Book(Wire):
    """A project's billing state as stored (key: the project's name)."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "BillingBook")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    state: State = msgspec.field(default_factory=State)


@dataclass
class Applied:
    """What one call's steps did: a result per step (None where a planner had nothing to do), and the
    state right after the commit that applied them."""

    results: list[Result | None]
    state: State


@dataclass
class _Waiting:
    steps: Sequence[Step]
    done: asyncio.Future[Applied]


@dataclass
class Books:
    nc: NATS
    starting_micros: int = 0
    """Credits every project gets once, when its book is first written (``grant:starting:<project>``)."""
    store: ObjectStore[Book] = field(init=False)
    commits: int = 0
    """KV writes done (the benchmark reads it: operations per write is the group commit's gain)."""

    def __post_init__(self) -> None:
        self.store = ObjectStore(self.nc, BUCKET, Book)
        self._waiting: dict[str, list[_Waiting]] = {}
        self._committing: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def read(self, project: str) -> State:
        """The project's state as stored (an empty state for a project nothing was charged to yet)."""
        try:
            return (await self.store.get(None, project)).state
        except NotFound:
            return self._opening(project, State())

    async def apply(self, project: str, steps: Sequence[Step]) -> Applied:
        """Apply ``steps`` in order to the project's book, committed with whoever else waits."""
        done: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(project, []).append(_Waiting(steps, done))
        if project not in self._committing:
            self._committing.add(project)
            task = asyncio.create_task(self._commit(project), name=f"books:{project}")
            self._tasks.add(task)  # a reference, so the committer is not collected mid-commit
            task.add_done_callback(self._tasks.discard)
        return await done

    async def _commit(self, project: str) -> None:
        try:
            while batch := self._waiting.pop(project, []):
                try:
                    results, state = await self._write(project, [w.steps for w in batch])
                except Exception as e:  # every caller of this batch learns it; the next batch tries again
                    for w in batch:
                        if not w.done.done():
                            w.done.set_exception(e)
                    continue
                for w, r in zip(batch, results, strict=True):
                    if not w.done.done():
                        w.done.set_result(Applied(r, state))
        finally:
            # No await between the loop's last empty pop and this line: a caller that arrives after it
            # starts a new committer.
            self._committing.discard(project)

    async def _write(
        self, project: str, batches: list[Sequence[Step]]
    ) -> tuple[list[list[Result | None]], State]:
        for _ in range(CAS_RETRIES):
            try:
                book: Book | None = await self.store.get(None, project)
            except NotFound:
                book = None
            state = self._opening(project, book.state if book else State())
            out: list[list[Result | None]] = []
            for steps in batches:
                results: list[Result | None] = []
                for step in steps:
                    op = step if not callable(step) else step(state)
                    if op is None:
                        results.append(None)
                        continue
                    state, result, _ = apply(state, op)
                    results.append(result)
                out.append(results)
            try:
                if book is None:
                    await self.store.create(Book(metadata=ObjectMeta(name=project), state=state))
                elif state != book.state:
                    await self.store.update(msgspec.structs.replace(book, state=state))
            except (Conflict, AlreadyExists):
                continue  # another replica wrote the book first: apply again to what it wrote
            self.commits += 1
            return out, state
        raise Conflict(f"the billing book of {project} kept changing under {CAS_RETRIES} tries")

    def _opening(self, project: str, state: State) -> State:
        """A project's starting credits, granted once (the grant's id makes it so)."""
        if self.starting_micros <= 0:
            return state
        grant = Grant(grant_id=f"starting:{project}", project=project, amount_micros=self.starting_micros)
        return apply(state, grant)[0]
