"""A request/reply over a nats-py connection with less per-call work than ``Client.request``.

``Client.request`` (nats-py 2.x, new-style inbox) pays, per call, for a random suffix from ``os.urandom``,
three copies of the inbox as bytearrays, a done-callback closure and ``asyncio.wait_for`` (on Python 3.11
a second future, a partial and two callback registrations); and each reply reaches its waiter through the
response subscription's queue and the task that drains it: two more turns of the event loop. The
gateway's create does one JetStream publish per request, so all of that is part of every create's cost
(bench/gateway_bench.py).

Here each connection gets one wildcard inbox subscription of its own whose pending queue is a
:class:`_Mux`: nats-py hands every reply to the queue's ``put_nowait``, which resolves the waiting
request's future in place. Tokens are a per-process counter in hex. What this relies on of nats-py
(pinned in the lock): a subscription without a callback keeps its messages in ``_pending_queue``, calls
nothing on it but ``put_nowait``/``qsize``/``empty``/``join``/``task_done`` and keeps ``_pending_size``
(checked at import: on a nats-py without them every call is ``Client.request``). The subscription is
made again, as nats-py makes every subscription again, when the connection reconnects.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Final

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ConnectionDrainingError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

_STATUS: Final = "Status"
_NO_RESPONDERS: Final = "503"
_LEAN: Final = hasattr(Subscription, "pending_msgs") and hasattr(NATS, "_process_msg")
_tokens = itertools.count(1)


class _Mux:
    """The pending queue of one inbox subscription: each reply resolves its request's future at once."""

    def __init__(self, nc: NATS, prefix: str) -> None:
        self.nc, self.prefix, self.cut = nc, prefix, len(prefix)
        self.waiters: dict[str, asyncio.Future[Msg]] = {}
        self.sub: Any = None

    # -- the asyncio.Queue surface nats-py uses --------------------------------------------------
    def put_nowait(self, msg: Msg) -> None:
        self.sub._pending_size -= len(msg.data)  # delivered at once: nothing stays pending
        future = self.waiters.pop(msg.subject[self.cut :], None)
        if future is not None and not future.done():
            future.set_result(msg)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        return None

    async def join(self) -> None:
        return None


_muxes: dict[int, _Mux] = {}  # id(connection) -> its mux
_making: dict[int, asyncio.Future[_Mux]] = {}


async def _mux_for(nc: NATS) -> _Mux:
    mux = _muxes.get(id(nc))
    if mux is not None and mux.nc is nc:
        return mux
    making = _making.get(id(nc))
    if making is not None:
        return await asyncio.shield(making)
    made: asyncio.Future[_Mux] = asyncio.get_running_loop().create_future()
    _making[id(nc)] = made
    try:
        mux = _Mux(nc, nc.new_inbox() + ".")
        sub = await nc.subscribe(mux.prefix + "*")
        sub._pending_queue = mux  # type: ignore[assignment]
        mux.sub = sub
        _muxes[id(nc)] = mux
        made.set_result(mux)
        return mux
    except BaseException as e:
        made.set_exception(e)
        made.exception()  # retrieved: a failed first request is not an "exception never retrieved"
        raise
    finally:
        _making.pop(id(nc), None)


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(NatsTimeoutError())


async def request(
    nc: NATS, subject: str, payload: bytes, *, timeout: float, headers: dict[str, str] | None = None
) -> Msg:
    """``nc.request(subject, payload, timeout=timeout, headers=headers)``, with the same errors
    (nats.errors.TimeoutError, NoRespondersError, ConnectionDrainingError)."""
    if not _LEAN:
        return await nc.request(subject, payload, timeout=timeout, headers=headers)
    if nc.is_draining_pubs:
        raise ConnectionDrainingError
    mux = await _mux_for(nc)
    token = format(next(_tokens), "x")
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Msg] = loop.create_future()
    mux.waiters[token] = future
    try:
        await nc.publish(subject, payload, reply=mux.prefix + token, headers=headers)
        timer = loop.call_later(timeout, _expire, future)
        try:
            msg = await future
        finally:
            timer.cancel()
    finally:
        mux.waiters.pop(token, None)
    if msg.headers and msg.headers.get(_STATUS) == _NO_RESPONDERS:
        raise NoRespondersError
    return msg
