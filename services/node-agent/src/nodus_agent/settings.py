"""The node agent's own settings: an optional TOML file under the ``NODUS_AGENT_*`` variables of the kit's
``Settings.env`` (see :mod:`nodus_agent.configuring` for every key, its variable and what it expects).

Every field has a default that works on one machine (a fake one-GPU H100 node in region class ``local``),
so ``make run`` can start several agents by setting only ``NODUS_AGENT_NODE``.
"""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nodus_agent import configuring
from nodus_agent.configuring import (
    APPLICATION_XIDS,
    DEFAULT_CACHE_BYTES,
    DEFAULT_GIT_HOST,
    DEFAULT_MAX_INPUT_BYTES,
    ConfigError,
    Ulimit,
    default_node_name,
)

if TYPE_CHECKING:
    from nodus_agent.s3 import S3Settings

__all__ = ["AgentSettings", "ConfigError", "Ulimit", "default_node_name", "read_credentials"]


@dataclass(frozen=True)
class AgentSettings:
    node: str
    offering: str
    region_class: str
    variant: str
    gpu_memory: str
    gpus: int
    workdir: Path
    cwd: Path
    heartbeat_s: float
    pool: str | None
    record_s: float = 60.0
    """How often the Node record is written while nothing changes (its ``lastHeartbeatTime``); the beats
    in between are core NATS messages that nothing stores (ADR-0042)."""
    stop_grace_s: float = 10.0
    fake_gpus: bool = False
    """Skip NVML: simulated nodes on a GPU host, and tests that must see the same on every machine."""
    interruptible: bool = False
    """The host is interruptible capacity (its provider may reclaim it): NODUS_AGENT_INTERRUPTIBLE."""
    force_variant: bool = False
    """Keep ``variant`` where NVML discovers another one (by default the discovered variant wins)."""
    runtime: str = "process"
    """How attempts run: ``process`` (local processes), ``docker`` (Docker Engine API) or ``simulate``."""
    docker_socket: Path = Path("/var/run/docker.sock")
    docker_gpu_mode: str = "device-requests"
    """``device-requests`` (HostConfig.DeviceRequests, Docker 19.03+), ``nvidia-runtime``
    (HostConfig.Runtime "nvidia" with NVIDIA_VISIBLE_DEVICES) or ``none`` (no GPUs: fake-GPU hosts)."""
    docker_ulimits: tuple[Ulimit, ...] = ()
    """HostConfig.Ulimits of every container; empty on real hosts (sandboxes that cannot raise rlimits
    need explicit, lower ones)."""
    nats_url: str = "nats://127.0.0.1:4222"
    nats_nkey_seed: Path | None = None
    """The node's nkey seed (ADR-0026): the kit connects with it (NODUS_NATS_NKEY_SEED)."""
    s3_endpoint: str | None = None
    """None: AWS's own endpoint for ``s3_region``."""
    s3_region: str = "us-east-1"
    s3_bucket: str | None = None
    """The bucket of checkpoints and outputs; None: the agent keeps them on local disk only."""
    s3_credentials_file: Path | None = None
    """An AWS-style credentials file (``[default]`` with ``aws_access_key_id``/``aws_secret_access_key``)."""
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    """The most one input may take on disk; a larger one fails the attempt before it downloads."""
    input_parallel: int = 4
    ca_bundle: Path | None = None
    """A PEM bundle trusted for https inputs and git fetches (a private CA), beside the system's."""
    git_host: str = DEFAULT_GIT_HOST
    """The git host ``owner/name`` repositories resolve against (NODUS_GIT_HOST, shared with the gateway)."""
    git_timeout_s: float = 600.0
    """The longest one checkout of spec.source.git may take, every git command together."""
    cache_bytes: int = DEFAULT_CACHE_BYTES
    """The disk budget of the node's cache of Volume revisions (``<workdir>/cache``)."""
    gpu_health: bool = True
    """Watch NVML for GPU faults and drain the node on one (no effect on a fake inventory)."""
    gpu_fault_action: str = "stop"
    """What a GPU fault does to running work: ``stop`` (reported Lost, resumed elsewhere) or ``finish``."""
    gpu_ignore_xids: frozenset[int] = APPLICATION_XIDS
    gpu_poll_s: float = 5.0
    configured: frozenset[str] = frozenset()
    """The keys the operator set (file or environment): discovery overrides only what was left default."""
    config_file: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], file: Path | str | None = None) -> AgentSettings:
        """Build from ``NODUS_*`` variables over the TOML ``file`` (default: ``NODUS_AGENT_CONFIG``, if
        set); raises ConfigError (a ValueError) naming the key or variable to fix."""
        return cls(**configuring.read(env, file))

    def s3_settings(self) -> S3Settings | None:
        """Where checkpoints and outputs go, or None without ``s3.bucket``. Reads the credentials file
        (blocking, once at start); ConfigError says what is wrong with it."""
        if self.s3_bucket is None:
            return None
        # Imported here: aiobotocore takes a while to import, and the simulated fleet never needs it.
        from nodus_agent.s3 import S3Settings

        access_key, secret_key = (
            read_credentials(self.s3_credentials_file) if self.s3_credentials_file else (None, None)
        )
        return S3Settings(
            bucket=self.s3_bucket,
            endpoint=self.s3_endpoint,
            region=self.s3_region,
            access_key=access_key,
            secret_key=secret_key,
        )


def read_credentials(path: Path, profile: str = "default") -> tuple[str, str]:
    """(access key, secret key) from an AWS shared-credentials file."""
    parser = configparser.ConfigParser()
    try:
        with path.open() as f:
            parser.read_file(f)
    except OSError as e:
        raise ConfigError(f"s3.credentials_file {path}: cannot read it ({e.strerror})") from None
    except configparser.Error as e:
        raise ConfigError(f"s3.credentials_file {path}: not an AWS credentials file ({e})") from None
    if not parser.has_section(profile):
        raise ConfigError(
            f"s3.credentials_file {path}: no [{profile}] section; write [{profile}] with "
            "aws_access_key_id and aws_secret_access_key"
        )
    section = parser[profile]
    access_key = section.get("aws_access_key_id", "").strip()
    secret_key = section.get("aws_secret_access_key", "").strip()
    if not access_key or not secret_key:
        raise ConfigError(
            f"s3.credentials_file {path}: [{profile}] needs both aws_access_key_id and aws_secret_access_key"
        )
    return access_key, secret_key
