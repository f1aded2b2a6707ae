"""Failed authentication, limited per client: after N rejected credentials within a window, 429.

A client is the direct peer of the connection (``scope["client"]``): behind a proxy that is the proxy,
unless the proxy's address is in NODUS_GATEWAY_TRUSTED_PROXIES, in which case the server (uvicorn's proxy
headers) has already put the address the proxy forwarded for there; ``X-Forwarded-For`` is never read
here. An IPv6 client is its /64, the block one host is given (rotating addresses inside it is free), and
an IPv4-mapped IPv6 address is its IPv4 address.

The window is fixed and starts at a client's first failure: the failures counted are those since then,
and once there are ``failures`` of them, the client is limited until the window ends (Retry-After says
when). What "limited" means is :class:`nodus_gateway.auth.BearerAuth`'s: a minted token is still checked
and works if valid, anything else is answered 429 without being compared (docs/tokens.md says why).

Memory is bounded: at most ``max_clients`` clients are tracked, the one that failed least recently is
forgotten first, so an attacker rotating source addresses costs a fixed amount of memory (and at worst
gets its oldest addresses forgotten early). Every operation is O(1), and a request from a client that has
not failed costs one dictionary lookup, none at all while no client is tracked.

The state is per gateway replica: with R replicas behind a load balancer a client may get up to R × N
failures per window before every replica limits it.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from starlette.types import Scope

log = logging.getLogger(__name__)

DEFAULT_FAILURES: Final = 10
"""Failures per window before a client is limited: a person mistyping, or a script retrying a few times
with an old token, stays under it; a loop over guesses does not."""
DEFAULT_WINDOW_S: Final = 60.0
DEFAULT_MAX_CLIENTS: Final = 10_000
"""Clients tracked at once: a few MiB at most (an entry is a key and two numbers)."""


class _Failures:
    __slots__ = ("count", "since")

    def __init__(self, since: float) -> None:
        self.since = since
        self.count = 0


def client_key(scope: Scope) -> str:
    """Who failed: the peer's address (its /64 for IPv6), or "" when the server gives none."""
    client = scope.get("client")
    host = str(client[0]) if client else ""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return f"{ipaddress.IPv6Network((address, 64), strict=False).network_address}/64"


class AuthFailureLimiter:
    """Rejected credentials per client, in a fixed window; ``failures`` 0 turns the limit off."""

    def __init__(
        self,
        failures: int = DEFAULT_FAILURES,
        window_s: float = DEFAULT_WINDOW_S,
        max_clients: int = DEFAULT_MAX_CLIENTS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 0 or window_s <= 0 or max_clients < 1:
            raise ValueError("failures must be >= 0, window_s > 0 and max_clients >= 1")
        self.failures = failures
        self.window_s = window_s
        self.max_clients = max_clients
        self.clock = clock
        self._clients: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def retry_after(self, scope: Scope) -> int | None:
        """Seconds until the client of ``scope`` may fail again, or None when it is not limited."""
        if not self._clients:
            return None  # the common case: nobody failed lately, nothing to compute
        key = client_key(scope)
        entry = self._clients.get(key)
        if entry is None:
            return None
        now = self.clock()
        left = entry.since + self.window_s - now
        if left <= 0:
            del self._clients[key]  # the window is over: the client starts afresh
            return None
        return max(1, math.ceil(left)) if entry.count >= self.failures else None

    def failed(self, scope: Scope) -> None:
        """Count one rejected credential from the client of ``scope``."""
        if self.failures == 0:
            return
        key = client_key(scope)
        now = self.clock()
        entry = self._clients.get(key)
        if entry is None or entry.since + self.window_s <= now:
            entry = self._clients[key] = _Failures(now)
        entry.count += 1
        self._clients.move_to_end(key)
        if entry.count == self.failures:
            log.warning(
                "client limited after failed authentications",
                extra={"client": key, "failures": entry.count, "windowS": self.window_s},
            )
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)  # the least recently failing client
