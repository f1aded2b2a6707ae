"""The gateway's own settings, read from the same ``NODUS_*`` environment as every service's Settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GatewayConfig:
        """NODUS_ADMIN_TOKEN (required), NODUS_GATEWAY_HOST and NODUS_GATEWAY_PORT."""
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
        return cls(admin_token=token, host=env.get("NODUS_GATEWAY_HOST", DEFAULT_HOST), port=port)
