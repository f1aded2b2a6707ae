"""`python -m nodus_agent` and the `nodus-agent` console script."""

from __future__ import annotations

import os
import sys

from nodus_agent.configuring import prepare
from nodus_agent.service import AgentService
from nodus_kit.servicing import main as run_service


def main() -> None:
    prepare(sys.argv[1:], os.environ)  # --config FILE, --check; a bad setting exits here, named
    run_service(AgentService)


if __name__ == "__main__":
    main()
