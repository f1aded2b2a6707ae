"""One NATS connection per process, reconnecting for ever: the bus is the only infrastructure we need."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS

from nodus_kit import credentials

log = logging.getLogger(__name__)


async def connect(
    url: str,
    name: str,
    *,
    connect_timeout: float = 5.0,
    nkey_seed: str | Path | None = None,
    inbox_prefix: str | None = None,
) -> NATS:
    """Connect with unlimited reconnects; a service keeps running through a server restart.

    ``nkey_seed``: the file holding this process's nkey seed (deploy/nats/, ADR-0026); its inbox prefix
    then defaults to the only one its permissions let it subscribe to, ``_INBOX_<public key>``.
    ``inbox_prefix``: replies come to ``<prefix>.>``. Both None: no credential, nats-py's ``_INBOX``."""
    options: dict[str, Any] = {}
    if nkey_seed is not None:
        # Read here as well as by nats-py: a missing or broken seed fails the start with its path.
        inbox_prefix = inbox_prefix or credentials.inbox_of_seed(nkey_seed)
        options["nkeys_seed"] = str(nkey_seed)
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix

    async def on_error(e: Exception) -> None:
        # A permissions violation lands here too: the server refused a publish or a subscription.
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
        **options,
    )
