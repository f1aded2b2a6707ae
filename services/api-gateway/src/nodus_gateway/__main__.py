"""`python -m nodus_gateway` and the `nodus-gateway` console script."""

from __future__ import annotations

from nodus_kit.servicing import main as run_service

from nodus_gateway.service import GatewayService


def main() -> None:
    run_service(GatewayService)


if __name__ == "__main__":
    main()
