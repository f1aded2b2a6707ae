"""The billing service process."""

from __future__ import annotations

import logging

from nodus_kit.servicing import Service

log = logging.getLogger(__name__)


class BillingService(Service):
    name = "nodus-billing"

    async def start(self) -> None:
        # Connected, streams and buckets declared, health endpoint up. Not built yet: metering and caps (issue #3/#7).
        log.warning("nodus-billing runs but does no work yet: metering and caps (issue #3/#7) is not built")
