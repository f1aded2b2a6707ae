"""The books: one billing :class:`State` per project in the ``accounts`` bucket, changed only by ``apply``.

Every change is a compare-and-set of the project's book. Concurrent callers for the same project are
committed together (group commit): the operations of everyone waiting are applied in arrival order to one
read of the book and written back in one KV update, so a burst of holds costs one fsync, not one each. A
lost race (another replica wrote first) reads the book again and applies the same operations again;
since every operation is idempotent by its id (ADR-0023), nothing is applied twice.

An operation may be given as a function of the state (``Planner``): it is called inside the commit, on
the state it will apply to, so amounts that depend on what was charged before (a meter tick, a capture)
are computed under the same compare-and-set that posts them.

One operation can never poison a project's book. A stored book that holds what a book cannot (written by
an older version) is repaired when it is read (:mod:`repairing`): the repaired book is written back,
logged, counted (``Books.repairs``) and announced as a Warning event on the project's account. An
operation that raises is refused alone (``InternalError``, logged); the others of its commit go on. And a
commit whose state would not encode is applied again one operation at a time, refusing each operation
that makes it so, before anything is written.

What a commit costs does not grow with its size (issue #23): its operations are applied to one copy of the
book (``holding.apply(copy=False)``), not to a copy each; a book it leaves unchanged is not written; and it
starts from the book this replica last read or wrote (:meth:`Books.read` keeps it, per project) and
reads the store only when the compare-and-set says another wrote since, or when it would write nothing (an
unchanged copy proves nothing about the stored book: that commit is judged again on a read). The meter reads
that kept book too when the books' glance shows nothing newer (``read(seen=...)``), so N Jobs of a project
metered together cost about N / 64 reads and writes of its book, not 2N.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import MaxPayloadError

from nodus_billing.holding import Grant, Op, apply, copied, op_id
from nodus_billing.repairing import encodable, repair
from nodus_billing.standing import BOOK_MAX_MICROS, INTERNAL, INVALID, Repair, Result, State
from nodus_kit import measuring
from nodus_kit.errors import AlreadyExists, Conflict, NotFound, Unavailable
from nodus_kit.messaging import MSG_ID
from nodus_kit.storing import ObjectStore
from nodus_schema.messages import ObjectEvent
from nodus_schema.meta import ObjectMeta, now_rfc3339
from nodus_schema.quantities import micros_to_usd
from nodus_schema.remembering import Memo
from nodus_schema.wire import API_VERSION, Wire

log = logging.getLogger(__name__)

BUCKET: Final = "accounts"
CAS_RETRIES: Final = 50
OPENINGS_KEPT: Final = 4096
REPAIRED: Final = "BookRepaired"
"""The reason of the Warning event published when a stored book was repaired."""

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
    repairs: int = 0
    """Values repaired in stored books and written back (each is logged and announced as an event)."""

    def __post_init__(self) -> None:
        self.store = ObjectStore(self.nc, BUCKET, Book)
        self._waiting: dict[str, list[_Waiting]] = {}
        self._committing: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._kept: dict[str, Book] = {}
        """Per project, the newest book this replica read or wrote that needed no repair. Never changed in
        place: every commit applies to a copy (and callers only read the states they are given)."""
        self._openings: Memo[str, State] = Memo(OPENINGS_KEPT)
        """Per project, the opening state :meth:`opening` gave (the :data:`OPENINGS_KEPT` last used): a
        project with no book yet is read by each quote and each pass of its Jobs, and building its state
        (a grant applied to an empty one) was 5% of billing's time a create. Only read, as above."""

    async def read(self, project: str, *, seen: int | None = None) -> State:
        """The project's state as stored (an empty state for a project nothing was charged to yet); a book
        that needs repair is read repaired, and the repaired book is written back (see the module).

        ``seen``: the revision of the book that billing's view of it (the books' glance) shows, 0 when the
        view holds no book of the project. When the book this replica last read or wrote is at least as
        recent, it is returned without a read: it is as fresh as the view, and a write the view has not
        seen yet reaches the meter when it does. So is the opening state of a project that neither has."""
        kept = self._kept.get(project)
        if seen is not None and kept is not None and _revision(kept) >= seen:
            return kept.state
        if seen == 0 and kept is None:
            return self.opening(project)
        book = await self._get(project)
        if book is None:
            return self.opening(project)
        state, repairs = repair(book.state, _now_ms())
        if repairs:
            self._spawn(self.apply(project, []), f"books:repair:{project}")  # an empty commit writes it
        return state

    async def _get(self, project: str) -> Book | None:
        """The book as stored (None: none yet), kept when it needs no repair."""
        try:
            book = await self.store.get(None, project)
        except NotFound:
            return None
        if encodable(book.state):
            self._keep(project, book)
        return book

    def _keep(self, project: str, book: Book) -> None:
        kept = self._kept.get(project)
        if kept is None or _revision(book) >= _revision(kept):
            self._kept[project] = book

    def _spawn(self, work: Any, name: str) -> None:
        async def run() -> None:
            try:
                await work
            except Exception as e:  # the next read or write of the book tries again
                log.warning("billing book not written back: %s", e, extra={"task": name})

        task = asyncio.create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        batch: list[_Waiting] = []
        try:
            while batch := self._waiting.pop(project, []):
                try:
                    results, state = await self._write(project, [w.steps for w in batch])
                except Exception as e:  # every caller of this batch learns it; the next batch tries again
                    _fail(batch, e)
                    continue
                for w, r in zip(batch, results, strict=True):
                    if not w.done.done():
                        w.done.set_result(Applied(r, state))
        except BaseException:
            # Cancelled mid-write (the loop shutting down, a client closing under it): no caller may wait
            # for good on a committer that is gone, neither this batch's nor those queued behind it.
            gone = Unavailable(f"the commit of the billing book of {project} was cancelled; retry")
            _fail([*batch, *self._waiting.pop(project, [])], gone)
            raise
        finally:
            # No await between the loop's last empty pop and this line: a caller that arrives after it
            # starts a new committer.
            self._committing.discard(project)

    async def _write(
        self, project: str, batches: list[Sequence[Step]]
    ) -> tuple[list[list[Result | None]], State]:
        kept = self._kept.get(project)  # needed no repair: the compare-and-set checks it is current
        for _ in range(CAS_RETRIES):
            book, unread = (kept, True) if kept is not None else (await self._get(project), False)
            kept = None  # a retry reads the store
            repairs: list[Repair] = []
            state = book.state if book else State()
            if book is not None and not unread:
                state, repairs = repair(state, _now_ms())
            start = self._opening(project, state)  # apply is pure: start stays as it is
            out, state = _apply_all(project, start, batches, checked=False)
            if not encodable(state):  # never written: find the operations that did it, refuse them alone
                out, state = _apply_all(project, start, batches, checked=True)
            unchanged = book is not None and state == book.state
            if unchanged and unread:
                continue  # no write to check the kept book against the store: judged again on a read
            try:
                if book is None:
                    written = await self.store.create(Book(metadata=ObjectMeta(name=project), state=state))
                    self._keep(project, written)
                elif not unchanged:
                    written = await self.store.update(msgspec.structs.replace(book, state=state))
                    self._keep(project, written)
            except (Conflict, AlreadyExists):
                continue  # another replica wrote the book first: apply again to what it wrote
            except MaxPayloadError:
                raise Unavailable(self._full(project, state)) from None
            self.commits += 1
            if repairs:
                await self._repaired(project, repairs)
            return out, state
        raise Conflict(f"the billing book of {project} kept changing under {CAS_RETRIES} tries")

    def _full(self, project: str, state: State) -> str:
        """Why a book could not be written: it outgrew the bus's largest message (it keeps every run)."""
        limit = self.nc.max_payload
        return (
            f"the billing book of project {project} has outgrown the bus's largest message ({limit} bytes:"
            f" it records {len(state.holds)} runs); nothing was changed. The cluster operator can raise"
            " NATS max_payload (docs/billing.md, Bounds and repairs)"
        )

    async def _repaired(self, project: str, repairs: list[Repair]) -> None:
        """A repaired book was written: logged, counted, and a Warning event on the project's account."""
        self.repairs += len(repairs)
        measuring.BOOK_REPAIRS.inc(len(repairs))
        said = "; ".join(f"{r.path} was {r.was}, now {r.now or 'none'}" for r in repairs[:5])
        more = f" (and {len(repairs) - 5} more)" if len(repairs) > 5 else ""
        log.warning(
            "billing book repaired",
            extra={"project": project, "repairs": [msgspec.to_builtins(r) for r in repairs]},
        )
        message = (
            f"billing repaired the book of project {project}: it held values beyond"
            f" ${micros_to_usd(BOOK_MAX_MICROS)}, the most a book holds: {said}{more}"
        )
        event = ObjectEvent(
            namespace=project,
            kind="Account",
            name=project,
            uid="",
            reason=REPAIRED,
            message=message,
            time=now_rfc3339(),
            severity="Warning",
        )
        try:  # news, not state (as every event): a failed publish must not fail the commit
            await self.nc.publish(
                f"nodus.events.{project}.accounts.{project}",
                msgspec.json.encode(event),
                headers={MSG_ID: f"event:book:{project}:{repairs[0].at_ms}"},
            )
        except Exception as e:
            log.warning("event not published: %s", e, extra={"project": project, "reason": REPAIRED})

    def opening(self, project: str) -> State:
        """The state of a project with no book yet: its starting credits (written with its first commit)."""
        return self._openings.get(project, lambda: self._opening(project, State()))

    def _opening(self, project: str, state: State) -> State:
        """A project's starting credits, granted once (the grant's id makes it so)."""
        if self.starting_micros <= 0:
            return state
        grant = Grant(grant_id=f"starting:{project}", project=project, amount_micros=self.starting_micros)
        return apply(state, grant)[0]


def _apply_all(
    project: str, state: State, batches: list[Sequence[Step]], *, checked: bool
) -> tuple[list[list[Result | None]], State]:
    """Every batch's steps applied in order. A step that raises is refused alone (logged): the state stays
    as it was before it. ``checked``: a step after which the state would not encode is refused too.

    Unchecked, the steps are first applied to one copy of the state, in place (``apply(copy=False)``: the
    same states as a copy per step); a step that raises there leaves that copy half changed, so then every
    step is applied again from ``state``, a copy each, as below."""
    if not checked:
        fast = _apply_in_place(state, batches)
        if fast is not None:
            return fast
    out: list[list[Result | None]] = []
    for steps in batches:
        results: list[Result | None] = []
        for step in steps:
            op: Op | None = None
            try:
                op = step if not callable(step) else step(state)
                if op is None:
                    results.append(None)
                    continue
                new, result, _ = apply(state, op)
            except Exception:
                key = op_id(op) if op is not None else "a planned operation"
                log.exception("billing operation failed", extra={"project": project, "op": key})
                results.append(_failed(key))
                continue
            if checked and not encodable(new):
                log.error(
                    "billing operation refused: beyond the book",
                    extra={"project": project, "op": result.op_id},
                )
                results.append(_beyond(result.op_id))
                continue
            state = new
            results.append(result)
        out.append(results)
    return out, state


def _apply_in_place(
    state: State, batches: list[Sequence[Step]]
) -> tuple[list[list[Result | None]], State] | None:
    """Every step applied to one copy of ``state``; None when a step raised (see :func:`_apply_all`)."""
    work = copied(state)
    out: list[list[Result | None]] = []
    try:
        for steps in batches:
            results: list[Result | None] = []
            for step in steps:
                op = step if not callable(step) else step(work)
                results.append(None if op is None else apply(work, op, copy=False)[1])
            out.append(results)
    except Exception:  # judged again a copy per step, which refuses that step alone and logs it
        return None
    return out, work


def _fail(batch: list[_Waiting], error: BaseException) -> None:
    for w in batch:
        if not w.done.done():
            w.done.set_exception(error)


def _revision(book: Book) -> int:
    return int(book.metadata.resource_version or 0)


def _failed(key: str) -> Result:
    return Result(
        op_id=key,
        ok=False,
        code=INTERNAL,
        message=f"billing could not apply {key}; nothing was changed (nodus-billing logged why)",
        fix="Retry. If it keeps failing, the cluster operator should read nodus-billing's log.",
    )


def _beyond(key: str) -> Result:
    return Result(
        op_id=key,
        ok=False,
        code=INVALID,
        message=f"{key} would put an amount in the billing book beyond what it holds; nothing was changed",
        fix=f"Use amounts of at most ${micros_to_usd(BOOK_MAX_MICROS)}.",
    )


def _now_ms() -> int:
    return int(time.time() * 1000)
