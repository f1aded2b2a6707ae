"""The lean request/reply: the answers and errors of nats-py's ``Client.request``, on one inbox subscription
per connection. The first test also pins what replying relies on of nats-py: every message of a
subscription made with ``future=`` goes to that future's ``set_result`` (one subscription, fifty answers)."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from nodus_kit import replying


async def test_each_request_gets_its_own_answer(nc: NATS, unique: str) -> None:
    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data + b"!")

    sub = await nc.subscribe(f"echo.{unique}", cb=echo)
    try:
        bodies = [f"n{i}".encode() for i in range(50)]
        # Started together: the first requests of a connection share the one inbox subscription.
        answers = await asyncio.gather(
            *(replying.request(nc, f"echo.{unique}", b, timeout=5) for b in bodies)
        )
    finally:
        await sub.unsubscribe()
    assert [a.data for a in answers] == [b + b"!" for b in bodies]
    assert len({a.subject.rsplit(".", 1)[0] for a in answers}) == 1  # one inbox prefix


async def test_headers_go_with_the_request(nc: NATS, unique: str) -> None:
    async def headers_back(msg: Msg) -> None:
        await nc.publish(msg.reply, b"", headers={"Got": (msg.headers or {}).get("Asked", "")})

    sub = await nc.subscribe(f"echo.{unique}", cb=headers_back)
    try:
        answer = await replying.request(nc, f"echo.{unique}", b"", timeout=5, headers={"Asked": "yes"})
    finally:
        await sub.unsubscribe()
    assert answer.headers == {"Got": "yes"}


async def test_nobody_serving_is_no_responders(nc: NATS, unique: str) -> None:
    with pytest.raises(NoRespondersError):
        await replying.request(nc, f"nobody.{unique}", b"", timeout=5)


async def test_a_late_answer_is_a_timeout_and_harms_the_next_request_not(nc: NATS, unique: str) -> None:
    release = asyncio.Event()

    async def slow_then_fast(msg: Msg) -> None:
        if msg.data == b"slow":
            await release.wait()  # answered only after the asker gave up: the behaviour under test
        await msg.respond(msg.data)

    sub = await nc.subscribe(f"echo.{unique}", cb=slow_then_fast)
    try:
        with pytest.raises(NatsTimeoutError):
            await replying.request(nc, f"echo.{unique}", b"slow", timeout=0.2)
        release.set()
        assert (await replying.request(nc, f"echo.{unique}", b"fast", timeout=5)).data == b"fast"
    finally:
        await sub.unsubscribe()
