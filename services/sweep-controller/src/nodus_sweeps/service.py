"""The sweeps service process."""

from __future__ import annotations

import logging

from nodus_kit.servicing import Service

log = logging.getLogger(__name__)


class SweepsService(Service):
    name = "nodus-sweeps"

    async def start(self) -> None:
        # Connected, streams and buckets declared, health endpoint up. Not built yet: expanding Sweeps into cell Jobs (issue #3/#8).
        log.warning("nodus-sweeps runs but does no work yet: expanding Sweeps into cell Jobs (issue #3/#8) is not built")
