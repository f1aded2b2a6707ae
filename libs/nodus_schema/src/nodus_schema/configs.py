"""Secrets and Connections: the configuration objects a Job refers to by name, with their rules.

A **Secret** is Kubernetes' (``type``, base64 ``data``, plain ``stringData``) with one difference: its
values are write-only. The API accepts them and never returns them: :func:`redact_secret` replaces each
value by ``""`` (the keys stay visible, so ``kubectl describe`` and Job authors can see what a Secret
holds) and marks the object with the :data:`REDACTED_ANNOTATION`. ``metadata.generation`` counts the
versions of the values (1 at create, +1 for every update that changes them), which is what
``SecretMount.version`` pins.

A **Connection** is an endpoint outside Nodus that Jobs read from or write to: an S3 bucket or a
PostgreSQL database (plain, Neon or Supabase). Credentials are never inline: they are references to keys of
Secrets in the same project, so a Connection can be read, listed and logged freely.

Names of both are DNS-1123 labels (not subdomains, as Kubernetes allows for Secrets): a name becomes a
NATS subject token in the object store, where "." separates tokens.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from typing import Final
from urllib.parse import urlsplit

import msgspec

from nodus_schema.fielding import CauseType, ErrorList, FieldError, Path
from nodus_schema.jobs import SecretKeySelector
from nodus_schema.meta import Condition, ListMeta, ObjectMeta
from nodus_schema.validating import validate_object_meta
from nodus_schema.wire import API_VERSION, Wire

__all__ = [
    "CONNECTION_TYPES",
    "LOOPBACK_HOSTS",
    "MAX_SECRET_BYTES",
    "POSTGRES_PROVIDERS",
    "REDACTED_ANNOTATION",
    "SECRET_TYPES",
    "SSL_MODES",
    "Connection",
    "ConnectionList",
    "ConnectionSpec",
    "ConnectionStatus",
    "GitConnection",
    "PostgresConnection",
    "S3Connection",
    "Secret",
    "SecretList",
    "default_connection",
    "default_secret",
    "is_loopback",
    "redact_secret",
    "secret_values_equal",
    "validate_connection",
    "validate_secret",
]

MAX_NAME: Final = 63
SECRET_TYPES: Final = ("Opaque",)
MAX_SECRET_BYTES: Final = 1 << 20
"""1 MiB of decoded values, Kubernetes' limit: a Secret is configuration, not a data store."""
REDACTED_ANNOTATION: Final = "nodus.dev/redacted"
"""Set on every Secret the API returns: its ``data`` values were replaced by "" (value: ``data``)."""

CONNECTION_TYPES: Final = ("S3", "Postgres", "Git")
POSTGRES_PROVIDERS: Final = ("Postgres", "Neon", "Supabase")
SSL_MODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# The modes that may talk plaintext ("prefer" silently falls back to it): loopback hosts only.
_PLAINTEXT_SSL_MODES: Final = ("disable", "allow", "prefer")
LOOPBACK_HOSTS: Final = ("localhost", "127.0.0.1", "::1")
"""Hosts reached without TLS is acceptable: local stacks (SeaweedFS, a dev Postgres) on the same machine,
where credentials never cross a network that someone else could listen on."""

_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_S3_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_HOST_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# PostgreSQL truncates identifiers at NAMEDATALEN - 1 = 63 bytes; longer names would silently differ.
_PG_IDENTIFIER_MAX = 63


# ---------------------------------------------------------------------------------------------------------
# Secret
# ---------------------------------------------------------------------------------------------------------


class Secret(Wire):
    """Secret holds values (passwords, tokens, keys) that Jobs and Connections refer to by name and key."""

    # default_factory (not default) keeps apiVersion and kind on the wire despite omit_defaults.
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Secret")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    type: str = msgspec.field(default_factory=lambda: "Opaque")
    data: dict[str, str] = msgspec.field(default_factory=dict)
    """Key to base64 value (standard alphabet, padded). Write-only: returned with every value "" ."""
    string_data: dict[str, str] = msgspec.field(default_factory=dict)
    """Key to plain value, merged into ``data`` on write (it wins over ``data``); never stored or returned."""


class SecretList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Secrets, values redacted."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "SecretList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Secret] = msgspec.field(default_factory=list)


def default_secret(secret: Secret) -> Secret:
    """``stringData`` folded into ``data`` (base64 of its UTF-8), as Kubernetes does on write."""
    if not secret.string_data:
        return secret
    data = dict(secret.data)
    for key, value in secret.string_data.items():
        data[key] = base64.b64encode(value.encode()).decode()
    return msgspec.structs.replace(secret, data=data, string_data={})


def redact_secret(secret: Secret) -> Secret:
    """The Secret as the API returns it: keys kept, every value "", the redaction annotation set."""
    annotations = {**secret.metadata.annotations, REDACTED_ANNOTATION: "data"}
    meta = msgspec.structs.replace(secret.metadata, annotations=annotations)
    return msgspec.structs.replace(secret, metadata=meta, data=dict.fromkeys(secret.data, ""), string_data={})


def secret_values_equal(a: Secret, b: Secret) -> bool:
    """Whether two Secrets hold the same values: the test for a new version (``metadata.generation``)."""
    return a.type == b.type and a.data == b.data


def validate_secret(secret: Secret) -> list[FieldError]:
    """Every rule of a Secret. Messages never contain a value: they end up in responses and logs."""
    errs = ErrorList()
    _type_meta(errs, secret.api_version, secret.kind, "Secret")
    errs.extend(validate_object_meta(secret.metadata, max_name=MAX_NAME))
    if secret.type not in SECRET_TYPES:
        errs.not_supported("type", secret.type, SECRET_TYPES)
    size = 0
    for field, values in (("data", secret.data), ("stringData", secret.string_data)):
        for key, value in values.items():
            path = Path(field).key(key)
            if _SECRET_KEY.fullmatch(key) is None:
                errs.invalid(path, key, "a key must be letters, digits, '-', '_' or '.' (at most 253)")
            size += _value_size(errs, path, value, encoded=field == "data")
    if size > MAX_SECRET_BYTES:
        errs.add("data", CauseType.TOO_LONG, f"Too long: {size} bytes of values; at most {MAX_SECRET_BYTES}")
    return errs.as_list()


def _value_size(errs: ErrorList, path: Path, value: str, *, encoded: bool) -> int:
    """The decoded size of one value; a bad base64 value is reported without echoing it."""
    if not encoded:
        return len(value.encode())
    try:
        return len(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError):
        errs.add(path, CauseType.INVALID, "Invalid value: (not shown): must be base64 (standard, padded)")
        return 0


# ---------------------------------------------------------------------------------------------------------
# Connection
# ---------------------------------------------------------------------------------------------------------


class S3Connection(Wire):
    """An S3 bucket (AWS, or any S3-compatible store: R2, MinIO, SeaweedFS)."""

    endpoint: str | None = None
    """``https://s3.us-east-1.amazonaws.com``; plain http only to localhost / 127.0.0.1."""
    bucket: str | None = None
    region: str | None = None
    access_key_id_ref: SecretKeySelector | None = None
    secret_access_key_ref: SecretKeySelector | None = None
    """With ``accessKeyIdRef``, or neither (a public bucket)."""


class GitConnection(Wire):
    """A git host that serves private repositories over https (ADR-0036): ``spec.source.git`` of a Job that
    lists this Connection in ``spec.connections`` is fetched with its token when the repository's URL
    starts with ``url``."""

    url: str | None = None
    """``https://github.com`` or ``https://git.example.com/team``: the repositories it applies to."""
    username: str | None = None
    """Sent with the token as HTTP basic auth; default ``x-access-token`` (GitHub, Gitea, GitLab)."""
    token_ref: SecretKeySelector | None = None
    """The Secret key holding the token (never in a log, a status or the Job)."""


class PostgresConnection(Wire):
    """A PostgreSQL database; ``provider`` names a hosted flavour (Neon, Supabase), which needs TLS."""

    provider: str | None = None
    """Postgres (default), Neon or Supabase."""
    host: str | None = None
    port: int | None = None
    """1 to 65535; default 5432."""
    database: str | None = None
    user: str | None = None
    password_ref: SecretKeySelector | None = None
    ssl_mode: str | None = None
    """libpq's sslmode; default require. Modes that allow plaintext only for localhost / 127.0.0.1."""


class ConnectionSpec(Wire):
    type: str | None = None
    """S3, Postgres or Git; the block of that name holds the endpoint."""
    s3: S3Connection | None = msgspec.field(default=None, name="s3")
    postgres: PostgresConnection | None = None
    git: GitConnection | None = None


class ConnectionStatus(Wire):
    conditions: list[Condition] = msgspec.field(default_factory=list)
    """Reserved for a reachability check (condition Reachable); nothing sets it yet."""


class Connection(Wire):
    """Connection is an endpoint outside Nodus that Jobs use: an S3 bucket or a PostgreSQL database."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Connection")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ConnectionSpec = msgspec.field(default_factory=ConnectionSpec)
    status: ConnectionStatus = msgspec.field(default_factory=ConnectionStatus)


class ConnectionList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Connections."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "ConnectionList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Connection] = msgspec.field(default_factory=list)


def default_connection(conn: Connection) -> Connection:
    """Postgres defaults: provider Postgres, port 5432, sslMode require (libpq's own default, "prefer",
    falls back to plaintext without a word, which a password must never do)."""
    pg = conn.spec.postgres
    if pg is None:
        return conn
    pg = msgspec.structs.replace(
        pg,
        provider=pg.provider or "Postgres",
        port=5432 if pg.port is None else pg.port,
        ssl_mode=pg.ssl_mode or "require",
    )
    return msgspec.structs.replace(conn, spec=msgspec.structs.replace(conn.spec, postgres=pg))


def validate_connection(conn: Connection) -> list[FieldError]:
    """Every rule of a Connection: type, metadata, and the block its ``spec.type`` names."""
    errs = ErrorList()
    _type_meta(errs, conn.api_version, conn.kind, "Connection")
    errs.extend(validate_object_meta(conn.metadata, max_name=MAX_NAME))
    spec, path = conn.spec, Path("spec")
    if spec.type is None:
        errs.required(path.child("type"), "Required value: S3, Postgres or Git")
    elif spec.type not in CONNECTION_TYPES:
        errs.not_supported(path.child("type"), spec.type, CONNECTION_TYPES)
    blocks = {"S3": ("s3", spec.s3), "Postgres": ("postgres", spec.postgres), "Git": ("git", spec.git)}
    for type_, (field, block) in blocks.items():
        if block is not None and spec.type != type_:
            errs.forbidden(path.child(field), f"only for type {type_}; this Connection is {spec.type}")
        elif block is None and spec.type == type_:
            errs.required(path.child(field), f"Required value: the {type_} endpoint")
    if spec.type == "S3" and spec.s3 is not None:
        _s3(errs, path.child("s3"), spec.s3)
    if spec.type == "Postgres" and spec.postgres is not None:
        _postgres(errs, path.child("postgres"), spec.postgres)
    if spec.type == "Git" and spec.git is not None:
        _git(errs, path.child("git"), spec.git)
    return errs.as_list()


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is this machine (localhost or a loopback address)."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _s3(errs: ErrorList, path: Path, s3: S3Connection) -> None:
    endpoint = _present(errs, path.child("endpoint"), s3.endpoint, "an https:// URL")
    if endpoint is not None:
        _endpoint(errs, path.child("endpoint"), endpoint)
    _matching(
        errs,
        path.child("bucket"),
        s3.bucket,
        "the bucket's name",
        _S3_BUCKET,
        "must be 3-63 lower case letters, digits, '.' and '-'",
    )
    if s3.region is not None and _S3_REGION.fullmatch(s3.region) is None:
        errs.invalid(path.child("region"), s3.region, "must be a region name such as 'us-east-1' or 'auto'")
    refs = (("accessKeyIdRef", s3.access_key_id_ref), ("secretAccessKeyRef", s3.secret_access_key_ref))
    given = [name for name, ref in refs if ref is not None]
    if len(given) == 1:
        missing = "secretAccessKeyRef" if given[0] == "accessKeyIdRef" else "accessKeyIdRef"
        errs.required(path.child(missing), f"Required value: set with {given[0]} (or neither, for public)")
    for name, ref in refs:
        if ref is not None:
            _secret_ref(errs, path.child(name), ref)


def _endpoint(errs: ErrorList, path: Path, endpoint: str) -> None:
    """https, or http to a loopback host: S3 credentials sign every request, and plain http would show the
    request (and the data) to anyone on the way; a local stack's store never leaves the machine."""
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as e:
        errs.invalid(path, endpoint, f"is not a URL: {e}")
        return
    if parts.scheme not in ("https", "http") or not parts.hostname:
        errs.invalid(path, endpoint, "must be an https:// URL with a host")
    elif parts.scheme == "http" and not is_loopback(parts.hostname):
        errs.invalid(path, endpoint, "must be https:// (plain http only to localhost or 127.0.0.1)")
    elif parts.username is not None or parts.password is not None:
        errs.forbidden(path, "credentials in a URL end up in logs; use accessKeyIdRef and secretAccessKeyRef")
    elif parts.query or parts.fragment:
        errs.invalid(path, endpoint, "must not have a query or fragment")


def _git(errs: ErrorList, path: Path, git: GitConnection) -> None:
    url = _present(errs, path.child("url"), git.url, "the https:// URL of the git host")
    if url is not None:
        _endpoint(errs, path.child("url"), url)
    if git.username is not None and (not git.username or any(c in git.username for c in ":@/ \n")):
        errs.invalid(path.child("username"), git.username, "a user name without ':', '@', '/' or spaces")
    if git.token_ref is None:
        errs.required(path.child("tokenRef"), "Required value: the Secret key holding the token")
    else:
        _secret_ref(errs, path.child("tokenRef"), git.token_ref)


def _postgres(errs: ErrorList, path: Path, pg: PostgresConnection) -> None:
    if pg.provider is not None and pg.provider not in POSTGRES_PROVIDERS:
        errs.not_supported(path.child("provider"), pg.provider, POSTGRES_PROVIDERS)
    host = _present(errs, path.child("host"), pg.host, "a host name or IP address")
    if host is not None:
        _pg_host(errs, path.child("host"), host)
    if pg.port is not None and not 1 <= pg.port <= 65535:
        errs.invalid(path.child("port"), pg.port, "must be between 1 and 65535")
    for field, value in (("database", pg.database), ("user", pg.user)):
        name = _present(errs, path.child(field), value, f"the {field} name")
        if name is not None and (len(name.encode()) > _PG_IDENTIFIER_MAX or "\x00" in name):
            errs.invalid(path.child(field), name, f"must be at most {_PG_IDENTIFIER_MAX} bytes, no NUL")
    if pg.password_ref is not None:
        _secret_ref(errs, path.child("passwordRef"), pg.password_ref)
    _ssl_mode(errs, path.child("sslMode"), pg)


def _pg_host(errs: ErrorList, path: Path, host: str) -> None:
    if "://" in host or "/" in host:
        errs.invalid(
            path, host, "must be a host name or IP address, not a URL (port and database are fields)"
        )
        return
    try:
        ipaddress.ip_address(host.strip("[]"))
        return
    except ValueError:
        pass
    if len(host) > 253 or _HOST_NAME.fullmatch(host) is None:
        errs.invalid(path, host, "must be a host name (letters, digits, '-' and '.') or an IP address")


def _ssl_mode(errs: ErrorList, path: Path, pg: PostgresConnection) -> None:
    if pg.ssl_mode is None:
        return
    if pg.ssl_mode not in SSL_MODES:
        errs.not_supported(path, pg.ssl_mode, SSL_MODES)
    elif pg.ssl_mode in _PLAINTEXT_SSL_MODES and not is_loopback(pg.host):
        # The password would cross the network in the clear (or may, for allow and prefer).
        errs.invalid(
            path,
            pg.ssl_mode,
            "may allow plaintext; use require, verify-ca or verify-full (plaintext "
            "is only for localhost or 127.0.0.1)",
        )


def _secret_ref(errs: ErrorList, path: Path, ref: SecretKeySelector) -> None:
    _matching(
        errs,
        path.child("name"),
        ref.name,
        "the Secret's name",
        _DNS_LABEL,
        "must be a Secret's name (a DNS-1123 label)",
    )
    _matching(
        errs,
        path.child("key"),
        ref.key,
        "the key within the Secret",
        _SECRET_KEY,
        "must be letters, digits, '-', '_' or '.'",
    )


# ---------------------------------------------------------------------------------------------------------
# Shared
# ---------------------------------------------------------------------------------------------------------


def _present(errs: ErrorList, path: Path, value: str | None, what: str) -> str | None:
    """``value`` when given, else None with a Required error."""
    if not value:
        errs.required(path, f"Required value: {what}")
        return None
    return value


def _matching(
    errs: ErrorList, path: Path, value: str | None, what: str, pattern: re.Pattern[str], hint: str
) -> None:
    """A required string that must match ``pattern``."""
    present = _present(errs, path, value, what)
    if present is not None and pattern.fullmatch(present) is None:
        errs.invalid(path, present, hint)


def _type_meta(errs: ErrorList, api_version: str, kind: str, want_kind: str) -> None:
    if api_version != API_VERSION:
        errs.not_supported("apiVersion", api_version, (API_VERSION,))
    if kind != want_kind:
        errs.not_supported("kind", kind, (want_kind,))
