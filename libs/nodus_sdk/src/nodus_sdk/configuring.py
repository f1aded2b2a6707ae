"""Where the gateway is, which token to send, which project to use and which CA to trust.

:meth:`Config.load` takes each setting from the first of these that has it:

1. the arguments given to it (``Config.load(server=..., token=...)``);
2. the environment: ``NODUS_URL``, ``NODUS_TOKEN``, ``NODUS_PROJECT`` (or ``NODUS_NAMESPACE``), ``NODUS_CA``;
3. the config file, ``$NODUS_CONFIG`` or ``~/.config/nodus/config.yaml``: its current context (or the one
   ``NODUS_CONTEXT`` / ``context=`` names), a minimal kubeconfig::

       current-context: local
       contexts:
         - name: local
           server: https://127.0.0.1:8443
           token: nodus-...
           project: default
           ca: /work/main/.nodus/ca.crt      # relative paths are relative to the file's directory

4. ``.nodus/local.env``, which ``make up`` writes, found from the current directory upwards as git finds
   ``.git`` (NODUS_URL, NODUS_TOKEN, NODUS_CA; a relative CA is relative to the checkout).

A token and a CA belong to a server: those of the config file's context and of local.env are used only
when the server chosen is theirs, so a NODUS_URL that points elsewhere never receives them. The project
defaults to ``default``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import yaml

DEFAULT_SERVER: Final = "http://127.0.0.1:8440"
DEFAULT_PROJECT: Final = "default"
LOCAL_ENV: Final = Path(".nodus") / "local.env"
CONFIG_PATH: Final = Path(".config") / "nodus" / "config.yaml"
"""The config file, under the home directory (``$NODUS_CONFIG`` overrides it)."""
CONTEXT_KEYS: Final = ("server", "token", "project", "ca")


class ConfigError(ValueError):
    """The config file cannot be used (not YAML, no such context, a field of the wrong type)."""


@dataclass(frozen=True, slots=True)
class Context:
    """One named context of the config file: a server and what to use with it."""

    name: str
    server: str | None = None
    token: str | None = None
    project: str | None = None
    ca: str | None = None


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """The config file's contents: its contexts and which one is current."""

    path: Path
    current_context: str | None = None
    contexts: tuple[Context, ...] = ()

    def context(self, name: str | None = None) -> Context | None:
        """The named context, or the current one (None when there is none)."""
        wanted = name or self.current_context
        if wanted is None:
            return None
        for ctx in self.contexts:
            if ctx.name == wanted:
                return ctx
        raise ConfigError(f"{self.path}: no context named {wanted!r} (it has {self.names() or 'none'})")

    def names(self) -> str:
        return ", ".join(c.name for c in self.contexts)


@dataclass(frozen=True, slots=True)
class Config:
    """What a client needs: the gateway's URL, the bearer token, the default project and a CA to trust."""

    server: str = DEFAULT_SERVER
    token: str | None = None
    project: str = DEFAULT_PROJECT
    ca: str | None = None
    """A PEM file of CA certificates trusted for an https server, besides the system's."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Where each setting came from ("argument", "environment", the config file's or local.env's path,
    "default"): for messages that say which setting to change."""
    local_env: Path | None = None
    """The local.env file found, if any."""

    @classmethod
    def load(
        cls,
        *,
        server: str | None = None,
        token: str | None = None,
        project: str | None = None,
        ca: str | None = None,
        context: str | None = None,
        environ: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        config_file: Path | None = None,
        home: Path | None = None,
    ) -> Config:
        """The settings from the arguments, the environment, the config file and local.env, in that order
        (the module's notes). ``environ``, ``cwd``, ``config_file`` and ``home`` default to the process'
        own and exist for tests and tools."""
        env = os.environ if environ is None else environ
        path = config_file or config_path(env, home)
        file = read_config_file(path) if path.is_file() else None
        ctx = file.context(context or env.get("NODUS_CONTEXT") or None) if file else None
        local_env = find_local_env(cwd or Path.cwd())
        local = read_env_file(local_env) if local_env else {}
        return resolve(
            given={"server": server, "token": token, "project": project, "ca": ca},
            environ=env,
            context=_context_settings(ctx, path) if ctx else {},
            context_source=str(path),
            local=_local_settings(local, local_env),
            local_source=str(local_env),
            local_env=local_env,
        )


def with_overrides(
    config: Config | None,
    *,
    server: str | None = None,
    token: str | None = None,
    project: str | None = None,
    ca: str | None = None,
) -> Config:
    """``config`` with the settings given replaced, or :meth:`Config.load` of them when there is none."""
    if config is None:
        return Config.load(server=server, token=token, project=project, ca=ca)
    if server is None and token is None and project is None and ca is None:
        return config
    return replace(
        config,
        server=server.rstrip("/") if server else config.server,
        token=token or config.token,
        project=project or config.project,
        ca=ca or config.ca,
    )


def resolve(
    *,
    given: Mapping[str, str | None],
    environ: Mapping[str, str],
    context: Mapping[str, str],
    context_source: str,
    local: Mapping[str, str],
    local_source: str,
    local_env: Path | None = None,
) -> Config:
    """The precedence itself, on plain mappings (pure: :meth:`Config.load` reads the files)."""
    env = {
        "server": environ.get("NODUS_URL"),
        "token": environ.get("NODUS_TOKEN"),
        "project": environ.get("NODUS_PROJECT") or environ.get("NODUS_NAMESPACE"),
        "ca": environ.get("NODUS_CA"),
    }
    layers: list[tuple[str, Mapping[str, str | None]]] = [
        ("argument", given),
        ("environment", env),
        (context_source, context),
        (local_source, local),
    ]
    chosen: dict[str, str] = {}
    sources: dict[str, str] = {}
    for key in ("server", "project"):
        for source, values in layers:
            value = values.get(key)
            if value:
                chosen[key], sources[key] = value, source
                break
    server = chosen.get("server", DEFAULT_SERVER).rstrip("/")
    sources.setdefault("server", "default")
    for key in ("token", "ca"):
        for source, values in layers:
            value = values.get(key)
            # A file's token and CA go with the file's server only.
            if value and (source in ("argument", "environment") or _same(values.get("server"), server)):
                chosen[key], sources[key] = value, source
                break
    return Config(
        server=server,
        token=chosen.get("token"),
        project=chosen.get("project", DEFAULT_PROJECT),
        ca=chosen.get("ca"),
        sources={**sources, "project": sources.get("project", "default")},
        local_env=local_env,
    )


def _same(a: str | None, b: str) -> bool:
    return a is not None and a.rstrip("/") == b


def config_path(environ: Mapping[str, str], home: Path | None = None) -> Path:
    """``$NODUS_CONFIG``, else ``~/.config/nodus/config.yaml``."""
    explicit = environ.get("NODUS_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    return (home or Path.home()) / CONFIG_PATH


def read_config_file(path: Path) -> ConfigFile:
    """The config file; :class:`ConfigError` when it is not the layout the module's notes show."""
    try:
        data: Any = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with current-context and contexts")
    raw_contexts = data.get("contexts") or []
    if not isinstance(raw_contexts, list):
        raise ConfigError(f"{path}: contexts must be a list")
    contexts = []
    for i, raw in enumerate(raw_contexts):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ConfigError(f"{path}: contexts[{i}] must be a mapping with a name")
        values = {k: raw.get(k) for k in CONTEXT_KEYS}
        for key, value in values.items():
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{path}: contexts[{i}].{key} must be a string")
        contexts.append(Context(name=raw["name"], **values))
    current = data.get("current-context")
    if current is not None and not isinstance(current, str):
        raise ConfigError(f"{path}: current-context must be a string")
    return ConfigFile(path=path, current_context=current, contexts=tuple(contexts))


def write_context(path: Path, context: Context, *, make_current: bool = True) -> ConfigFile:
    """Add (or replace) a context in the config file, written with mode 0600 since it holds tokens."""
    old = read_config_file(path) if path.is_file() else ConfigFile(path=path)
    contexts = [c for c in old.contexts if c.name != context.name] + [context]
    current = context.name if make_current or old.current_context is None else old.current_context
    data = {
        "current-context": current,
        "contexts": [
            {"name": c.name, **{k: getattr(c, k) for k in CONTEXT_KEYS if getattr(c, k) is not None}}
            for c in contexts
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT: tighten it too
    return ConfigFile(path=path, current_context=current, contexts=tuple(contexts))


def _context_settings(ctx: Context, path: Path) -> dict[str, str]:
    values = {k: getattr(ctx, k) for k in CONTEXT_KEYS if getattr(ctx, k)}
    if "ca" in values and not Path(values["ca"]).expanduser().is_absolute():
        values["ca"] = str(path.parent / values["ca"])
    elif "ca" in values:
        values["ca"] = str(Path(values["ca"]).expanduser())
    return values


def _local_settings(local: Mapping[str, str], local_env: Path | None) -> dict[str, str]:
    values = {
        "server": local.get("NODUS_URL", ""),
        "token": local.get("NODUS_TOKEN", ""),
        "project": local.get("NODUS_PROJECT", ""),
        "ca": local.get("NODUS_CA", ""),
    }
    if values["ca"] and local_env and not Path(values["ca"]).is_absolute():
        values["ca"] = str(local_env.parent.parent / values["ca"])  # relative to the checkout, as .nodus/ is
    return {k: v for k, v in values.items() if v}


def find_local_env(start: Path) -> Path | None:
    """``.nodus/local.env`` in ``start`` or the nearest parent that has one."""
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
