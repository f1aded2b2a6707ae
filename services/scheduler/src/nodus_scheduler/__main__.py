"""`python -m nodus_scheduler` and the `nodus-scheduler` console script."""

from __future__ import annotations

from nodus_kit.servicing import main as run_service
from nodus_scheduler.service import SchedulerService


def main() -> None:
    run_service(SchedulerService)


if __name__ == "__main__":
    main()
