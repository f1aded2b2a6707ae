"""Token and project stores: who a bearer token speaks for, and which projects exist.

A token is ``nds_`` + 32 random bytes (url-safe base64). Only its digest is stored: HMAC-SHA256 keyed
with a server-side pepper, so a copy of the bucket (a backup, a NATS snapshot) neither holds usable
tokens nor lets anyone test guesses offline without the pepper too. The token's id, and its key in the
``tokens`` bucket, is the start of that digest: a lookup is one direct get, and the full digest is then
compared in constant time.

Tokens of runs that call the API as their Job's ServiceAccount (``nodus-sa.``..., ADR-0037) are checked by
:mod:`nodus_gateway.minting` against the run's Attempt and account, and cached for at most a second.

Lookups are cached for a few seconds (NODUS_TOKEN_CACHE_TTL_S, default 5) so a request does not wait on
the bus. Revoking a token drops it from this gateway's cache at once; another gateway replica may accept
it until its cached entry expires, so a revocation takes effect everywhere within the TTL.

A token expires at ``status.expirationTimestamp``, fixed when it is minted (:func:`expiration_of`), and is
compared with the gateway's clock (``now``, injectable) on every request, cached or not: an expired token
stops at once on every replica. A record minted before tokens expired has no expiration stored; it
expires a year (``LEGACY_EXPIRATION_S``) after its creationTimestamp, as if it had been minted with the
longest lifetime a token may have now, and every response to it carries a Warning saying so.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import msgspec
from nats.aio.client import Client as NATS

from nodus_gateway.authorizing import Principal
from nodus_gateway.config import ConfigError
from nodus_gateway.minting import LIVENESS_TTL_S, ServiceAccountTokens, is_run_token, token_key
from nodus_kit import errors as kit
from nodus_kit.keying import Page
from nodus_kit.storing import ObjectStore
from nodus_schema import ObjectMeta
from nodus_schema.access import (
    DEFAULT_TOKEN_EXPIRATION_S,
    MAX_TOKEN_EXPIRATION_S,
    Project,
    Token,
    TokenSpec,
    TokenStatus,
)
from nodus_schema.meta import format_time, parse_time
from nodus_schema.wire import Wire

TOKEN_PREFIX: Final = "nds_"
ID_LENGTH: Final = 24
"""Hex digits of the digest that make a token's id: 96 bits, so ids of random tokens never collide."""
TOKEN_ID: Final = re.compile(rf"[0-9a-f]{{{ID_LENGTH}}}")
DEFAULT_CACHE_TTL_S: Final = 5.0
CACHE_MAX: Final = 10_000
TOKENS_BUCKET: Final = "tokens"
PROJECTS_BUCKET: Final = "projects"
LEGACY_EXPIRATION_S: Final = MAX_TOKEN_EXPIRATION_S
"""How long after its creation a token minted before tokens expired (no expiration stored) still works."""


class TokenRecord(Wire):
    """What the ``tokens`` bucket holds for one token: never the secret, only its digest."""

    metadata: ObjectMeta
    spec: TokenSpec
    digest: str
    """Hex HMAC-SHA256 of the secret under the pepper."""
    status: TokenStatus = msgspec.field(default_factory=TokenStatus)
    """Its expirationTimestamp; empty in a record minted before tokens expired."""

    @property
    def legacy(self) -> bool:
        """Minted before tokens expired: no expiration stored, so it is derived (:func:`expires_at`)."""
        return self.status.expiration_timestamp is None

    def expires_at(self) -> float:
        """When it stops authenticating (Unix seconds). For a legacy record, its creation plus
        LEGACY_EXPIRATION_S; a record with neither time readable has already expired (fail closed)."""
        try:
            if self.status.expiration_timestamp is not None:
                return parse_time(self.status.expiration_timestamp).timestamp()
            created = parse_time(self.metadata.creation_timestamp or "")
        except ValueError:
            return 0.0
        return created.timestamp() + LEGACY_EXPIRATION_S

    def public(self) -> Token:
        """The Token as the API shows it: without digest or secret, with the expiration it is held to."""
        status = self.status
        if self.legacy:
            status = msgspec.structs.replace(status, expiration_timestamp=_stamp(self.expires_at()))
        return Token(metadata=self.metadata, spec=self.spec, status=status)


def _stamp(unix_s: float) -> str:
    return format_time(datetime.fromtimestamp(unix_s, UTC))


def expiration_of(spec: TokenSpec, now: float) -> float:
    """When a token minted at ``now`` for ``spec`` (already validated) expires, in whole Unix seconds: the
    time it asks for, or ``now`` plus the lifetime it asks for, else plus DEFAULT_TOKEN_EXPIRATION_S.
    Rounded down, so a token never lives longer than it asked."""
    if spec.expiration_timestamp is not None:
        return float(math.floor(parse_time(spec.expiration_timestamp).timestamp()))
    return float(math.floor(now) + (spec.expiration_seconds or DEFAULT_TOKEN_EXPIRATION_S))


@dataclass(frozen=True, slots=True)
class Expired:
    """What :meth:`Principals.authenticate` answers for a token that existed and has expired: nothing else
    about it (whose it was, its roles, when it expired), so the 401 tells the caller only that."""


EXPIRED: Final = Expired()


def pepper_of(env: Mapping[str, str], admin_token: str) -> bytes:
    """NODUS_TOKEN_PEPPER if set, else the admin token.

    The admin token is already a secret the gateway must hold, so a stack without a separate pepper still
    keeps digests unusable without it. The cost: rotating NODUS_ADMIN_TOKEN then invalidates every minted
    token, which is why a deployment that rotates it sets NODUS_TOKEN_PEPPER.
    """
    pepper = env.get("NODUS_TOKEN_PEPPER", "").strip() or admin_token
    if not pepper:
        raise ConfigError("a token pepper (NODUS_TOKEN_PEPPER or NODUS_ADMIN_TOKEN) is required")
    return pepper.encode()


def cache_ttl_of(env: Mapping[str, str]) -> float:
    raw = env.get("NODUS_TOKEN_CACHE_TTL_S", "").strip()
    if not raw:
        return DEFAULT_CACHE_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        raise ConfigError(f"NODUS_TOKEN_CACHE_TTL_S={raw!r} is not a number of seconds") from None
    if not 0 <= ttl <= 300:
        # Longer would let a revoked token live on for minutes; 0 turns the cache off.
        raise ConfigError(f"NODUS_TOKEN_CACHE_TTL_S={ttl:g} is not between 0 and 300 seconds")
    return ttl


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class _Cached:
    expires: float
    principal: Principal | None
    """None: a token that was looked up and does not exist (cached too, so bad tokens cost no bus trips)."""


class TokenCache:
    """Digest -> principal for ``ttl`` seconds. Keyed by digest, so no secret is held in memory."""

    def __init__(self, ttl: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._entries: dict[str, _Cached] = {}

    def get(self, digest: str) -> _Cached | None:
        entry = self._entries.get(digest)
        if entry is None or entry.expires <= self.clock():
            self._entries.pop(digest, None)
            return None
        return entry

    def put(self, digest: str, principal: Principal | None) -> None:
        if self.ttl <= 0:
            return
        if len(self._entries) >= CACHE_MAX:
            self._evict()
        self._entries[digest] = _Cached(self.clock() + self.ttl, principal)

    def forget(self, digest: str) -> None:
        self._entries.pop(digest, None)

    def clear(self) -> None:
        self._entries.clear()

    def _evict(self) -> None:
        now = self.clock()
        self._entries = {d: e for d, e in self._entries.items() if e.expires > now}
        while len(self._entries) >= CACHE_MAX:
            # Oldest first: dicts keep insertion order.
            self._entries.pop(next(iter(self._entries)))


class Principals:
    """The token and project stores of one gateway, with the token lookup cache."""

    def __init__(
        self,
        nc: NATS,
        *,
        pepper: bytes,
        cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
    ) -> None:
        """``clock`` times the lookup cache (monotonic); ``now`` is the wall clock tokens expire by (Unix
        seconds): a test passes its own instead of waiting."""
        if not pepper:
            raise ValueError("Principals needs a non-empty pepper")
        self.pepper = pepper
        self.now = now
        self.tokens: ObjectStore[TokenRecord] = ObjectStore(nc, TOKENS_BUCKET, TokenRecord)
        self.projects: ObjectStore[Project] = ObjectStore(nc, PROJECTS_BUCKET, Project)
        self.cache = TokenCache(cache_ttl_s, clock=clock)
        self.service_accounts = ServiceAccountTokens(nc, token_key(pepper))
        # A run's token lives only while its run does: never cached longer than a second.
        self.run_cache = TokenCache(min(cache_ttl_s, LIVENESS_TTL_S), clock=clock)

    @classmethod
    def from_env(cls, nc: NATS, env: Mapping[str, str], admin_token: str) -> Principals:
        """NODUS_TOKEN_PEPPER (default: the admin token) and NODUS_TOKEN_CACHE_TTL_S (default 5)."""
        return cls(nc, pepper=pepper_of(env, admin_token), cache_ttl_s=cache_ttl_of(env))

    # -- tokens ---------------------------------------------------------------------------------------
    def digest(self, secret: str) -> str:
        return hmac.new(self.pepper, secret.encode(), hashlib.sha256).hexdigest()

    async def authenticate(self, secret: str) -> Principal | Expired | None:
        """The principal a minted token speaks for; EXPIRED once it has expired; None if it is unknown or
        revoked. A run's token: its ServiceAccount while the run is live (minting.py), else None."""
        if is_run_token(secret):
            return await self._run_principal(secret)
        if not secret.startswith(TOKEN_PREFIX):
            return None  # not one of ours: no bus trip, and nothing to cache
        digest = self.digest(secret)
        cached = self.cache.get(digest)
        if cached is not None:
            principal = cached.principal
        else:
            principal = await self._lookup(digest)
            self.cache.put(digest, principal)
        # Compared on every request, cached or not: the cache must not stretch a token's life.
        if principal is not None and principal.expires_at is not None and principal.expires_at <= self.now():
            return EXPIRED
        return principal

    async def _run_principal(self, secret: str) -> Principal | None:
        # Keyed by a digest, as minted tokens are: no token is a key of a long-lived dict.
        digest = hashlib.sha256(secret.encode()).hexdigest()
        cached = self.run_cache.get(digest)
        if cached is not None:
            return cached.principal
        principal = await self.service_accounts.authenticate(secret)
        self.run_cache.put(digest, principal)
        return principal

    async def _lookup(self, digest: str) -> Principal | None:
        try:
            record = await self.tokens.get(None, digest[:ID_LENGTH])
        except kit.NotFound:
            return None
        # The id is only a prefix: the whole digest must match, compared in constant time.
        if not hmac.compare_digest(record.digest, digest):
            return None
        expires_at = record.expires_at()
        warning = None
        if record.legacy:
            warning = (
                f"this token was minted before tokens expired and stops working at {_stamp(expires_at)}, "
                "a year after it was minted: ask an admin for a new one (POST /apis/nodus.dev/v1/tokens)"
            )
        return Principal(
            name=record.spec.principal, roles=dict(record.spec.roles), expires_at=expires_at, warning=warning
        )

    async def mint(self, spec: TokenSpec, *, dry_run: bool = False) -> Token:
        """A new token for ``spec`` (validated, admin.py), expiring as :func:`expiration_of` says: the
        returned Token carries the secret, which is not kept anywhere. ``dry_run``: the Token as it would
        be, without a secret, and nothing stored (dryRun=All must never mint a working token)."""
        secret = new_secret()
        digest = self.digest(secret)
        now = self.now()
        record = TokenRecord(
            # creationTimestamp from the same clock as the expiration, so the two always agree.
            metadata=ObjectMeta(name=digest[:ID_LENGTH], creation_timestamp=_stamp(now)),
            spec=spec,
            digest=digest,
            status=TokenStatus(expiration_timestamp=_stamp(expiration_of(spec, now))),
        )
        if dry_run:
            return record.public()
        created = await self.tokens.create(record)
        # No cache entry to drop: an unknown-token entry exists only for a secret someone presented, and
        # this one was generated a moment ago.
        return msgspec.structs.replace(created.public(), secret=secret)

    async def token_records(self) -> Page[TokenRecord]:
        return await self.tokens.list(None)

    async def token_record(self, token_id: str) -> TokenRecord | None:
        if not TOKEN_ID.fullmatch(token_id):
            return None
        try:
            return await self.tokens.get(None, token_id)
        except kit.NotFound:
            return None

    async def revoke(self, record: TokenRecord) -> Token:
        deleted = await self.tokens.delete(None, record.metadata.name or "")
        # This gateway stops accepting it now; other replicas when their cached entry expires.
        self.cache.forget(record.digest)
        return deleted.public()

    async def drop_project_roles(self, project: str) -> None:
        """Remove every token's role in ``project``, as Kubernetes deletes a namespace's RoleBindings with
        it: a project created later under the same name starts with no one in it."""

        def without(record: TokenRecord) -> TokenRecord | None:
            if project not in record.spec.roles:
                return None
            roles = {p: r for p, r in record.spec.roles.items() if p != project}
            return msgspec.structs.replace(record, spec=msgspec.structs.replace(record.spec, roles=roles))

        for record in (await self.token_records()).items:
            if project in record.spec.roles:
                try:
                    await self.tokens.mutate(None, record.metadata.name or "", without)
                except kit.NotFound:
                    continue  # revoked meanwhile
        self.cache.clear()

    # -- projects -------------------------------------------------------------------------------------
    async def project_exists(self, name: str) -> bool:
        try:
            await self.projects.get(None, name)
        except kit.NotFound:
            return False
        return True
