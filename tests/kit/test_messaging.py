"""Typed publish/consume and request/reply against a real JetStream: outcomes map to ack/nak/term+DLQ."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, DeliverPolicy

from nodus_kit import errors, messaging, tracing
from nodus_kit.messaging import Consumer, Delivery
from nodus_testing.waiting import eventually


class Ping(msgspec.Struct, rename="camel"):
    job: str
    attempt_no: int


async def test_publish_dedups_on_msg_id(nc: NATS, unique: str) -> None:
    js = nc.jetstream()
    subject = f"nodus.events.{unique}"
    a1 = await messaging.publish(js, subject, Ping("j", 1), msg_id=f"{unique}-1")
    a2 = await messaging.publish(js, subject, Ping("j", 1), msg_id=f"{unique}-1")
    assert a2.duplicate and a2.seq == a1.seq


async def _consume(
    nc: NATS, unique: str, handler: messaging.Handler[Ping], *, max_deliver: int = 3, concurrent: bool = False
) -> Consumer[Ping]:
    return await Consumer(
        nc.jetstream(),
        stream="NODUS_EVENTS",
        durable=f"c-{unique}",
        subject=f"nodus.events.{unique}.>",
        typ=Ping,
        handler=handler,
        max_deliver=max_deliver,
        concurrent=concurrent,
    ).start()


async def _dead_letters(nc: NATS, stream: str, durable: str) -> list[tuple[bytes, dict[str, str]]]:
    js = nc.jetstream()
    sub = await js.subscribe(
        f"nodus.dead.{stream}.{durable}",
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    out = []
    try:
        while True:
            msg = await sub.next_msg(timeout=0.3)
            out.append((msg.data, dict(msg.headers or {})))
    except Exception:
        return out
    finally:
        await sub.unsubscribe()


async def test_consumer_acks_and_carries_request_id(nc: NATS, unique: str) -> None:
    seen: list[Delivery[Ping]] = []

    async def handler(d: Delivery[Ping]) -> None:
        seen.append(d)

    c = await _consume(nc, unique, handler)
    token = tracing.set_request_id("req-123")
    try:
        await messaging.publish(
            nc.jetstream(), f"nodus.events.{unique}.x", Ping("j", 2), msg_id=f"{unique}-a"
        )
    finally:
        tracing._request_id.reset(token)
    await eventually(lambda: seen, message="the handler never ran")
    await c.stop()
    assert seen[0].data == Ping("j", 2) and seen[0].attempt == 1 and seen[0].request_id == "req-123"


async def test_a_concurrent_consumer_handles_a_batch_side_by_side(nc: NATS, unique: str) -> None:
    """The first message's handler waits for the second's: one after another, it would wait for ever."""
    second_seen = asyncio.Event()
    done: list[int] = []

    async def handler(d: Delivery[Ping]) -> None:
        if d.data.attempt_no == 1:
            await asyncio.wait_for(second_seen.wait(), timeout=5)  # the behaviour under test
        else:
            second_seen.set()
        done.append(d.data.attempt_no)

    js = nc.jetstream()
    for n in (1, 2):  # published before the consumer starts: one fetch takes both
        await messaging.publish(js, f"nodus.events.{unique}.x", Ping("j", n), msg_id=f"{unique}-{n}")
    c = await _consume(nc, unique, handler, concurrent=True)
    await eventually(lambda: sorted(done) == [1, 2], message=f"handled {done}")
    await c.stop()
    assert done == [2, 1]


async def test_temporary_error_is_retried_then_succeeds(nc: NATS, unique: str) -> None:
    attempts: list[int] = []

    async def handler(d: Delivery[Ping]) -> None:
        attempts.append(d.attempt)
        if d.attempt < 3:
            raise errors.TemporaryError("not yet", delay=0.05)

    c = await _consume(nc, unique, handler, max_deliver=5)
    await messaging.publish(nc.jetstream(), f"nodus.events.{unique}.x", Ping("j", 1), msg_id=f"{unique}-t")
    await eventually(lambda: attempts == [1, 2, 3], message=f"attempts {attempts}")
    await c.stop()
    assert await _dead_letters(nc, "NODUS_EVENTS", f"c-{unique}") == []


async def test_permanent_error_goes_to_dead_letters_once(nc: NATS, unique: str) -> None:
    calls = 0

    async def handler(d: Delivery[Ping]) -> None:
        nonlocal calls
        calls += 1
        raise errors.PermanentError("job spec is unusable")

    c = await _consume(nc, unique, handler)
    await messaging.publish(nc.jetstream(), f"nodus.events.{unique}.x", Ping("j", 1), msg_id=f"{unique}-p")
    dead = await eventually(
        lambda: _dead_letters(nc, "NODUS_EVENTS", f"c-{unique}"), message="no dead letter"
    )
    await c.stop()
    assert calls == 1
    assert dead[0][1][messaging.DEAD_REASON] == "job spec is unusable"
    assert dead[0][1][messaging.DEAD_SUBJECT] == f"nodus.events.{unique}.x"


async def test_crashing_handler_is_dead_lettered_after_max_deliver(nc: NATS, unique: str) -> None:
    calls = 0

    async def handler(d: Delivery[Ping]) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    c = Consumer(
        nc.jetstream(),
        stream="NODUS_EVENTS",
        durable=f"c-{unique}",
        subject=f"nodus.events.{unique}.>",
        typ=Ping,
        handler=handler,
        max_deliver=2,
    )
    c_started = await c.start()
    await messaging.publish(nc.jetstream(), f"nodus.events.{unique}.x", Ping("j", 1), msg_id=f"{unique}-c")
    dead = await eventually(
        lambda: _dead_letters(nc, "NODUS_EVENTS", f"c-{unique}"), deadline_s=15, message="no dead letter"
    )
    await c_started.stop()
    assert calls == 2 and "RuntimeError: boom" in dead[0][1][messaging.DEAD_REASON]


async def test_undecodable_message_is_dead_lettered(nc: NATS, unique: str) -> None:
    async def handler(d: Delivery[Ping]) -> None:
        raise AssertionError("must not be called")

    c = await _consume(nc, unique, handler)
    await nc.jetstream().publish(f"nodus.events.{unique}.x", b'{"job": 5}')
    dead = await eventually(
        lambda: _dead_letters(nc, "NODUS_EVENTS", f"c-{unique}"), message="no dead letter"
    )
    await c.stop()
    assert dead[0][1][messaging.DEAD_REASON].startswith("undecodable")


class Quote(msgspec.Struct):
    usd: str


async def test_request_reply_and_errors(nc: NATS, unique: str) -> None:
    async def handler(p: Ping) -> Quote:
        if p.job == "missing":
            raise errors.NotFound("no such job")
        return Quote(usd="1.50")

    sub = await messaging.serve(nc, f"nodus.rpc.{unique}", Ping, handler)
    try:
        assert await messaging.request(nc, f"nodus.rpc.{unique}", Ping("j", 1), Quote) == Quote("1.50")
        with pytest.raises(errors.NotFound, match="no such job"):
            await messaging.request(nc, f"nodus.rpc.{unique}", Ping("missing", 1), Quote)
    finally:
        await sub.unsubscribe()
    with pytest.raises(errors.Unavailable, match="is the service running"):
        await messaging.request(nc, f"nodus.rpc.{unique}", Ping("j", 1), Quote, timeout=1)


async def test_a_reply_of_the_wrong_shape_is_an_internal_error_not_a_crash(nc: NATS, unique: str) -> None:
    async def garbled(msg: Any) -> None:
        await msg.respond(b'{"usd": 3}')  # a responder of another version: a number, not a string

    sub = await nc.subscribe(f"nodus.rpc.{unique}", cb=garbled)
    try:
        with pytest.raises(errors.NodusError, match="answered what is not a Quote") as raised:
            await messaging.request(nc, f"nodus.rpc.{unique}", Ping("j", 1), Quote)
        assert raised.value.reason == "InternalError"
    finally:
        await sub.unsubscribe()


async def test_request_timeout_maps_to_timeout(nc: NATS, unique: str) -> None:
    async def slow(p: Ping) -> Quote:
        await asyncio.sleep(2)  # the behaviour under test: a responder slower than the caller's limit
        return Quote("0")

    sub = await messaging.serve(nc, f"nodus.rpc.{unique}", Ping, slow)
    try:
        with pytest.raises(errors.Timeout):
            await messaging.request(nc, f"nodus.rpc.{unique}", Ping("j", 1), Quote, timeout=0.2)
    finally:
        await sub.unsubscribe()


@pytest.mark.parametrize(
    ("error", "reason", "code"),
    [(errors.Conflict("lost a race"), "Conflict", "409"), (errors.NodusError("odd"), "InternalError", "500")],
)
async def test_an_error_reply_carries_the_nats_micro_error_headers(
    nc: NATS, unique: str, error: errors.NodusError, reason: str, code: str
) -> None:
    """What any NATS client sees of a failed request: the service API's standard error headers."""

    async def handler(p: Ping) -> Quote:
        raise error

    sub = await messaging.serve(nc, f"nodus.rpc.{unique}", Ping, handler)
    try:
        raw = await nc.request(f"nodus.rpc.{unique}", msgspec.json.encode(Ping("j", 1)), timeout=5)
    finally:
        await sub.unsubscribe()
    assert raw.headers is not None and "Nodus-Error" not in raw.headers
    assert (raw.headers["Nats-Service-Error"], raw.headers["Nats-Service-Error-Code"]) == (reason, code)
    assert raw.data == str(error).encode()


async def test_an_error_reply_of_the_previous_release_still_raises_its_class(nc: NATS, unique: str) -> None:
    """A responder not yet upgraded (a rolling upgrade) answers with the old header only."""

    async def old_responder(msg: Any) -> None:
        await nc.publish(msg.reply, b"no such job", headers={"Nodus-Error": "NotFound"})

    sub = await nc.subscribe(f"nodus.rpc.{unique}", cb=old_responder)
    try:
        with pytest.raises(errors.NotFound, match="no such job"):
            await messaging.request(nc, f"nodus.rpc.{unique}", Ping("j", 1), Quote)
    finally:
        await sub.unsubscribe()


async def test_a_forwarded_request_is_answered_by_the_next_service_with_its_request_id_and_errors(
    nc: NATS, unique: str
) -> None:
    """A handler that returns Forward passes the request on: the next service answers the asker (its
    answer and its errors alike), the request id goes along, and nothing is answered twice."""
    first, second = f"nodus.rpc.{unique}.first", f"nodus.rpc.{unique}.second"
    heard: list[str | None] = []

    async def passing(p: Ping) -> messaging.Forward:
        return messaging.Forward(second, Ping(p.job, p.attempt_no + 1))

    async def answering(p: Ping) -> Quote:
        heard.append(tracing.current_request_id())
        if p.job == "missing":
            raise errors.NotFound("no such job")
        return Quote(usd=f"{p.attempt_no}.00")

    subs = [
        await messaging.serve(nc, first, Ping, passing),
        await messaging.serve(nc, second, Ping, answering),
    ]
    replies: list[Any] = []
    inbox = nc.new_inbox()

    async def count(msg: Any) -> None:
        replies.append(msg)

    counting = await nc.subscribe(inbox, cb=count)
    token = tracing.set_request_id("req-fwd")
    try:
        assert await messaging.request(nc, first, Ping("j", 1), Quote) == Quote("2.00")
        with pytest.raises(errors.NotFound, match="no such job"):
            await messaging.request(nc, first, Ping("missing", 1), Quote)
        await nc.publish(first, msgspec.json.encode(Ping("j", 5)), reply=inbox)
        await eventually(lambda: replies, deadline_s=5, message="the forwarded request is answered")
        await nc.flush()
    finally:
        tracing._request_id.reset(token)
        await counting.unsubscribe()
        for sub in subs:
            await sub.unsubscribe()
    assert heard == ["req-fwd", "req-fwd", None], "the request id goes along with what is passed on"
    assert len(replies) == 1 and msgspec.json.decode(replies[0].data, type=Quote) == Quote("6.00")
