"""Where the gateway is, which token to send and which CA to trust: flags, then the environment, then
``.nodus/local.env``.

``make up`` writes ``.nodus/local.env`` (NODUS_URL, NODUS_TOKEN, NODUS_CA) at the root of the checkout; the
CLI finds it from the current directory or any parent, as git finds ``.git``. The local gateway serves
HTTPS with a certificate of the stack's own CA (NODUS_CA, ``.nodus/ca.crt``), which the CLI trusts on top
of the system's CAs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

DEFAULT_SERVER: Final = "http://127.0.0.1:8440"
DEFAULT_NAMESPACE: Final = "default"
LOCAL_ENV: Final = Path(".nodus") / "local.env"


@dataclass(frozen=True, slots=True)
class Config:
    server: str
    token: str | None
    namespace: str
    namespace_given: bool
    """Whether -n was passed: only then may it contradict a manifest's own metadata.namespace."""
    local_env: Path | None
    """The local.env file read, if any (named in hints)."""
    ca: str | None = None
    """A PEM file of CA certificates trusted for an https server, besides the system's."""


def find_local_env(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        candidate = directory / LOCAL_ENV
        if candidate.is_file():
            return candidate
    return None


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines; blank lines, comments and ``export`` prefixes are allowed, quotes stripped."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def load(
    *,
    server: str | None,
    token: str | None,
    namespace: str | None,
    environ: Mapping[str, str],
    cwd: Path,
    ca: str | None = None,
) -> Config:
    local_env = find_local_env(cwd)
    local = read_env_file(local_env) if local_env else {}
    url = server or environ.get("NODUS_URL") or local.get("NODUS_URL") or DEFAULT_SERVER
    url = url.rstrip("/")
    # The local stack's token is only ever sent to the local stack's URL: a --server or NODUS_URL that
    # points elsewhere must not receive it.
    is_local = local.get("NODUS_URL", "").rstrip("/") == url
    local_token = local.get("NODUS_TOKEN") if is_local else None
    # The same for its CA: trusted for the local stack's URL only.
    local_ca = local.get("NODUS_CA") if is_local else None
    if local_ca and local_env and not Path(local_ca).is_absolute():
        local_ca = str(local_env.parent.parent / local_ca)  # relative to the checkout, as .nodus/ is
    return Config(
        server=url,
        token=token or environ.get("NODUS_TOKEN") or local_token,
        namespace=namespace or DEFAULT_NAMESPACE,
        namespace_given=namespace is not None,
        local_env=local_env,
        ca=ca or environ.get("NODUS_CA") or local_ca,
    )
