"""The gateway's own settings, read from the same ``NODUS_*`` environment as every service's Settings."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import msgspec

from nodus_gateway.authlimits import DEFAULT_FAILURES, DEFAULT_MAX_CLIENTS, DEFAULT_WINDOW_S
from nodus_gateway.gitrefs import GitSettings
from nodus_gateway.reaching import PublicSettings, RunAccess, run_access
from nodus_gateway.storeaccess import StoreSettings
from nodus_kit.configuring import SettingError, read_settings

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8440
MAX_BODY_BYTES: Final = 1 << 20
"""1 MiB: a Sweep with its whole template is a few KiB; anything near this is data that belongs in inputs.
Kubernetes allows 3 MiB, but it also stores Secrets and ConfigMaps, which Nodus keeps elsewhere."""


S = TypeVar("S", bound=msgspec.Struct)


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
    auth_failures: int = DEFAULT_FAILURES
    """Rejected credentials per client within ``auth_window_s`` before it gets 429 (0: no limit)."""
    auth_window_s: float = DEFAULT_WINDOW_S
    auth_max_clients: int = DEFAULT_MAX_CLIENTS
    """Clients whose failures are tracked at once (the least recently failing one is forgotten first)."""
    trusted_proxies: tuple[str, ...] = ()
    """Addresses or CIDRs of proxies whose X-Forwarded-For names the client; none by default."""
    store: StoreSettings = field(default_factory=StoreSettings)
    """Nodus's own S3 store, for blobs and Workspace files (storeaccess.py)."""
    git: GitSettings = field(default_factory=GitSettings)
    """How admission asks git hosts about spec.source.git (gitrefs.py)."""
    run_access: RunAccess = field(default_factory=RunAccess)
    """The URL and CA a run with a ServiceAccount is given (reaching.py, ADR-0037)."""

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GatewayConfig:
        """NODUS_ADMIN_TOKEN (required), NODUS_GATEWAY_HOST, NODUS_GATEWAY_PORT, NODUS_GATEWAY_TLS_CERT
        with NODUS_GATEWAY_TLS_KEY (both or neither: HTTPS, or plain HTTP), and the limit on failed
        authentication: NODUS_GATEWAY_AUTH_FAILURES, NODUS_GATEWAY_AUTH_WINDOW_S,
        NODUS_GATEWAY_AUTH_MAX_CLIENTS and NODUS_GATEWAY_TRUSTED_PROXIES (docs/tokens.md), the store
        of blobs and Workspace files (NODUS_STORE_BUCKET and the rest of storeaccess.StoreSettings), and
        the git hosts admission asks (NODUS_GIT_HOST and the rest of gitrefs.GitSettings), and how runs
        reach the API (NODUS_PUBLIC_URL, NODUS_PUBLIC_CA: reaching.py)."""
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
        host = env.get("NODUS_GATEWAY_HOST", DEFAULT_HOST)
        public = _read(PublicSettings, env)
        return cls(
            admin_token=token,
            host=host,
            port=port,
            tls_cert=cert,
            tls_key=key,
            auth_failures=_int(env, "NODUS_GATEWAY_AUTH_FAILURES", DEFAULT_FAILURES, 0, 1_000_000),
            auth_window_s=_seconds(env, "NODUS_GATEWAY_AUTH_WINDOW_S", DEFAULT_WINDOW_S, 86_400.0),
            auth_max_clients=_int(env, "NODUS_GATEWAY_AUTH_MAX_CLIENTS", DEFAULT_MAX_CLIENTS, 1, 10_000_000),
            trusted_proxies=_trusted_proxies(env),
            store=_read(StoreSettings, env),
            git=_read(GitSettings, env),
            run_access=run_access(public, host=host, port=port, tls=cert is not None),
        )


def _read(cls: type[S], env: Mapping[str, str]) -> S:
    try:
        return read_settings(cls, env)
    except SettingError as e:
        raise ConfigError(str(e)) from None


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise ConfigError(f"{name}={value} is not between {low} and {high}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float, high: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not 0 < value <= high:
        raise ConfigError(f"{name}={value:g} is not more than 0 and at most {high:g} seconds")
    return value


def _trusted_proxies(env: Mapping[str, str]) -> tuple[str, ...]:
    """NODUS_GATEWAY_TRUSTED_PROXIES: comma-separated addresses or CIDRs. Only a connection from one of
    them has its X-Forwarded-For read (the rightmost address that is not a trusted proxy is the client);
    from anyone else the header is a claim anyone can make, so it is ignored. ``*`` is refused: it would
    let every caller choose the address its failures are counted under."""
    raw = env.get("NODUS_GATEWAY_TRUSTED_PROXIES", "").strip()
    out: list[str] = []
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        try:
            network = ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise ConfigError(
                f"NODUS_GATEWAY_TRUSTED_PROXIES: {item!r} is not an IP address or CIDR (such as 10.0.0.0/8); "
                "list the addresses of the proxies in front of the gateway, comma-separated"
            ) from None
        out.append(str(network) if "/" in item else str(network.network_address))
    return tuple(out)


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
