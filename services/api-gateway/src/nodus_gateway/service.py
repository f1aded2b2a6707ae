"""The gateway service process."""

from __future__ import annotations

import logging

from nodus_kit.servicing import Service

log = logging.getLogger(__name__)


class GatewayService(Service):
    name = "nodus-gateway"

    async def start(self) -> None:
        # Connected, streams and buckets declared, health endpoint up. Not built yet: the nodus.dev/v1 HTTP API (issue #3/#4).
        log.warning("nodus-gateway runs but does no work yet: the nodus.dev/v1 HTTP API (issue #3/#4) is not built")
