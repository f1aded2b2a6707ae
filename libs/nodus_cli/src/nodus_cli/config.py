"""Where the gateway is, which token to send, which CA to trust and the namespace: flags, then the
environment, then the config file, then ``.nodus/local.env`` (the SDK's :meth:`nodus_sdk.Config.load`,
docs/sdk.md).

``make up`` writes ``.nodus/local.env`` (NODUS_URL, NODUS_TOKEN, NODUS_CA) at the root of the checkout; the
CLI finds it from the current directory or any parent, as git finds ``.git``. The local gateway serves
HTTPS with a certificate of the stack's own CA (NODUS_CA, ``.nodus/ca.crt``), which the CLI trusts on top
of the system's CAs. The namespace is ``-n``, else NODUS_PROJECT (or NODUS_NAMESPACE), else the config
file's context's project, else ``default``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nodus_sdk import Config as SdkConfig
from nodus_sdk.configuring import DEFAULT_PROJECT, find_local_env, read_env_file
from nodus_sdk.configuring import DEFAULT_SERVER as DEFAULT_SERVER
from nodus_sdk.configuring import LOCAL_ENV as LOCAL_ENV

DEFAULT_NAMESPACE: Final = DEFAULT_PROJECT

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_SERVER",
    "LOCAL_ENV",
    "Config",
    "find_local_env",
    "load",
    "read_env_file",
]


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


def load(
    *,
    server: str | None,
    token: str | None,
    namespace: str | None,
    environ: Mapping[str, str],
    cwd: Path,
    ca: str | None = None,
) -> Config:
    # The SDK's rules, among them: the local stack's (or a context's) token and CA are only ever sent to
    # that stack's URL: a --server or NODUS_URL that points elsewhere must not receive them.
    sdk = SdkConfig.load(server=server, token=token, project=namespace, ca=ca, environ=environ, cwd=cwd)
    return Config(
        server=sdk.server,
        token=sdk.token,
        namespace=sdk.project,
        namespace_given=namespace is not None,
        local_env=sdk.local_env,
        ca=sdk.ca,
    )
