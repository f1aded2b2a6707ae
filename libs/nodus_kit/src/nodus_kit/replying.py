"""A request/reply over a nats-py connection with less per-call work than ``Client.request``.

``Client.request`` (nats-py 2.x, new-style inbox) pays, per call, for a random suffix from ``os.urandom``,
three copies of the inbox as bytearrays, a done-callback closure and ``asyncio.wait_for`` (on Python 3.11
a second future, a partial and two callback registrations). The gateway's create does one JetStream
publish per request, so that is part of every create's cost (bench/gateway_bench.py).

This shares the connection's own response subscription and map (``_resp_map``, filled by its
``_request_sub_callback``): only the token differs, a per-process counter in hex, unique among the
requests in flight on a connection (the callback slices the token off at a fixed offset, so any length
works). The three private attributes it uses are checked at import: on a nats-py without them every call
is ``Client.request``.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Final

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import ConnectionDrainingError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

_STATUS: Final = "Status"
_NO_RESPONDERS: Final = "503"
_LEAN: Final = all(hasattr(NATS, a) for a in ("_init_request_sub", "_request_sub_callback"))
_tokens = itertools.count(1)
_prefixes: dict[int, tuple[bytearray, str]] = {}  # id(connection) -> (its prefix bytes, as str)


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
    if not nc._resp_sub_prefix:
        await nc._init_request_sub()
    token = format(next(_tokens), "x")
    inbox = _inbox_prefix(nc) + token
    resp_map: dict[str, Any] = nc._resp_map
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Msg] = loop.create_future()
    resp_map[token] = future
    try:
        await nc.publish(subject, payload, reply=inbox, headers=headers)
        timer = loop.call_later(timeout, _expire, future)
        try:
            msg = await future
        finally:
            timer.cancel()
    finally:
        resp_map.pop(token, None)
    if msg.headers and msg.headers.get(_STATUS) == _NO_RESPONDERS:
        raise NoRespondersError
    return msg


def _inbox_prefix(nc: NATS) -> str:
    # The prefix is made once per connection (on its first request) and never changes after.
    raw = nc._resp_sub_prefix
    assert raw is not None, "set by _init_request_sub"
    known = _prefixes.get(id(nc))
    if known is None or known[0] is not raw:
        known = (raw, raw.decode())
        _prefixes[id(nc)] = known
    return known[1]
