"""A Job's log: ``GET /apis/nodus.dev/v1/namespaces/{ns}/jobs/{name}/log``, as Kubernetes serves pods/log.

The body is ``text/plain``, one line per log line. Parameters (Kubernetes' names):

* ``index`` (default 0): which index of the Job; ``attempt``: only that attempt number of the index
  (default: every attempt of the index, oldest first, so a run resumed after lost capacity reads on);
* ``tailLines``: only the last N lines; ``sinceSeconds``: only lines of the last N seconds;
* ``timestamps=true``: each line starts with its RFC 3339 time and a space;
* ``follow=true``: after the lines so far, stream new ones until the client goes or the Job finishes
  (its phase is terminal and every line published before that was sent).

The lines come from the NODUS_LOGS stream, where node agents publish ``LogLines`` batches on
``nodus.logs.<node>.<ns>.<job>.<attempt>``; each request reads them with an ordered consumer filtered to
the Job's subjects (``nodus.logs.*.<ns>.<job>.*``). A batch counts only when the node of its subject (the
bus lets an agent publish on its own node's subjects only), the node it names and its Attempt's node
agree: one GPU host cannot write lines into another's runs (dropped and counted, nodus_kit.vouching).
Attempt names are ``<job>-<uid8>-<index>-a<n>`` (gang
members add ``-m<rank>``), so the uid keeps a deleted Job's lines out of a new same-named Job's log and
the name says which index and attempt a batch belongs to without decoding it. A batch the agent sent
twice (after a crash whose cursor was lost) is skipped by its byte range.

``tailLines`` reads the Job's batches from the start of what the stream holds (7 days, bounded bytes) and
keeps the last N: JetStream cannot read backwards. Authorization is that of a get of the Job (viewer).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final

import anyio
import msgspec
import nats.errors
from fastapi import APIRouter, Query, Request
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from nodus_gateway.authorizing import authorize
from nodus_gateway.clusterrouting import check_name, check_namespace
from nodus_gateway.resources import Stores, resource
from nodus_gateway.responding import ApiError, store_errors
from nodus_gateway.routing import API_PREFIX
from nodus_kit import errors as kit
from nodus_kit.storing import ObjectStore
from nodus_kit.vouching import LOG_PREFIX, Forgeries, sender
from nodus_schema import TERMINAL_PHASES, Job
from nodus_schema.attempts import Attempt
from nodus_schema.messages import LogLine, LogLines

log = logging.getLogger(__name__)

STREAM: Final = "NODUS_LOGS"
TEXT: Final = "text/plain; charset=utf-8"
JOB_POLL_S: float = 1.0
"""How often a follow looks at the Job's phase (a module variable, so a test can shorten it)."""
_TICK_S: Final = 0.5  # a quiet stream looks up this often: the client may have gone
_ATTEMPT: Final = re.compile(r"(\d+)-a(\d+)(?:-m(\d+))?")
_NO_STREAM: Final = 10059  # JetStream's "stream not found"


_decoder = msgspec.json.Decoder(LogLines)
FORGERIES: Final = Forgeries("gateway", "log")


# -- the request --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LogQuery:
    index: int
    attempt: int | None
    follow: bool
    tail_lines: int | None
    since: datetime | None
    timestamps: bool


@dataclass(frozen=True, slots=True)
class AttemptFilter:
    """Which of the Job's subjects (attempt tokens) belong to the asked index and attempt."""

    prefix: str
    index: int
    attempt: int | None

    def __call__(self, subject: str) -> bool:
        token = subject.rsplit(".", 1)[-1]
        if not token.startswith(self.prefix):
            return False
        m = _ATTEMPT.fullmatch(token[len(self.prefix) :])
        if m is None or int(m[1]) != self.index:
            return False
        return self.attempt is None or int(m[2]) == self.attempt


def job_subjects(namespace: str, name: str) -> str:
    return f"nodus.logs.*.{namespace}.{name}.*"


def attempt_filter(job: Job, q: LogQuery) -> AttemptFilter:
    name, uid = job.metadata.name or "", job.metadata.uid or ""
    return AttemptFilter(f"{name}-{uid[:8]}-" if uid else f"{name}-", q.index, q.attempt)


def _check_index(job: Job, index: int) -> None:
    completions = job.spec.completions or 1
    if index >= completions:
        raise ApiError.of(
            "BadRequest",
            f'index {index} is out of range: Job "{job.metadata.name}" has indexes 0 to {completions - 1}',
            fix=f"Ask for an index from 0 to {completions - 1} (?index=N, or `nodus logs --index N`).",
        )


# -- reading the stream -------------------------------------------------------------------------------------
@dataclass
class LogReader:
    """The Job's batches through an ordered consumer, and whether it has read all that was there."""

    js: JetStreamContext
    subjects: str
    keep: Callable[[str], bool]
    attempts: ObjectStore[Attempt] | None = None
    """Where the node of each batch's Attempt is read (None: a test of the reader alone)."""
    since: datetime | None = None
    target: int = 0
    """Stream sequence of the last matching batch when the target was set: caught up once it is seen."""
    seen: int = 0
    _sub: Any = None
    _shipped: dict[str, int] = field(default_factory=dict)
    """Per attempt, the log byte offset reached: a batch ending at or before it was a re-send."""
    _nodes: dict[str, str | None] = field(default_factory=dict)
    """Per attempt, the node it is bound to (None: no such Attempt)."""

    async def open(self) -> None:
        await self.set_target()
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
        if self.since is not None:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=self.since)
        self._sub = await self.js.subscribe(
            self.subjects, stream=STREAM, ordered_consumer=True, config=config
        )

    async def set_target(self) -> None:
        """Caught up means: up to the last batch the stream holds now."""
        try:
            last = await self.js.get_last_msg(STREAM, self.subjects)
        except NotFoundError as e:
            if e.err_code == _NO_STREAM:
                raise ApiError.of(
                    "ServiceUnavailable",
                    f"the {STREAM} stream does not exist, so no logs were kept",
                    fix="Start (or restart) a Nodus service: each declares the streams it needs at start.",
                    retry_after=1,
                ) from None
            self.target = 0  # no batch of this Job yet
            return
        stamp = last.time
        # A last batch older than sinceSeconds is never delivered: there is nothing to wait for.
        self.target = (
            0 if self.since is not None and stamp is not None and stamp < self.since else last.seq or 0
        )

    @property
    def caught_up(self) -> bool:
        return self.seen >= self.target

    async def next(self, timeout: float) -> list[LogLine]:
        """The lines of the next batch that is asked for ([] for a batch of another index or attempt);
        TimeoutError if none came within ``timeout``."""
        msg = await self._sub.next_msg(timeout=timeout)
        self.seen = max(self.seen, msg.metadata.sequence.stream)
        if not self.keep(msg.subject):
            return []
        try:
            batch = _decoder.decode(msg.data)
        except msgspec.DecodeError as e:
            log.warning("skipping a log batch that does not decode: %s", e, extra={"subject": msg.subject})
            return []
        if not await self._from_its_node(msg.subject, batch):
            return []
        if batch.end <= self._shipped.get(batch.attempt, 0):
            return []  # sent again by an agent that lost its cursor: these lines were shown
        self._shipped[batch.attempt] = batch.end
        if self.since is None:
            return batch.lines
        return [line for line in batch.lines if not _before(line.time, self.since)]

    async def _from_its_node(self, subject: str, batch: LogLines) -> bool:
        if self.attempts is None:
            return True
        parts = subject.split(".")  # nodus.logs.<node>.<ns>.<job>.<attempt>: the filter fixed ns and job
        token = parts[-1]
        if token not in self._nodes:
            try:
                self._nodes[token] = (await self.attempts.get(parts[3], token)).spec.node
            except kit.NotFound:
                self._nodes[token] = None
        bound = self._nodes[token] if batch.attempt == token else None
        return FORGERIES.genuine(sender(subject, LOG_PREFIX), batch.node, bound, f"log of {token}")

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as e:  # the connection may be gone; the server drops the consumer anyway
                log.debug("log consumer not unsubscribed: %s", e)
            self._sub = None


def _before(stamp: str, since: datetime) -> bool:
    try:
        return datetime.fromisoformat(stamp) < since
    except ValueError:
        return False  # a time we cannot read: shown rather than hidden


def _render(lines: list[LogLine], timestamps: bool) -> bytes:
    if timestamps:
        return "".join(f"{line.time} {line.text}\n" for line in lines).encode()
    return "".join(f"{line.text}\n" for line in lines).encode()


# -- the stream of the response -----------------------------------------------------------------------------
@dataclass
class _Follow:
    store: ObjectStore[Job]
    namespace: str
    name: str
    uid: str | None
    next_check: float = 0.0

    async def finished(self, now: float) -> bool:
        """Whether the Job is terminal (or gone), looked up at most every JOB_POLL_S."""
        if now < self.next_check:
            return False
        self.next_check = now + JOB_POLL_S
        try:
            job = await self.store.get(self.namespace, self.name)
        except kit.NotFound:
            return True
        if self.uid and job.metadata.uid != self.uid:
            return True  # deleted and created again: this log has ended
        return job.status.phase in TERMINAL_PHASES


async def _body(request: Request, reader: LogReader, q: LogQuery, follow: _Follow) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    tail: deque[LogLine] | None = deque(maxlen=q.tail_lines) if q.tail_lines is not None else None
    while not reader.caught_up:  # the lines so far
        try:
            lines = await reader.next(_TICK_S)
        except TimeoutError:
            if await request.is_disconnected():
                return
            continue
        if tail is not None:
            tail.extend(lines)
        elif lines:
            yield _render(lines, q.timestamps)
    if tail:
        yield _render(list(tail), q.timestamps)
    if not q.follow:
        return
    ending = False
    while True:
        if not ending and await follow.finished(loop.time()):
            ending = True
            await reader.set_target()  # every line published before the Job ended, then the end
        if ending and reader.caught_up:
            return
        try:
            lines = await reader.next(min(_TICK_S, JOB_POLL_S))
        except TimeoutError:
            if await request.is_disconnected():
                return
            continue
        if lines:
            yield _render(lines, q.timestamps)


async def _guarded(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The body; a failure after the first byte can only end the stream (and is logged)."""
    try:
        async for chunk in body:
            yield chunk
    except (nats.errors.Error, kit.NodusError) as e:
        log.warning("log stream ended early: %s", e)
    except Exception:
        log.exception("log stream failed")


class _LogResponse(StreamingResponse):
    """Closes its consumer however the response ends, even when cancelled because the client left."""

    def __init__(self, reader: LogReader, body: AsyncIterator[bytes]) -> None:
        super().__init__(_guarded(body), media_type=TEXT)
        self._reader = reader

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._reader.close()


# -- the route ----------------------------------------------------------------------------------------------
FollowQ = Annotated[str | None, Query()]
TailLinesQ = Annotated[int | None, Query(alias="tailLines", ge=0)]
SinceSecondsQ = Annotated[int | None, Query(alias="sinceSeconds", ge=1)]
IndexQ = Annotated[int | None, Query(ge=0)]
AttemptQ = Annotated[int | None, Query(ge=1)]
TimestampsQ = Annotated[str | None, Query()]
# Read by the direct lane too (dispatching.Parameters; querying.py has the API's own).
QUERIES: Final[tuple[Any, ...]] = (FollowQ, TailLinesQ, SinceSecondsQ, IndexQ, AttemptQ, TimestampsQ)


_TRUE: Final = frozenset({"1", "t", "true"})
_FALSE: Final = frozenset({"", "0", "f", "false"})


def _flag(name: str, value: str | None) -> bool:
    """A boolean query parameter as Kubernetes parses it (strconv.ParseBool): anything else is a 400, not
    a guess (a garbled ``follow`` must not start a stream that never ends)."""
    if value is None:
        return False
    low = value.lower()
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    raise ApiError.of(
        "BadRequest",
        f"invalid {name}={value!r}: not a boolean",
        fix=f"Send {name}=true or {name}=false.",
    )


def log_router(stores: Stores) -> APIRouter:
    """The log subresource of Jobs."""
    res = resource("jobs")
    store: ObjectStore[Job] = stores[res.plural]
    router = APIRouter(tags=[res.plural])

    @router.get(
        f"{API_PREFIX}/namespaces/{{namespace}}/{res.plural}/{{name}}/log",
        name="read log of jobs",
        response_class=PlainTextResponse,  # what the OpenAPI documents say it answers (text/plain)
    )
    async def read_log(
        namespace: str,
        name: str,
        request: Request,
        follow: FollowQ = None,
        tail_lines: TailLinesQ = None,
        since_seconds: SinceSecondsQ = None,
        index: IndexQ = None,
        attempt: AttemptQ = None,
        timestamps: TimestampsQ = None,
    ) -> Response:
        check_namespace(namespace)
        await authorize(request, "get", res.plural, namespace)
        check_name(res, name, namespace)
        with store_errors(res, namespace, name):
            job = await store.get(namespace, name)
        since = datetime.now(UTC) - timedelta(seconds=since_seconds) if since_seconds else None
        q = LogQuery(
            index or 0, attempt, _flag("follow", follow), tail_lines, since, _flag("timestamps", timestamps)
        )
        _check_index(job, q.index)
        reader = LogReader(
            store.js, job_subjects(namespace, name), attempt_filter(job, q), stores["attempts"], since
        )
        try:
            await reader.open()  # before the 200: a bus that does not answer is a 503 Status
        except BaseException:
            await reader.close()
            raise
        follow_ = _Follow(store, namespace, name, job.metadata.uid)
        return _LogResponse(reader, _body(request, reader, q, follow_))

    return router
