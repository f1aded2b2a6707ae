"""`python -m nodus_gateway` and the `nodus-gateway` console script."""

from __future__ import annotations

import os
import sys

from nodus_gateway.config import ConfigError, GatewayConfig
from nodus_gateway.service import GatewayService
from nodus_kit.servicing import main as run_service


def main() -> None:
    # Checked here as well as in GatewayService: the kit's main would report it as a traceback.
    try:
        GatewayConfig.from_env(os.environ)
    except ConfigError as e:
        print(f"nodus-gateway: refusing to start: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    run_service(GatewayService)


if __name__ == "__main__":
    main()
