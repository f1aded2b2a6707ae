"""One NATS connection per process, reconnecting for ever: the bus is the only infrastructure we need."""

from __future__ import annotations

import logging

import nats
from nats.aio.client import Client as NATS

log = logging.getLogger(__name__)


async def connect(url: str, name: str, *, connect_timeout: float = 5.0) -> NATS:
    """Connect with unlimited reconnects; a service keeps running through a server restart."""

    async def on_error(e: Exception) -> None:
        log.warning("nats error: %s", e, extra={"service": name})

    async def on_disconnect() -> None:
        log.warning("nats disconnected", extra={"service": name})

    async def on_reconnect() -> None:
        log.info("nats reconnected", extra={"service": name})

    return await nats.connect(
        servers=[u.strip() for u in url.split(",")],
        name=name,
        connect_timeout=connect_timeout,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.25,
        allow_reconnect=True,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        # Buffer writes made while reconnecting (published once the connection is back).
        pending_size=64 * 1024 * 1024,
    )
