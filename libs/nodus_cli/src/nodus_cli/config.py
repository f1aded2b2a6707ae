"""Where the gateway is and which token to send: flags, then the environment, then ``.nodus/local.env``.

``make up`` writes ``.nodus/local.env`` (NODUS_URL, NODUS_TOKEN) at the root of the checkout; the CLI
finds it from the current directory or any parent, as git finds ``.git``.
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
) -> Config:
    local_env = find_local_env(cwd)
    local = read_env_file(local_env) if local_env else {}
    url = server or environ.get("NODUS_URL") or local.get("NODUS_URL") or DEFAULT_SERVER
    url = url.rstrip("/")
    # The local stack's token is only ever sent to the local stack's URL: a --server or NODUS_URL that
    # points elsewhere must not receive it.
    local_token = local.get("NODUS_TOKEN") if local.get("NODUS_URL", "").rstrip("/") == url else None
    return Config(
        server=url,
        token=token or environ.get("NODUS_TOKEN") or local_token,
        namespace=namespace or DEFAULT_NAMESPACE,
        namespace_given=namespace is not None,
        local_env=local_env,
    )
