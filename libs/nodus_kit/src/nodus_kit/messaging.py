"""Typed messages on the bus: publish with a deterministic id, consume with mapped outcomes, request/reply.

* every JetStream publish carries ``Nats-Msg-Id`` (the server drops a duplicate inside the stream's
  window), the trace context and the request id;
* a consumer is a durable pull consumer; the handler's outcome maps to the JetStream reply as
  :mod:`nodus_kit.settling` says: return -> ack; :class:`TemporaryError` -> nak(delay);
  :class:`PermanentError` or a message that does not decode -> term, and a copy goes to
  ``nodus.dead.<stream>.<consumer>`` with the reason in headers; any other exception -> nak with capped
  exponential backoff and jitter, dead-lettered after ``max_deliver``;
* request/reply maps "no responders" to :class:`Unavailable` and a timeout to :class:`Timeout`; a
  responder's error comes back, in NATS micro services' error headers, as the same error class;
* an endpoint may pass a request on instead of answering it (:class:`Forward`): the next service answers
  the asker, one round trip fewer than asking it and relaying its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, PubAck
from nats.js.errors import NotFoundError

from nodus_kit import errors, measuring, settling, tracing
from nodus_kit.backingoff import Backoff
from nodus_kit.settling import Verdict
from nodus_schema.errors import REASONS

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

FETCH_WAIT_S = 5.0
"""How long one pull request of an idle :class:`Consumer` waits on the server for a message. A message that
arrives meanwhile is delivered at once (the request is answered as soon as it has one), so this only sets
how often an idle consumer asks again: each ask is two requests (nats-py probes with ``no_wait`` first),
and at 1 s the stack's idle consumers were a steady share of nats-server's idle CPU (issue #23). It also
bounds how long a pull request lost with a restarted server goes unnoticed."""
MSG_ID = "Nats-Msg-Id"
# A failed request's reply, in the headers NATS micro services answer errors with (nats.micro.request):
# the error's reason (NotFound, Conflict, ...) and the HTTP status the API gives that reason.
ERROR_HEADER = "Nats-Service-Error"
ERROR_CODE_HEADER = "Nats-Service-Error-Code"
LEGACY_ERROR_HEADER = "Nodus-Error"
"""The reason header before NATS micro's; still read, for responders of the previous release during a
rolling upgrade. Never sent."""
DEAD_REASON = "Nodus-Dead-Reason"
DEAD_SUBJECT = "Nodus-Dead-Subject"
DEAD_PREFIX = "nodus.dead"
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Delivery(Generic[T]):
    """A decoded message and what a handler may want to know about its delivery."""

    data: T
    subject: str
    headers: dict[str, str]
    attempt: int  # 1 on first delivery

    @property
    def request_id(self) -> str | None:
        return self.headers.get(tracing.REQUEST_ID)


async def publish(
    js: JetStreamContext,
    subject: str,
    message: Any,
    *,
    msg_id: str,
    headers: dict[str, str] | None = None,
) -> PubAck:
    """Publish one typed message; ``msg_id`` must be deterministic (the business key + version)."""
    hdrs = tracing.inject({**(headers or {}), MSG_ID: msg_id})
    return await js.publish(subject, _encoder.encode(message), headers=hdrs)


async def dead_letter(js: JetStreamContext, msg: Msg, *, stream: str, consumer: str, reason: str) -> None:
    """Give up on ``msg``: a copy with ``reason`` goes to ``nodus.dead.<stream>.<consumer>``, then it is
    termed (JetStream delivers it no more)."""
    headers = {**(msg.headers or {}), DEAD_REASON: reason[:1000], DEAD_SUBJECT: msg.subject}
    # Deterministic id: if we die between this publish and the term, the redelivery's dead letter is
    # dropped by the stream's duplicate window instead of being recorded twice.
    headers[MSG_ID] = f"dead:{stream}:{msg.metadata.sequence.stream}"
    await js.publish(f"{DEAD_PREFIX}.{stream}.{consumer}", msg.data, headers=headers)
    await msg.term()


Handler = Callable[[Delivery[T]], Awaitable[None]]


class Consumer(Generic[T]):
    """A pull-consumer loop for one durable consumer; :meth:`stop` finishes the in-flight batch."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        stream: str,
        durable: str,
        subject: str,
        typ: type[T],
        handler: Handler[T],
        max_deliver: int = 8,
        batch: int = 32,
        ack_wait_s: float = 30.0,
        concurrent: bool = False,
        backoff: Backoff = settling.REDELIVERY,
    ) -> None:
        """``concurrent``: handle the messages of a batch side by side rather than one after another, for
        handlers whose messages do not depend on each other's order (each is idempotent and its writes
        compare-and-set, as the scheduler's report handler is). ``backoff``: the nak delay of a failed
        delivery, by its number."""
        self.js, self.stream, self.durable, self.subject = js, stream, durable, subject
        self.concurrent, self.backoff = concurrent, backoff
        self.decoder = msgspec.json.Decoder(typ)
        self.handler = measuring.timed_handler(stream, durable, handler)
        self.max_deliver, self.batch, self.ack_wait_s = max_deliver, batch, ack_wait_s
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._waiting = False
        """The loop waits for a pull request's answer, holding no message: stopping cancels it at once."""

    async def start(self) -> Consumer[T]:
        config = ConsumerConfig(
            durable_name=self.durable,
            filter_subject=self.subject,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            # One more than ours, so the loop (not the server) decides when a message is dead.
            max_deliver=self.max_deliver + 1,
        )
        self.sub = await self.js.pull_subscribe(
            self.subject, durable=self.durable, stream=self.stream, config=config
        )
        self._task = asyncio.create_task(self._run(), name=f"consume:{self.durable}")
        return self

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._waiting = True
                msgs = await self.sub.fetch(self.batch, timeout=FETCH_WAIT_S)
            except (TimeoutError, NatsTimeout):
                continue
            except NotFoundError:
                await asyncio.sleep(0.5)  # consumer lost with a server restart: the next fetch recreates
                continue
            except Exception as e:  # the loop must outlive transient bus errors
                log.warning("fetch failed: %s", e, extra={"consumer": self.durable})
                await asyncio.sleep(0.5)
                continue
            finally:
                self._waiting = False
            if self.concurrent:
                await asyncio.gather(*(self._handle(msg) for msg in msgs))
            else:
                for msg in msgs:
                    await self._handle(msg)

    async def _handle(self, msg: Msg) -> None:
        headers = dict(msg.headers or {})
        try:
            data = self.decoder.decode(msg.data)
        except msgspec.DecodeError as e:
            await self._settle(msg, settling.dead(f"undecodable: {e}"))
            return
        token = tracing.set_request_id(headers.get(tracing.REQUEST_ID))
        try:
            delivery = Delivery(data, msg.subject, headers, int(msg.metadata.num_delivered))
            await self._settle(msg, await self._verdict(delivery))
        finally:
            tracing._request_id.reset(token)

    async def _verdict(self, delivery: Delivery[T]) -> Verdict:
        """The handler's outcome on ``delivery``, as :mod:`nodus_kit.settling` maps it."""
        ctx = tracing.extract(delivery.headers)
        try:
            with tracing.tracer.start_as_current_span(f"consume {delivery.subject}", context=ctx):
                await self.handler(delivery)
        except Exception as e:
            if not isinstance(e, errors.NodusError):  # a bug, not a refusal: its traceback is wanted
                log.exception("handler failed", extra={"consumer": self.durable, "subject": delivery.subject})
            return settling.of_error(e, delivery.attempt, max_attempts=self.max_deliver, backoff=self.backoff)
        return settling.ACK

    async def _settle(self, msg: Msg, verdict: Verdict) -> None:
        await settling.settle(msg, verdict, self._dead)
        measuring.consumed(self.stream, self.durable, verdict.action.value)

    async def _dead(self, msg: Msg, reason: str) -> None:
        await dead_letter(self.js, msg, stream=self.stream, consumer=self.durable, reason=reason)
        log.error("dead-lettered: %s", reason, extra={"consumer": self.durable, "subject": msg.subject})

    async def stop(self, grace_s: float = 3.0) -> None:
        """Finish the batch in hand, for at most ``grace_s``; then the loop is cancelled (what it had not
        acked is redelivered: every handler is idempotent)."""
        self._stopping.set()
        if self._task and self._waiting:
            self._task.cancel()  # nothing in hand: no reason to wait out the pull request
        if self._task:
            _, late = await asyncio.wait({self._task}, timeout=grace_s)
            if late:
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await self.sub.unsubscribe()


# -- request / reply ------------------------------------------------------------------------------
async def request(nc: NATS, subject: str, message: Any, reply_type: type[R], *, timeout: float = 5.0) -> R:
    """Ask a service; its typed answer, or the error it answered with, as the kit's error classes."""
    headers = tracing.inject({})
    try:
        msg = await nc.request(subject, _encoder.encode(message), timeout=timeout, headers=headers)
    except NoRespondersError:
        raise errors.Unavailable(f"nobody serves {subject}: is the service running?") from None
    except (TimeoutError, NatsTimeout):
        raise errors.Timeout(f"{subject} did not answer within {timeout}s") from None
    reason = _error_reason(msg)
    if reason is not None:
        raise _error(reason, msg.data.decode(errors="replace"))
    try:
        return msgspec.json.decode(msg.data, type=reply_type)
    except msgspec.DecodeError as e:
        # The responder's fault (another version, a bug), not the caller's: an internal error it can
        # report, never a crash of the caller's handler.
        raise errors.NodusError(f"{subject} answered what is not a {reply_type.__name__}: {e}") from None


def _error_reason(msg: Msg) -> str | None:
    """The reason of an error reply; None for an answer."""
    if not msg.headers:
        return None
    return msg.headers.get(ERROR_HEADER) or msg.headers.get(LEGACY_ERROR_HEADER)


def _error_headers(reason: str) -> dict[str, str]:
    """The headers of an error reply: its reason, and the HTTP status of that reason (500 for a reason
    the API does not register), as NATS micro's numeric error code."""
    known = REASONS.get(reason)
    return {ERROR_HEADER: reason, ERROR_CODE_HEADER: str(known.http_status if known else 500)}


# Reasons a caller may retry; any other reason a responder sends back is final for that request.
_RETRYABLE_REASONS = {"Conflict", "Timeout", "ServiceUnavailable", "TooManyRequests"}


def _error(reason: str, message: str) -> errors.NodusError:
    for cls in (
        errors.NotFound,
        errors.AlreadyExists,
        errors.Conflict,
        errors.Expired,
        errors.Invalid,
        errors.Timeout,
        errors.Unavailable,
    ):
        if cls.reason == reason:
            return cls(message)
    err = errors.NodusError(message)
    err.reason = reason
    err.retryable = reason in _RETRYABLE_REASONS
    return err


@dataclass(frozen=True, slots=True)
class Forward:
    """What an endpoint's handler returns to pass its request on rather than answer it: ``message`` is
    published on ``subject`` with the asker's reply subject (and this span's trace context and the
    request id), so the service serving ``subject`` answers the asker directly, its errors included.
    With nobody serving ``subject`` the request is lost and the asker waits out its timeout: nats-server
    tells "no responders" only to the client that published. A handler that forwards must know the next
    service serves (``nodus_scheduler.forwarding`` checks). The credential needs the right to publish on
    ``subject``."""

    subject: str
    message: Any


async def serve(
    nc: NATS,
    subject: str,
    request_type: type[T],
    handler: Callable[[T], Awaitable[Any]],
    *,
    queue: str = "",
    concurrency: int = 1,
) -> Any:
    """Declare an endpoint: decode, call, encode; errors go back as replies with NATS micro's error
    headers (``Nats-Service-Error``: the reason, ``Nats-Service-Error-Code``: its HTTP status) and the
    message as the body.

    nats-py calls a subscription's callback one message at a time; with ``concurrency`` above 1 each
    request runs in its own task, at most that many at once, so handlers that wait on shared work (a
    group commit) wait together."""

    async def call(request: T, _subject: str) -> Any:
        return await handler(request)

    return await serve_subject(nc, subject, request_type, call, queue=queue, concurrency=concurrency)


async def serve_subject(
    nc: NATS,
    subject: str,
    request_type: type[T],
    handler: Callable[[T, str], Awaitable[Any]],
    *,
    queue: str = "",
    concurrency: int = 1,
) -> Any:
    """:func:`serve` for a wildcard ``subject`` whose handler needs the subject each request came on (a
    token of it names who asks, as ``nodus.rpc.node.<node>.secrets`` does)."""
    decoder = msgspec.json.Decoder(request_type)

    async def handle(msg: Msg) -> None:
        token = tracing.set_request_id((msg.headers or {}).get(tracing.REQUEST_ID))
        forward: Forward | None = None
        passed: dict[str, str] = {}
        # A request received before the connection moved to another server cannot be answered: the new
        # server never delivered it, so a credential's allow_responses right for its reply is not there
        # (a permissions violation), and the asker has given up or asks again anyway.
        received_on = nc.stats["reconnects"]
        try:
            with tracing.tracer.start_as_current_span(
                f"serve {subject}", context=tracing.extract(msg.headers)
            ):
                reply = await handler(decoder.decode(msg.data), msg.subject)
                if isinstance(reply, Forward):  # the next service's span is a child of this one
                    forward, passed = reply, tracing.inject({})
                    reply = reply.message
            outcome, body, failed = "ok", _encoder.encode(reply), False
        except msgspec.DecodeError as e:
            outcome, body, failed = "BadRequest", f"request does not decode: {e}".encode(), True
        except errors.NodusError as e:
            outcome, body, failed = e.reason, str(e).encode(), True
        except Exception as e:
            log.exception("endpoint failed", extra={"subject": subject})
            outcome, body, failed = "InternalError", f"{type(e).__name__}: {e}".encode(), True
        try:
            if nc.stats["reconnects"] != received_on:
                log.info("not answering a request received before a reconnect", extra={"subject": subject})
                outcome = "Unanswered"
            elif forward is not None and not failed:
                outcome = "forwarded"
                if msg.reply:  # nobody waits for a request without a reply subject: nothing to pass on
                    await nc.publish(forward.subject, body, reply=msg.reply, headers=passed)
            elif not failed:
                await msg.respond(body)
            elif msg.reply:
                await nc.publish(msg.reply, body, headers=_error_headers(outcome))
            measuring.served(subject, outcome)
        finally:
            tracing._request_id.reset(token)

    if concurrency <= 1:
        return await nc.subscribe(subject, queue=queue, cb=handle)
    slots = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()

    async def run(msg: Msg) -> None:
        try:
            await handle(msg)
        finally:
            slots.release()

    async def on_msg(msg: Msg) -> None:
        await slots.acquire()  # back-pressure: with every slot busy, the next message waits here
        task = asyncio.create_task(run(msg))
        running.add(task)
        task.add_done_callback(running.discard)

    return await nc.subscribe(subject, queue=queue, cb=on_msg)
