"""What a materialisation of a Job's inputs (:mod:`nodus_agent.inputs`) runs with and hands back: the agent's
limits on inputs, S3 Connections resolved with their Secrets, the context of one Job's inputs, the record
of each input materialised, and the error that names the input to fix."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from nodus_agent.s3 import S3Settings
from nodus_agent.settings import AgentSettings
from nodus_schema.configs import Connection, Secret
from nodus_schema.jobs import SecretKeySelector

__all__ = [
    "CONTAINER_INPUTS",
    "InputContext",
    "InputError",
    "InputRecord",
    "InputSettings",
    "S3Credentials",
    "container_path",
    "secret_value",
]

GiB: Final = 1 << 30
CONTAINER_INPUTS: Final = "/nodus/inputs"


class InputError(Exception):
    """One input could not be materialised; the message says what to change.

    ``retryable`` is True when the same input may well work on a second try (a network error, a 5xx),
    False when only a change to the Job, its Connection or the data can help (a bad digest, a 404).
    """

    def __init__(self, name: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(f"input {name!r}: {message}")
        self.input, self.retryable = name, retryable


@dataclass(frozen=True)
class InputSettings:
    """The agent's limits on inputs (``NODUS_AGENT_INPUT_*``)."""

    max_bytes: int = 50 * GiB
    """Per input: a file's size, a prefix's total, an archive's extracted total. Exceeding it aborts."""
    ca_bundle: Path | None = None
    """Extra CA certificates (PEM) trusted for url inputs, besides the system's (a private mirror, tests)."""
    connect_timeout_s: float = 30.0
    read_timeout_s: float = 300.0
    """The longest a download may stall between two reads; a slow but moving download is never cut."""
    parallel: int = 4
    """Inputs fetched at once."""

    @classmethod
    def of(cls, agent: AgentSettings) -> InputSettings:
        return cls(max_bytes=agent.max_input_bytes, ca_bundle=agent.ca_bundle, parallel=agent.input_parallel)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> InputSettings:
        """``NODUS_AGENT_INPUT_MAX_BYTES`` (a quantity: ``50Gi``), ``NODUS_AGENT_CA_BUNDLE`` (a PEM file),
        ``NODUS_AGENT_INPUT_PARALLEL``, read as the agent reads all its settings (one parser each, in
        :mod:`nodus_agent.configuring`); raises ConfigError (a ValueError) naming the variable to fix."""
        return cls.of(AgentSettings.from_env(env))


@dataclass(frozen=True)
class S3Credentials:
    """An S3 Connection resolved for use: its endpoint, its bucket and the keys from its Secret."""

    bucket: str
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)  # never in a repr, so never in a log line

    def settings(self) -> S3Settings:
        return S3Settings(
            bucket=self.bucket,
            endpoint=self.endpoint,
            region=self.region,
            access_key=self.access_key,
            secret_key=self.secret_key,
        )

    @classmethod
    def from_connection(cls, conn: Connection, secrets: Mapping[str, Secret]) -> S3Credentials:
        """Resolve an S3 Connection with the Secrets it names (``secrets`` by name, values not redacted).

        Raises ValueError saying which Connection field or Secret key to fix."""
        spec = conn.spec.s3
        name = conn.metadata.name
        if conn.spec.type != "S3" or spec is None or not spec.bucket:
            raise ValueError(f"Connection {name!r} is not an S3 Connection with a bucket")
        access = secret_key = None
        if spec.access_key_id_ref is not None and spec.secret_access_key_ref is not None:
            access = secret_value(secrets, spec.access_key_id_ref, f"Connection {name!r} accessKeyIdRef")
            secret_key = secret_value(
                secrets, spec.secret_access_key_ref, f"Connection {name!r} secretAccessKeyRef"
            )
        return cls(
            bucket=spec.bucket,
            endpoint=spec.endpoint,
            region=spec.region or "us-east-1",
            access_key=access,
            secret_key=secret_key,
        )


def secret_value(secrets: Mapping[str, Secret], ref: SecretKeySelector, what: str) -> str:
    """The plain value of one Secret key (``data`` is base64, as stored). The error never shows a value."""
    secret = secrets.get(ref.name or "")
    if secret is None:
        raise ValueError(f"{what}: Secret {ref.name!r} is not there; create it in the Job's project")
    if ref.key in secret.string_data:  # not folded yet (the API folds it on write)
        return secret.string_data[ref.key or ""]
    encoded = secret.data.get(ref.key or "")
    if encoded is None:
        raise ValueError(f"{what}: Secret {ref.name!r} has no key {ref.key!r}; add it or fix the reference")
    try:
        return base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, ValueError):
        raise ValueError(f"{what}: Secret {ref.name!r} key {ref.key!r} is not base64 UTF-8 text") from None


@dataclass(frozen=True)
class InputContext:
    """What a materialisation needs beyond the inputs themselves."""

    namespace: str
    """The Job's project: where ``output`` inputs are looked up."""
    connections: Mapping[str, S3Credentials] = field(default_factory=dict)
    """The Job's S3 Connections by name, already resolved (only those bucket inputs name are needed)."""
    outputs: S3Settings | None = None
    """The store committed outputs live in (``<root><namespace>/<job>/<index>/outputs/<name>``)."""
    outputs_root: str = ""
    """The key prefix of that store (empty, or ending in '/')."""
    settings: InputSettings = field(default_factory=InputSettings)


class InputRecord(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """What one input became: for the attempt's report and for the idempotency marker."""

    name: str
    kind: str
    """url, bucket or output; fromWorkspace for a Workspace's snapshot (:mod:`nodus_agent.mounting`)."""
    source: str
    """Where it came from: the URL without its query (signed URLs carry keys there), or an s3:// URI."""
    path: str
    """Where the program sees it: /nodus/inputs/<name>."""
    directory: bool = False
    bytes: int = 0
    files: int = 1
    sha256: str | None = None
    """The digest of the file (not set for a directory)."""
    fetched: bool = True
    """False when an earlier materialisation had already put it in place."""


def container_path(name: str) -> str:
    """Where the program sees input ``name``."""
    return f"{CONTAINER_INPUTS}/{name}"
