"""Holds on one project's billing book (ADR-0024) against raw nats-py compare-and-set on one KV key.

Every hold changes the project's book, one key in the ``accounts`` bucket, so a project's hold rate is
bounded by compare-and-set on that key. The baseline is the plainest way to do that with nats-py:
``kv.get`` then ``kv.update(key, value, last=revision)`` of a value the size of a book, one after another,
and from :data:`CALLERS` concurrent tasks that re-read and try again on every conflict (no backoff). The
subjects are ``Books.apply`` of PlaceHold operations (group commit: everyone waiting is applied to one
read and written in one update) and the ``nodus.rpc.billing.hold`` endpoint end to end (HoldRequest over
the bus to ``serve_holds``: the Job read, the PutJob planner and the group commit).

A book grows by about 300 bytes per hold and ``apply`` works on all of it, so every measurement moves to
a fresh project (a fresh key for the baseline) every :data:`PER_PROJECT` holds; only the operations are
timed, not the setup of each project. The baseline's value is a real book with half that many holds: its
mean size over a round.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

import msgspec
from nats.aio.client import Client as NATS
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from bench.running import Result, bus_auth
from nodus_billing.books import BUCKET, Books
from nodus_billing.holding import Grant, PlaceHold, PutJob
from nodus_billing.metering import Metering, Terms
from nodus_billing.serving import Holds, serve_holds
from nodus_kit import declaring, messaging
from nodus_kit.connecting import connect
from nodus_kit.storing import ObjectStore
from nodus_schema.billing import HOLD_SUBJECT, HoldReply, HoldRequest
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta
from nodus_testing.natsserver import NatsServer

CALLERS: Final = 64
PER_PROJECT: Final = 200
"""Holds per project before the next one: books of 1 to 60 KB, about 30 KB on average."""
CONTENDED_SHARE: Final = 10
"""The contended baseline does n / this many updates (at least a round): each takes dozens of tries."""
RUNS: Final = 2  # best of, baseline and subject alternating
CREDITS_MICROS: Final = 10**12  # $1,000,000: no hold of the run is refused for credits
RATE_MICROS_PER_HOUR: Final = 1_000_000  # $1/h: a 600 s hold is 166,667 µ$
HOLD_MICROS: Final = 1_000
JOB: Final = "bench"
GROUP_TARGET: Final = 1.0  # concurrent holds faster than raw per-op CAS
SEQUENTIAL_TARGET: Final = 0.5  # sequential holds within 50% of raw CAS

Op = Callable[[int], Awaitable[Any]]


async def run(n: int) -> list[Result]:
    with NatsServer(auth=bus_auth()) as server:
        # The harness credential (every right): this process is billing, its callers and the baseline.
        billing = await connect(server.url, "bench-billing", nkey_seed=server.harness_seed)
        callers = await connect(server.url, "bench-callers", nkey_seed=server.harness_seed)
        await declaring.ensure(billing.jetstream())
        books = Books(billing)
        projects = (f"bench-{i}" for i in itertools.count())
        raw = _Raw(await billing.jetstream().key_value(BUCKET), await _book_bytes(books), projects)
        sequential, alone = await _sequential(raw, books, projects, n)
        concurrent, contended = await _concurrent(raw, books, projects, n)
        holds = Holds(books, Metering(billing, books, Terms()))
        served = await _endpoint(billing, holds, _Endpoint(billing, callers, books, projects), n)
        results = [sequential, concurrent, *_against(served[:1], contended, GROUP_TARGET)]
        # Context: contended CAS without backoff is the worst use of one key; one writer at a time is its
        # best, what any scheme of one KV write per hold could reach.
        results += _against([(concurrent.name, concurrent.rate), *served], alone, None)
        await callers.close()
        await billing.close()
    return results


Baseline = tuple[str, float]
"""A baseline's description and its rate."""


def _against(subjects: list[tuple[str, float]], base: Baseline, target: float | None) -> list[Result]:
    return [Result(name, base[0], rate, base[1], target=target) for name, rate in subjects]


async def _sequential(raw: _Raw, books: Books, projects: Iterator[str], n: int) -> tuple[Result, Baseline]:
    """Books.apply one hold after another against raw CAS one update after another."""
    base, subject = await _alternate(lambda: raw.measure(n, 1), lambda: _books_measure(books, projects, n, 1))
    label = f"kv.get + kv.update(last=rev), sequential, {len(raw.value) // 1000} KB value"
    name = f"Books.apply(PlaceHold), sequential ({subject.writes_per_op:.2f} KV writes/hold)"
    return Result(name, label, subject.rate, base.rate, target=SEQUENTIAL_TARGET), (label, base.rate)


async def _concurrent(raw: _Raw, books: Books, projects: Iterator[str], n: int) -> tuple[Result, Baseline]:
    """Books.apply from :data:`CALLERS` callers against as many tasks doing raw CAS on one key."""
    # Contended CAS costs dozens of tries per update: a share of n measures its rate as well.
    contended = max(PER_PROJECT, n // CONTENDED_SHARE)
    base, subject = await _alternate(
        lambda: raw.measure(contended, CALLERS), lambda: _books_measure(books, projects, n, CALLERS)
    )
    label = (
        f"kv.get + kv.update(last=rev), {CALLERS} tasks retrying on conflict "
        f"({base.tries_per_op:.1f} tries/update)"
    )
    name = f"Books.apply(PlaceHold), {CALLERS} callers ({subject.writes_per_op:.3f} KV writes/hold)"
    return Result(name, label, subject.rate, base.rate, target=GROUP_TARGET), (label, base.rate)


async def _endpoint(billing: NATS, holds: Holds, endpoint: _Endpoint, n: int) -> list[tuple[str, float]]:
    """The hold endpoint as the billing service serves it: up to 64 requests handled at once, so holds that
    arrive together wait together for one commit."""
    sub = await serve_holds(billing, holds)
    served = await _best(lambda: endpoint.measure(n, CALLERS))
    await sub.unsubscribe()
    return [
        (
            f"hold endpoint (HoldRequest over the bus), {CALLERS} requesters "
            f"({served.writes_per_op:.3f} KV writes/hold)",
            served.rate,
        ),
    ]


class _Rate(msgspec.Struct, frozen=True):
    rate: float  # operations per second
    writes_per_op: float = 1.0  # KV writes per operation (group commit writes fewer than one per op)
    tries_per_op: float = 1.0  # compare-and-set attempts per successful update (conflicts retried)


async def _alternate(
    baseline: Callable[[], Awaitable[_Rate]], subject: Callable[[], Awaitable[_Rate]]
) -> tuple[_Rate, _Rate]:
    """The best of :data:`RUNS` of each, alternating so drift in machine load hits both alike."""
    bases: list[_Rate] = []
    subjects: list[_Rate] = []
    for _ in range(RUNS):
        bases.append(await baseline())
        subjects.append(await subject())
    return _fastest(bases), _fastest(subjects)


def _fastest(rates: list[_Rate]) -> _Rate:
    return max(rates, key=lambda r: r.rate)


async def _timed(ops: int, callers: int, op: Op) -> float:
    """Seconds to run ``op(i)`` for i in 0..ops-1 by ``callers`` tasks, each starting its next when done."""
    todo = iter(range(ops))

    async def caller() -> None:
        for i in todo:  # the tasks share the iterator: each index is taken once
            await op(i)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(min(callers, ops))))
    return time.perf_counter() - start


async def _best(measure: Callable[[], Awaitable[_Rate]]) -> _Rate:
    """The best of :data:`RUNS` (no baseline to alternate with: it was measured just before)."""
    return _fastest([await measure() for _ in range(RUNS)])


async def _rounds(
    n: int, callers: int, fresh: Callable[[], Awaitable[Op]], count: Callable[[], int]
) -> tuple[float, float]:
    """The rate of ``n`` operations by ``callers`` tasks on a fresh project every :data:`PER_PROJECT`
    (``fresh`` sets one up, untimed, and returns the operation on it), and how much ``count()`` grew
    per operation while they ran."""
    seconds = 0.0
    grew = 0
    for start in range(0, n, PER_PROJECT):
        op = await fresh()
        before = count()
        seconds += await _timed(min(PER_PROJECT, n - start), callers, op)
        grew += count() - before
    return n / seconds, grew / n


# -- the baseline ------------------------------------------------------------------------------------------


async def _book_bytes(books: Books) -> bytes:
    """A real book as stored, with half a round of holds: the baseline's value."""
    project = "bench-sample"
    ref = await _funded(books, project)
    for i in range(PER_PROJECT // 2):
        await books.apply(project, [_hold(ref, i)])
    return msgspec.json.encode(await books.store.get(None, project))


class _Raw:
    """Compare-and-set of one key with nats-py: get, then update at the revision read."""

    def __init__(self, kv: KeyValue, value: bytes, projects: Iterator[str]) -> None:
        self.kv = kv
        self.value = value
        self.projects = projects
        self.tries = 0

    async def measure(self, n: int, callers: int) -> _Rate:
        rate, tries = await _rounds(n, callers, self._fresh, lambda: self.tries)
        return _Rate(rate, tries_per_op=tries)

    async def _fresh(self) -> Op:
        key = f"raw.{next(self.projects)}"
        await self.kv.put(key, self.value)
        return functools.partial(self._update, key)

    async def _update(self, key: str, _: int) -> None:
        while True:
            self.tries += 1
            entry = await self.kv.get(key)
            try:
                await self.kv.update(key, self.value, last=entry.revision)
                return
            except KeyWrongLastSequenceError:
                continue  # another task wrote first: read again


# -- Books.apply ---------------------------------------------------------------------------------------------


def _hold(ref: str, i: int) -> PlaceHold:
    now = int(time.time() * 1000)
    return PlaceHold(
        hold_id=f"h{i}", job=ref, amount_micros=HOLD_MICROS, funded_until_ms=now + 600_000, at_ms=now
    )


async def _funded(books: Books, project: str, ref: str = f"{JOB}@bench") -> str:
    """A project with credits and a Job without a cap, so every hold fits; the Job's name in the book."""
    await books.apply(
        project,
        [
            Grant(grant_id="bench", project=project, amount_micros=CREDITS_MICROS),
            PutJob(name=ref, project=project, generation=1),
        ],
    )
    return ref


async def _books_measure(books: Books, projects: Iterator[str], n: int, callers: int) -> _Rate:
    async def fresh() -> Op:
        project = next(projects)
        return functools.partial(_place, books, project, await _funded(books, project))

    rate, writes = await _rounds(n, callers, fresh, lambda: books.commits)
    return _Rate(rate, writes_per_op=writes)


async def _place(books: Books, project: str, ref: str, i: int) -> None:
    result = (await books.apply(project, [_hold(ref, i)])).results[0]
    if result is None or not result.ok:
        raise RuntimeError(f"hold {i} of {project} was refused: {result}")


# -- the hold endpoint -----------------------------------------------------------------------------------


class _Endpoint:
    """HoldRequests from their own connection to ``serve_holds`` on billing's, as the scheduler asks."""

    def __init__(self, billing: NATS, callers: NATS, books: Books, projects: Iterator[str]) -> None:
        self.jobs = ObjectStore(billing, "jobs", Job)
        self.callers = callers
        self.books = books
        self.projects = projects
        self.window_ms = Terms().window_ms

    async def measure(self, n: int, callers: int) -> _Rate:
        rate, writes = await _rounds(n, callers, self._fresh, lambda: self.books.commits)
        return _Rate(rate, writes_per_op=writes)

    async def _fresh(self) -> Op:
        """A project with credits and a Job in the ``jobs`` bucket, as the gateway writes it."""
        project = next(self.projects)
        job = await self.jobs.create(default_job(_job(project)))
        grant = Grant(grant_id="bench", project=project, amount_micros=CREDITS_MICROS)
        await self.books.apply(project, [grant])
        return functools.partial(self._ask, project, job.metadata.uid or "")

    async def _ask(self, project: str, uid: str, i: int) -> None:
        req = HoldRequest(
            namespace=project,
            job=JOB,
            job_uid=uid,
            attempt=f"{JOB}-{i}",
            rate_micros_per_hour=RATE_MICROS_PER_HOUR,
            window_millis=self.window_ms,
        )
        reply = await messaging.request(self.callers, HOLD_SUBJECT, req, HoldReply, timeout=30.0)
        if not reply.ok:
            raise RuntimeError(f"hold {i} of {project} was refused: {reply.code}: {reply.message}")


def _job(namespace: str) -> Job:
    return Job(
        metadata=ObjectMeta(name=JOB, namespace=namespace),
        spec=msgspec.convert(
            {"image": "busybox", "command": ["true"], "resources": {"gpu": "L4:1"}}, JobSpec
        ),
    )
