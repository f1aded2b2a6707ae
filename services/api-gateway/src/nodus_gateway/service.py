"""The gateway service process: the nodus.dev/v1 HTTP API, served next to the kit's health endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

from nodus_gateway.app import build_app
from nodus_gateway.authlimits import AuthFailureLimiter
from nodus_gateway.blobreaping import BlobReaper
from nodus_gateway.config import GatewayConfig
from nodus_gateway.minting import Issuer, token_key
from nodus_gateway.noding import serve_nodes
from nodus_gateway.principals import Principals, cache_ttl_of, pepper_of
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_gateway.storeaccess import StoreAccess
from nodus_kit.servicing import Check, Service, Settings

log = logging.getLogger(__name__)


class GatewayService(Service):
    name = "nodus-gateway"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        # Read before connecting: a missing NODUS_ADMIN_TOKEN stops the process before it does anything.
        self.config = GatewayConfig.from_env(settings.env)
        # Also before connecting, for the same reason: a bad NODUS_TOKEN_CACHE_TTL_S fails the start.
        self.token_pepper = pepper_of(settings.env, self.config.admin_token)
        self.token_cache_ttl_s = cache_ttl_of(settings.env)
        # Nodus's own S3 store (blobs, Workspace files); its client is made on first use.
        self.store = StoreAccess(self.config.store)
        self.server: ApiServer | None = None
        self.endpoints: list[Any] = []
        self._reaping: asyncio.Task[None] | None = None

    async def start(self) -> None:
        stores = stores_for(self.bus)
        # Node agents' requests first (the Node authorizer): an agent waits for them to run anything.
        # The commit of a writable mount HEADs the agent's upload in the store (noding.py); a run whose Job
        # names a ServiceAccount gets its token, URL and CA (minting.py, ADR-0037).
        issuer = Issuer(token_key(self.token_pepper), self.config.run_access)
        self.endpoints = await serve_nodes(self.bus, stores, self.store, issuer)
        app = build_app(
            stores,
            admin_token=self.config.admin_token,
            ready=lambda: self.nc is not None and self.nc.is_connected,
            max_body_bytes=self.config.max_body_bytes,
            principals=Principals(self.bus, pepper=self.token_pepper, cache_ttl_s=self.token_cache_ttl_s),
            auth_limiter=AuthFailureLimiter(
                self.config.auth_failures, self.config.auth_window_s, self.config.auth_max_clients
            ),
            store=self.store,
            git=self.config.git,
            run_access=self.config.run_access,
        )
        self.server = ApiServer(
            app,
            self.config.host,
            self.config.port,
            ssl_certfile=self.config.tls_cert,
            ssl_keyfile=self.config.tls_key,
            trusted_proxies=self.config.trusted_proxies,
        )
        await self.server.start()
        if self.config.store.bucket:
            ttl = timedelta(seconds=self.config.store.blob_ttl_s)
            reaper = BlobReaper(stores, self.store, ttl=ttl)
            self._reaping = asyncio.create_task(reaper.run(), name="gateway:blob-expiry")
        log.info(
            "API listening",
            extra={
                "url": self.server.url,
                "tls": self.config.tls,
                "store": self.config.store.bucket,
                "runs_reach": self.config.run_access.url,
            },
        )

    async def stop(self) -> None:
        # Runs before the kit drains NATS, so requests in flight still reach the store.
        if self._reaping is not None:
            self._reaping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaping
        if self.server is not None:
            await self.server.stop()
        for sub in self.endpoints:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await self.store.close()

    def checks(self) -> dict[str, Check]:
        checks = super().checks()

        async def http_ok() -> bool:
            return self.server is not None and self.server.serving

        checks["http"] = http_ok
        return checks
