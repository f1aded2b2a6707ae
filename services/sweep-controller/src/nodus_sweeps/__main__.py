"""`python -m nodus_sweeps` and the `nodus-sweeps` console script."""

from __future__ import annotations

from nodus_kit.servicing import main as run_service
from nodus_sweeps.service import SweepsService


def main() -> None:
    run_service(SweepsService)


if __name__ == "__main__":
    main()
