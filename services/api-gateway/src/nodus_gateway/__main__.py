"""`python -m nodus_gateway` and the `nodus-gateway` console script."""

from __future__ import annotations

import os
import ssl
import sys

from nodus_gateway.config import ConfigError, GatewayConfig
from nodus_gateway.service import GatewayService
from nodus_kit.servicing import main as run_service


def _refuse(reason: str) -> None:
    print(f"nodus-gateway: refusing to start: {reason}", file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    # Checked here as well as in GatewayService: the kit's main would report it as a traceback.
    try:
        config = GatewayConfig.from_env(os.environ)
    except ConfigError as e:
        _refuse(str(e))
        return
    if config.tls_cert and config.tls_key:
        # The same for a certificate or key that does not load (not PEM, or a key of another certificate).
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(config.tls_cert, config.tls_key)
        except OSError as e:  # ssl.SSLError is one
            _refuse(
                f"cannot load NODUS_GATEWAY_TLS_CERT={config.tls_cert!r} with "
                f"NODUS_GATEWAY_TLS_KEY={config.tls_key!r}: {e}"
            )
    run_service(GatewayService)


if __name__ == "__main__":
    main()
