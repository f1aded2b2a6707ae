"""The agent service process."""

from __future__ import annotations

import logging

from nodus_kit.servicing import Service

log = logging.getLogger(__name__)


class AgentService(Service):
    name = "nodus-agent"

    async def start(self) -> None:
        # Connected, streams and buckets declared, health endpoint up. Not built yet: running Attempts (issue #3/#6).
        log.warning("nodus-agent runs but does no work yet: running Attempts (issue #3/#6) is not built")
