"""The CLI's config file: named contexts (a server, a token, a CA, a project) and the current one.

``$NODUS_CONFIG``, else ``~/.config/nodus/config.yaml``; YAML, mode 0600 (it holds tokens)::

    current-context: prod
    contexts:
    - name: prod
      server: https://nodus.example.com
      token: ...
      project: team-a
      ca: /path/to/ca.crt

The SDK's ``Config.load()`` reads the same file with the same layout. ``nodus login`` writes a context
and makes it current; ``nodus config view|use-context|set-project`` read and change the file. What the
file says comes after the flags and the environment and before ``.nodus/local.env``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from nodus_sdk import configuring

ENV_VAR: Final = "NODUS_CONFIG"
KEYS: Final = ("name", "server", "token", "project", "ca")


class ConfigFileError(Exception):
    """The config file cannot be read or written, or does not say what was asked."""


@dataclass(frozen=True, slots=True)
class Context:
    name: str
    server: str
    token: str | None = None
    project: str | None = None
    ca: str | None = None

    def as_dict(self) -> dict[str, str]:
        return {k: v for k in KEYS if (v := getattr(self, k))}


@dataclass(slots=True)
class ConfigFile:
    path: Path
    current: str | None = None
    contexts: list[Context] = field(default_factory=list)

    def context(self, name: str | None = None) -> Context | None:
        wanted = name or self.current
        return next((c for c in self.contexts if c.name == wanted), None)

    def put(self, context: Context) -> None:
        """Add or replace the context of that name."""
        self.contexts = [c for c in self.contexts if c.name != context.name] + [context]

    def as_dict(self) -> dict[str, Any]:
        return {"current-context": self.current, "contexts": [c.as_dict() for c in self.contexts]}


def path_of(environ: Mapping[str, str]) -> Path:
    given = environ.get(ENV_VAR)
    if given:
        return Path(given).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
    return Path(base) / "nodus" / "config.yaml"


def read(environ: Mapping[str, str]) -> ConfigFile:
    """The config file; an empty one when there is none. The SDK's reader checks the layout, so the SDK
    and the CLI agree on what a valid file is."""
    path = path_of(environ)
    if not path.exists():
        return ConfigFile(path)
    try:
        parsed = configuring.read_config_file(path)
    except configuring.ConfigError as e:
        raise ConfigFileError(str(e)) from None
    except OSError as e:
        raise ConfigFileError(f"cannot read {path}: {e.strerror or e}") from None
    contexts = []
    for i, c in enumerate(parsed.contexts):
        if not c.server:
            raise ConfigFileError(f"{path}: contexts[{i}] ({c.name}) needs a server")
        contexts.append(Context(c.name, c.server, c.token, c.project, c.ca))
    return ConfigFile(path, parsed.current_context, contexts)


def write(config: ConfigFile) -> None:
    """Write the file whole, mode 0600 from its first byte (a temporary file renamed over it)."""
    path = config.path
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yaml")  # mode 0600
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(config.as_dict(), f, sort_keys=False)
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigFileError(f"cannot write {path}: {e.strerror or e}") from None


def default_name(server: str) -> str:
    """A context's name when ``nodus login`` is not given one: the server's host and port."""
    return urlsplit(server).netloc or server


def redacted(config: ConfigFile) -> dict[str, Any]:
    """``config view`` without ``--raw``: tokens shown as REDACTED, as kubectl shows them."""
    data = config.as_dict()
    for c in data["contexts"]:
        if "token" in c:
            c["token"] = "REDACTED"
    return data
