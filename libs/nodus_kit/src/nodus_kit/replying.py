"""A request/reply over a nats-py connection with less per-call work than ``Client.request``.

``Client.request`` (nats-py 2.x, new-style inbox) pays, per call, for a random suffix from ``os.urandom``,
three copies of the inbox as bytearrays, a done-callback closure and ``asyncio.wait_for`` (on Python 3.11
a second future, a partial and two callback registrations); and each reply reaches its waiter through the
response subscription's queue and the task that drains it: one more turn of the event loop, which under
load (a gateway with 50 clients) is a whole cycle of every ready handler. The gateway's create does one
JetStream publish per request, so all of that is part of every create's cost (bench/gateway_bench.py).

Here each connection gets one wildcard inbox subscription of its own, made with nats-py's public
``subscribe(subject, future=...)``: nats-py hands each message of such a subscription to that future's
``set_result``, in its read loop (how its old-style requests get their answer). The future given is an
:class:`_Inbox`, never done, whose ``set_result`` resolves the waiting request's own future instead.
Tokens are a per-process counter in hex; the timeout is one timer handle. nats-py makes the
subscription again, as it makes every subscription again, when the connection reconnects.

Only public names of nats-py are used (tests/kit/test_no_private_names.py). What this relies on of it
(pinned in the lock; tests/kit/test_replying.py fails if it changes): a subscription made with
``future=`` and no ``max_msgs`` stays, and each of its messages goes to ``future.set_result`` unless
``future.cancelled()``. An earlier version swapped the subscription's private pending queue for the
same effect. A callback subscription (``cb=``, as nats-py's own request makes) would rely on nothing, but
adds back the turn of the event loop per reply that this saves.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from typing import Final

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import ConnectionDrainingError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

_STATUS: Final = "Status"
_NO_RESPONDERS: Final = "503"
_tokens = itertools.count(1)


class _Inbox(asyncio.Future[Msg]):
    """The reply subscription of one connection, ``<inbox>.<token>``, given to nats-py as the future it
    resolves with each reply: never done itself, it resolves the future of the request the token names."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix, self.cut = prefix, len(prefix)
        self.waiters: dict[str, asyncio.Future[Msg]] = {}

    def set_result(self, result: Msg) -> None:
        future = self.waiters.pop(result.subject[self.cut :], None)
        if future is not None and not future.done():  # a late reply (timed out) is dropped
            future.set_result(result)


_inboxes: weakref.WeakKeyDictionary[NATS, _Inbox] = weakref.WeakKeyDictionary()
_making: weakref.WeakKeyDictionary[NATS, asyncio.Future[_Inbox]] = weakref.WeakKeyDictionary()


async def _inbox_for(nc: NATS) -> _Inbox:
    inbox = _inboxes.get(nc)
    if inbox is not None:
        return inbox
    making = _making.get(nc)
    if making is not None:  # the first requests of a connection arrive together: one subscription
        return await asyncio.shield(making)
    made: asyncio.Future[_Inbox] = asyncio.get_running_loop().create_future()
    _making[nc] = made
    try:
        inbox = _Inbox(nc.new_inbox() + ".")
        await nc.subscribe(inbox.prefix + "*", future=inbox)
        _inboxes[nc] = inbox
        made.set_result(inbox)
        return inbox
    except BaseException as e:
        made.set_exception(e)
        made.exception()  # retrieved: a failed first request is not an "exception never retrieved"
        raise
    finally:
        _making.pop(nc, None)


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(NatsTimeoutError())


async def request(
    nc: NATS, subject: str, payload: bytes, *, timeout: float, headers: dict[str, str] | None = None
) -> Msg:
    """``nc.request(subject, payload, timeout=timeout, headers=headers)``, with the same errors
    (nats.errors.TimeoutError, NoRespondersError, ConnectionDrainingError)."""
    if nc.is_draining_pubs:
        raise ConnectionDrainingError
    inbox = await _inbox_for(nc)
    token = format(next(_tokens), "x")
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Msg] = loop.create_future()
    inbox.waiters[token] = future
    try:
        await nc.publish(subject, payload, reply=inbox.prefix + token, headers=headers)
        timer = loop.call_later(timeout, _expire, future)
        try:
            msg = await future
        finally:
            timer.cancel()
    finally:
        inbox.waiters.pop(token, None)
    if msg.headers and msg.headers.get(_STATUS) == _NO_RESPONDERS:
        raise NoRespondersError
    return msg
