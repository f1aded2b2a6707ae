"""The agent's configuration: a TOML file (``nodus-agent --config /etc/nodus/agent.toml``) under the
``NODUS_*`` environment, which wins key by key.

Every setting has one name in the file (``gpus``, ``docker.socket``, ``s3.bucket``), one variable
(``NODUS_AGENT_GPUS``, ``NODUS_AGENT_DOCKER_SOCKET``, ``NODUS_AGENT_S3_BUCKET``) and one parser that says
what it expects. The bus and the service basics keep the kit's variables (``NODUS_NATS_URL``,
``NODUS_HEALTH_PORT``, ``NODUS_LOG_LEVEL``), so one variable means one thing in every Nodus process.

A key the agent does not know is an error that names it and the keys it knows: a typo in a config file
would otherwise be a setting silently left at its default. This module builds plain values only; it
knows nothing of :class:`~nodus_agent.settings.AgentSettings` beyond its field names, so settings can
import it without a cycle.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import re
import socket
import sys
import tomllib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from nodus_schema.quantities import parse_bytes

log = logging.getLogger(__name__)

CONFIG_ENV: Final = "NODUS_AGENT_CONFIG"
"""The variable ``--config`` sets: the service reads the file wherever ``from_env`` runs."""

RUNTIMES: Final = ("process", "docker", "simulate")
DOCKER_GPU_MODES: Final = ("device-requests", "nvidia-runtime", "none")
"""How containers get their GPUs; ``none`` for engines without the NVIDIA toolkit (fake-GPU hosts, tests)."""
GPU_FAULT_ACTIONS: Final = ("stop", "finish")

APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs a program causes on a healthy GPU (graphics engine exception, memory page fault, stopped
processing, preemptive cleanup, video processor exception, context switch timeout): NVIDIA's Kubernetes
device plugin skips the same list, since draining a node for a user's bug would let one bad Job empty a
fleet."""

DEFAULT_MAX_INPUT_BYTES: Final = parse_bytes("50Gi")
DEFAULT_CACHE_BYTES: Final = parse_bytes("100Gi")
DEFAULT_GIT_HOST: Final = "https://github.com"
"""Where ``spec.source.git.repo`` written ``owner/name`` is fetched from (ADR-0036); the gateway reads the
same variable, so admission checks the repository the agents will fetch."""

# Node names end up in subjects (``nodus.assign.<node>``), durable consumer names and KV keys: one
# subject token, so a DNS label (no dots) is the safe common ground.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_ULIMIT_NAME = re.compile(r"[a-z]+")


class ConfigError(ValueError):
    """A setting the agent cannot run with; the message names the key (or variable) and what to do."""


@dataclass(frozen=True)
class Ulimit:
    """One ``HostConfig.Ulimits`` entry of the docker runtime (``nofile=1024:2048``)."""

    name: str
    soft: int
    hard: int

    def body(self) -> dict[str, Any]:
        """The Docker Engine API's form (``HostConfig.Ulimits`` entries)."""
        return {"Name": self.name, "Soft": self.soft, "Hard": self.hard}


# -- parsers: a raw value from the file (typed) or the environment (text) -> the field's value -----------
# Each raises ValueError with what it expects; the caller adds the key and where the value came from.
Parser = Callable[[Any], Any]


def _text(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("a non-empty string")
    return raw.strip()


def _node_name(raw: Any) -> str:
    name = _text(raw)
    if not _NODE_NAME.fullmatch(name):
        raise ValueError(
            "a node name: lowercase letters, digits and '-', at most 63, starting and ending with a "
            "letter or digit"
        )
    return name


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false (also 1/0, yes/no, on/off)")


def _positive_int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError("a whole number of at least 1")
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError("a whole number of at least 1") from None
    if value < 1:
        raise ValueError("a whole number of at least 1")
    return value


def _seconds(minimum: float, positive: bool) -> Parser:
    what = "a number of seconds above 0" if positive else f"a number of seconds of at least {minimum:g}"

    def parse(raw: Any) -> float:
        if isinstance(raw, bool):
            raise ValueError(what)
        try:
            value = float(str(raw).strip())
        except ValueError:
            raise ValueError(what) from None
        if value != value or value in (float("inf"), float("-inf")) or value < minimum:
            raise ValueError(what)
        if positive and value <= 0:
            raise ValueError(what)
        return value

    return parse


def _quantity(raw: Any) -> str:
    text = _text(raw) if isinstance(raw, str) else str(raw)
    try:
        parse_bytes(text)
    except ValueError:
        raise ValueError("a size such as 80Gi, 512Mi or 1000000000") from None
    return text


def _byte_count(raw: Any) -> int:
    return parse_bytes(_quantity(raw))


def _choice(options: Sequence[str]) -> Parser:
    def parse(raw: Any) -> str:
        text = raw.strip() if isinstance(raw, str) else raw
        if text not in options:
            raise ValueError("one of " + ", ".join(options))
        return str(text)

    return parse


def _path(raw: Any) -> Path:
    return Path(_text(raw)).expanduser().absolute()


def _file(raw: Any) -> Path:
    path = _path(raw)
    if not path.is_file():
        raise ValueError(f"an existing file ({path} is not one)")
    return path


def _nats_url(raw: Any) -> str:
    text = _text(raw)
    for url in text.split(","):
        if not re.fullmatch(r"(nats|tls|ws|wss)://\S+", url.strip()):
            raise ValueError("nats://host:port (several separated by commas; tls:// for TLS)")
    return text


def _endpoint(raw: Any) -> str:
    text = _text(raw)
    if not re.fullmatch(r"https?://\S+", text):
        raise ValueError("an http:// or https:// URL")
    return text


def _git_host(raw: Any) -> str:
    # https only: a private repository's token travels in a header, never over plain http.
    text = _text(raw).rstrip("/")
    if not re.fullmatch(r"https://[^\s/?#]+(/[^\s?#]*)?", text):
        raise ValueError("an https:// URL such as https://github.com (no query, no fragment)")
    return text


def _port(raw: Any) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError("a port number from 0 to 65535 (0: any free port)") from None
    if not 0 <= value <= 65535:
        raise ValueError("a port number from 0 to 65535 (0: any free port)")
    return value


def _ulimit(name: Any, raw: Any) -> Ulimit:
    expects = "ulimits as name=soft[:hard] (nofile=1024:2048), or a table {nofile = 1024}"
    if not isinstance(name, str) or not _ULIMIT_NAME.fullmatch(name):
        raise ValueError(expects)
    soft_hard = str(raw).strip().split(":") if not isinstance(raw, bool) else []
    try:
        values = [int(v) for v in soft_hard]
    except ValueError:
        raise ValueError(expects) from None
    if len(values) not in (1, 2) or min(values) < 0:
        raise ValueError(expects)
    soft, hard = values[0], values[-1]
    if soft > hard:
        raise ValueError(f"{expects}; the soft limit of {name} is above its hard limit")
    return Ulimit(name, soft, hard)


def _ulimits(raw: Any) -> tuple[Ulimit, ...]:
    pairs: list[tuple[Any, Any]]
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, str):
        pairs = [(*item.partition("=")[::2],) for item in _items(raw)]
    else:
        raise ValueError("ulimits as name=soft[:hard] (nofile=1024:2048), or a table {nofile = 1024}")
    return tuple(_ulimit(name.strip() if isinstance(name, str) else name, value) for name, value in pairs)


def _xids(raw: Any) -> frozenset[int]:
    items = raw if isinstance(raw, list) else _items(str(raw))
    try:
        values = frozenset(int(str(x).strip()) for x in items)
    except ValueError:
        raise ValueError(
            "XID numbers, as a list [13, 31] or text 13,31 (empty: drain on every XID)"
        ) from None
    if any(v < 0 for v in values):
        raise ValueError("XID numbers, as a list [13, 31] or text 13,31 (empty: drain on every XID)")
    return values


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


# -- the keys -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Key:
    """One setting: its name in the file, its variable, its field of AgentSettings, how to read it."""

    name: str
    env: str
    field: str | None
    """The AgentSettings field; None for the kit's settings, which ``prepare`` exports to the environment."""
    parse: Parser
    default: Any = None
    help: str = ""


def _agent_env(name: str) -> str:
    return "NODUS_AGENT_" + name.replace(".", "_").upper()


def _key(
    name: str, field: str | None, parse: Parser, default: Any = None, help: str = "", env: str = ""
) -> Key:
    return Key(name, env or _agent_env(name), field, parse, default, help)


KEYS: Final[tuple[Key, ...]] = (
    _key("node", "node", _node_name, None, "a DNS label; unset: the short host name"),
    _key("offering", "offering", _text, None, "unset: <variant>-x<gpus>-<region>"),
    _key("pool", "pool", _text, None, "BYOC pool; unset: the shared capacity"),
    _key("region", "region_class", _text, "local", "region class: us, eu, asia, local"),
    _key("variant", "variant", _text, "H100-SXM-80G", "NVML's discovery wins unless forced"),
    _key("force_variant", "force_variant", _bool, False, "keep `variant` whatever NVML says"),
    _key("gpus", "gpus", _positive_int, 1, "unset on a GPU host: all NVML sees"),
    _key("gpu_memory", "gpu_memory", _quantity, "80Gi", "per GPU, of a fake inventory"),
    _key("fake_gpus", "fake_gpus", _bool, False, "skip NVML: a fake inventory"),
    _key("interruptible", "interruptible", _bool, False, "the provider may reclaim the host"),
    _key("workdir", "workdir", _path, None, "unset: .nodus/agent/<node>"),
    _key("cwd", "cwd", _path, None, "of process-runtime programs; unset: the agent's"),
    _key("heartbeat_s", "heartbeat_s", _seconds(0.0, True), 5.0, "liveness beat, on the bus"),
    _key("record_s", "record_s", _seconds(0.0, True), 60.0, "Node record refresh"),
    _key("stop_grace_s", "stop_grace_s", _seconds(0.0, False), 10.0, "SIGTERM to SIGKILL"),
    _key("runtime", "runtime", _choice(RUNTIMES), "process"),
    _key("docker.socket", "docker_socket", _path, Path("/var/run/docker.sock")),
    _key("docker.gpu_mode", "docker_gpu_mode", _choice(DOCKER_GPU_MODES), "device-requests"),
    _key("docker.ulimits", "docker_ulimits", _ulimits, ()),
    _key("nats.url", "nats_url", _nats_url, "nats://127.0.0.1:4222", env="NODUS_NATS_URL"),
    _key("nats.nkey_seed", "nats_nkey_seed", _file, None, "agent-<node>.nk", env="NODUS_NATS_NKEY_SEED"),
    _key("s3.endpoint", "s3_endpoint", _endpoint, None, "unset: AWS"),
    _key("s3.region", "s3_region", _text, "us-east-1"),
    _key("s3.bucket", "s3_bucket", _text, None, "checkpoints and outputs"),
    _key("s3.credentials_file", "s3_credentials_file", _file, None, "AWS shared-credentials format"),
    _key("input.max_bytes", "max_input_bytes", _byte_count, DEFAULT_MAX_INPUT_BYTES, "cap on one input"),
    _key("input.parallel", "input_parallel", _positive_int, 4, "inputs fetched at once"),
    _key("input.ca_bundle", "ca_bundle", _file, None, "PEM, for https inputs", env="NODUS_AGENT_CA_BUNDLE"),
    _key("git.host", "git_host", _git_host, DEFAULT_GIT_HOST, "owner/name repos", env="NODUS_GIT_HOST"),
    _key("git.timeout_s", "git_timeout_s", _seconds(0.0, True), 600.0, "one checkout of spec.source"),
    _key("cache.bytes", "cache_bytes", _byte_count, DEFAULT_CACHE_BYTES, "Volume revisions kept"),
    _key("gpu_health.enabled", "gpu_health", _bool, True),
    _key("gpu_health.on_fault", "gpu_fault_action", _choice(GPU_FAULT_ACTIONS), "stop", "running work"),
    _key("gpu_health.ignore_xids", "gpu_ignore_xids", _xids, APPLICATION_XIDS, "never drain"),
    _key("gpu_health.poll_s", "gpu_poll_s", _seconds(0.0, True), 5.0),
    _key("health.host", None, _text, "127.0.0.1", env="NODUS_HEALTH_HOST"),
    _key("health.port", None, _port, 0, "0: any free port", env="NODUS_HEALTH_PORT"),
    _key("log.level", None, _choice(("DEBUG", "INFO", "WARNING", "ERROR")), "INFO", env="NODUS_LOG_LEVEL"),
    _key("log.format", None, _choice(("json", "text")), "json", env="NODUS_LOG_FORMAT"),
)
BY_NAME: Final = {k.name: k for k in KEYS}
KNOWN_ENV: Final = frozenset(k.env for k in KEYS) | {CONFIG_ENV}
SECTIONS: Final = frozenset(k.name.split(".")[0] for k in KEYS if "." in k.name)


# -- reading -----------------------------------------------------------------------------------------
def load_file(path: Path) -> dict[str, Any]:
    """The file's settings by key name (``docker.socket``); ConfigError for a missing or malformed file
    and for any key the agent does not know (naming the key and the valid ones)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such file; create it from deploy/agent/agent.toml.example, or drop --config "
            f"({CONFIG_ENV}) to run on the environment alone"
        ) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror}); check its owner and mode") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    flat: dict[str, Any] = {}
    for name, value in data.items():
        if name in SECTIONS and isinstance(value, dict):
            for sub, subvalue in value.items():
                flat[f"{name}.{sub}"] = subvalue
        else:
            flat[name] = value
    unknown = [name for name in flat if name not in BY_NAME]
    if unknown:
        raise ConfigError(f"{path}: {_unknown(unknown[0])}")
    return flat


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name, list(BY_NAME), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {name!r}{hint}; valid keys: {', '.join(BY_NAME)}"


def resolve(
    env: Mapping[str, str], data: Mapping[str, Any], source: str = "the config file"
) -> dict[str, Any]:
    """Every AgentSettings field: the variable if set (and not empty), else the file, else the default;
    plus ``configured`` (the key names set by either). ``node``, ``offering``, ``workdir`` and ``cwd``
    are derived here when unset, as the agent always derived them."""
    values: dict[str, Any] = {}
    configured: set[str] = set()
    for key in KEYS:
        if key.field is None:
            _value(key, env, data, source)  # validated here, exported by prepare()
            continue
        value = _value(key, env, data, source)
        if value is not None:
            configured.add(key.name)
        values[key.field] = key.default if value is None else value
    _warn_unknown_env(env)
    values["node"] = values["node"] or default_node_name()
    values["offering"] = values["offering"] or default_offering(
        values["variant"], values["gpus"], values["region_class"]
    )
    values["workdir"] = values["workdir"] or (Path(".nodus") / "agent" / values["node"]).absolute()
    values["cwd"] = values["cwd"] or Path(os.getcwd()).absolute()
    values["configured"] = frozenset(configured)
    return values


def _value(key: Key, env: Mapping[str, str], data: Mapping[str, Any], source: str) -> Any:
    raw_env = env.get(key.env, "")
    if raw_env.strip():
        try:
            return key.parse(raw_env)
        except ValueError as e:
            raise ConfigError(f"{key.env}={raw_env!r}: expected {e}") from None
    if key.name in data:
        raw = data[key.name]
        try:
            return key.parse(raw)
        except ValueError as e:
            raise ConfigError(f"{source}: {key.name} = {raw!r}: expected {e} (or set {key.env})") from None
    return None


def _warn_unknown_env(env: Mapping[str, str]) -> None:
    # A warning, not an error: other parts of the agent may read variables of their own.
    for name in env:
        if name.startswith("NODUS_AGENT_") and name not in KNOWN_ENV:
            close = difflib.get_close_matches(name, sorted(KNOWN_ENV), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            log.warning("%s is not an agent setting%s", name, hint)


def default_node_name() -> str:
    """The short host name, lowercased, with anything a node name cannot hold turned into '-'."""
    short = socket.gethostname().split(".")[0].lower()
    name = re.sub(r"[^a-z0-9-]+", "-", short).strip("-")[:63].strip("-")
    return name or "node"


def default_offering(variant: str, gpus: int, region: str) -> str:
    """The price book's naming rule (``h100-sxm-80g-x1-us``): a default agent matches a default offering."""
    return f"{variant.lower()}-x{gpus}-{region}"


def config_path(env: Mapping[str, str], file: Path | str | None) -> Path | None:
    """The file to read: the one given, else ``NODUS_AGENT_CONFIG``, else none."""
    chosen = file or env.get(CONFIG_ENV, "").strip()
    return Path(chosen) if chosen else None


def read(env: Mapping[str, str], file: Path | str | None = None) -> dict[str, Any]:
    """:func:`resolve` over the file :func:`config_path` picks (blocking: a small file, read once)."""
    path = config_path(env, file)
    data = load_file(path) if path is not None else {}
    values = resolve(env, data, str(path) if path is not None else "the config file")
    values["config_file"] = path
    return values


# -- the command line -----------------------------------------------------------------------------------
def prepare(argv: Sequence[str], environ: MutableMapping[str, str]) -> None:
    """``nodus-agent [--config PATH] [--check]``, before the service starts: point ``NODUS_AGENT_CONFIG``
    at the file, export each setting of the file to its variable (where unset: the kit reads the bus,
    health and log settings from the environment only), and validate everything, so a bad setting stops
    the agent with its name before it connects.
    ``--check`` prints the settings the agent would run with, and where each came from, then exits."""
    parser = argparse.ArgumentParser(prog="nodus-agent", description="The Nodus node agent.")
    parser.add_argument("--config", metavar="PATH", help=f"a TOML file of settings ({CONFIG_ENV})")
    parser.add_argument("--check", action="store_true", help="print the effective settings and exit")
    args = parser.parse_args(list(argv))
    if args.config:
        environ[CONFIG_ENV] = str(Path(args.config).absolute())
    path = config_path(environ, None)
    try:
        data = load_file(path) if path is not None else {}
        values = resolve(environ, data, str(path))
    except ConfigError as e:
        sys.exit(f"nodus-agent: {e}")
    values["config_file"] = path
    given = dict(environ)
    # The file becomes the variables it stands for (where unset): the kit reads the bus, health and log
    # settings from the environment only, and so may any part of the agent that reads its own variable.
    for key in KEYS:
        if key.name in data and not environ.get(key.env, "").strip():
            environ[key.env] = env_text(data[key.name])
    if args.check:
        print(describe(values, given, data))
        sys.exit(0)


def env_text(raw: Any) -> str:
    """A file value as its variable would say it (each parser reads both forms)."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, list):
        return ",".join(str(v) for v in raw)
    if isinstance(raw, dict):
        return ",".join(f"{k}={v}" for k, v in raw.items())
    return str(raw)


def describe(values: Mapping[str, Any], env: Mapping[str, str], data: Mapping[str, Any]) -> str:
    """One line per key: its effective value and whether the environment, the file or a default set it."""
    lines = []
    for key in KEYS:
        if key.field is not None:
            value = values[key.field]
        else:
            raw = env[key.env] if env.get(key.env, "").strip() else data.get(key.name)
            value = key.default if raw is None else key.parse(raw)
        origin = (
            "env " + key.env if env.get(key.env, "").strip() else "file" if key.name in data else "default"
        )
        shown = "(unset)" if value is None else json.dumps(_plain(value))
        lines.append(f"{key.name} = {shown}  # {origin}" + (f" ({key.help})" if key.help else ""))
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, tuple):
        return [f"{u.name}={u.soft}:{u.hard}" if isinstance(u, Ulimit) else u for u in value]
    return value


def main() -> None:
    """``python -m nodus_agent.configuring --config PATH``: the same as ``nodus-agent --check``."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    prepare([*sys.argv[1:], "--check"], dict(os.environ))


if __name__ == "__main__":
    main()
