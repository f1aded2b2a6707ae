"""`python -m nodus_billing` and the `nodus-billing` console script."""

from __future__ import annotations

from nodus_billing.service import BillingService
from nodus_kit.servicing import main as run_service


def main() -> None:
    run_service(BillingService)


if __name__ == "__main__":
    main()
