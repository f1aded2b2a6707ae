"""The gateway's own settings, read from the same ``NODUS_*`` environment as every service's Settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8440
MAX_BODY_BYTES: Final = 1 << 20
"""1 MiB: a Sweep with its whole template is a few KiB; anything near this is data that belongs in inputs.
Kubernetes allows 3 MiB, but it also stores Secrets and ConfigMaps, which Nodus keeps elsewhere."""


class ConfigError(Exception):
    """The gateway cannot start with these settings; the message says what to set."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    admin_token: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = MAX_BODY_BYTES
    tls_cert: str | None = None
    """PEM certificate chain; with ``tls_key`` the API is served over HTTPS."""
    tls_key: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GatewayConfig:
        """NODUS_ADMIN_TOKEN (required), NODUS_GATEWAY_HOST, NODUS_GATEWAY_PORT, and NODUS_GATEWAY_TLS_CERT
        with NODUS_GATEWAY_TLS_KEY (both or neither: HTTPS, or plain HTTP)."""
        token = env.get("NODUS_ADMIN_TOKEN", "").strip()
        if not token:
            # Starting without a token would mean either refusing every call or accepting anyone's, and
            # both fail far from the cause; failing here names the variable to set.
            raise ConfigError(
                "NODUS_ADMIN_TOKEN is not set, and the API refuses every call without a token to compare "
                "against. Set NODUS_ADMIN_TOKEN to a long random string (`make up` generates one and "
                "writes it to .nodus/local.env as NODUS_TOKEN for the nodus CLI)."
            )
        raw_port = env.get("NODUS_GATEWAY_PORT", str(DEFAULT_PORT))
        try:
            port = int(raw_port)
        except ValueError:
            raise ConfigError(f"NODUS_GATEWAY_PORT={raw_port!r} is not a port number") from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"NODUS_GATEWAY_PORT={port} is not between 0 and 65535")
        cert, key = _tls_files(env)
        return cls(
            admin_token=token,
            host=env.get("NODUS_GATEWAY_HOST", DEFAULT_HOST),
            port=port,
            tls_cert=cert,
            tls_key=key,
        )


def _tls_files(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """Both TLS paths or neither. Bearer tokens must not cross plain HTTP by accident: half a TLS setting is
    a mistake, so it stops the start instead of silently serving HTTP."""
    cert = env.get("NODUS_GATEWAY_TLS_CERT", "").strip() or None
    key = env.get("NODUS_GATEWAY_TLS_KEY", "").strip() or None
    if (cert is None) != (key is None):
        given, missing = (
            ("NODUS_GATEWAY_TLS_CERT", "NODUS_GATEWAY_TLS_KEY")
            if cert
            else ("NODUS_GATEWAY_TLS_KEY", "NODUS_GATEWAY_TLS_CERT")
        )
        raise ConfigError(
            f"{given} is set but {missing} is not: HTTPS needs both the certificate and its private key "
            "(PEM files). Set both, or neither to serve plain HTTP."
        )
    for name, path in (("NODUS_GATEWAY_TLS_CERT", cert), ("NODUS_GATEWAY_TLS_KEY", key)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{name}={path!r}: no such file")
    return cert, key
