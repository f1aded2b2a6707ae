"""The scheduler service process."""

from __future__ import annotations

import logging

from nodus_kit.servicing import Service

log = logging.getLogger(__name__)


class SchedulerService(Service):
    name = "nodus-scheduler"

    async def start(self) -> None:
        # Connected, streams and buckets declared, health endpoint up. Not built yet: placing Jobs on nodes (issue #3/#5).
        log.warning("nodus-scheduler runs but does no work yet: placing Jobs on nodes (issue #3/#5) is not built")
