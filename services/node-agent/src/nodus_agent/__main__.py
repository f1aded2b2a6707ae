"""`python -m nodus_agent` and the `nodus-agent` console script."""

from __future__ import annotations

from nodus_agent.service import AgentService
from nodus_kit.servicing import main as run_service


def main() -> None:
    run_service(AgentService)


if __name__ == "__main__":
    main()
