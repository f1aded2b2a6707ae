"""Token and project stores: who a bearer token speaks for, and which projects exist.

A token is ``nds_`` + 32 random bytes (url-safe base64). Only its digest is stored: HMAC-SHA256 keyed
with a server-side pepper, so a copy of the bucket (a backup, a NATS snapshot) neither holds usable
tokens nor lets anyone test guesses offline without the pepper too. The token's id, and its key in the
``tokens`` bucket, is the start of that digest: a lookup is one direct get, and the full digest is then
compared in constant time.

Lookups are cached for a few seconds (NODUS_TOKEN_CACHE_TTL_S, default 5) so a request does not wait on
the bus. Revoking a token drops it from this gateway's cache at once; another gateway replica may accept
it until its cached entry expires, so a revocation takes effect everywhere within the TTL.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec
from nats.aio.client import Client as NATS

from nodus_gateway.authorizing import Principal
from nodus_gateway.config import ConfigError
from nodus_kit import errors as kit
from nodus_kit.storing import ObjectStore, Page
from nodus_schema import ObjectMeta
from nodus_schema.access import Project, Token, TokenSpec
from nodus_schema.wire import Wire

TOKEN_PREFIX: Final = "nds_"
ID_LENGTH: Final = 24
"""Hex digits of the digest that make a token's id: 96 bits, so ids of random tokens never collide."""
TOKEN_ID: Final = re.compile(rf"[0-9a-f]{{{ID_LENGTH}}}")
DEFAULT_CACHE_TTL_S: Final = 5.0
CACHE_MAX: Final = 10_000
TOKENS_BUCKET: Final = "tokens"
PROJECTS_BUCKET: Final = "projects"


class TokenRecord(Wire):
    """What the ``tokens`` bucket holds for one token: never the secret, only its digest."""

    metadata: ObjectMeta
    spec: TokenSpec
    digest: str
    """Hex HMAC-SHA256 of the secret under the pepper."""

    def public(self) -> Token:
        """The Token as the API shows it: without digest or secret."""
        return Token(metadata=self.metadata, spec=self.spec)


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
    ) -> None:
        if not pepper:
            raise ValueError("Principals needs a non-empty pepper")
        self.pepper = pepper
        self.tokens: ObjectStore[TokenRecord] = ObjectStore(nc, TOKENS_BUCKET, TokenRecord)
        self.projects: ObjectStore[Project] = ObjectStore(nc, PROJECTS_BUCKET, Project)
        self.cache = TokenCache(cache_ttl_s, clock=clock)

    @classmethod
    def from_env(cls, nc: NATS, env: Mapping[str, str], admin_token: str) -> Principals:
        """NODUS_TOKEN_PEPPER (default: the admin token) and NODUS_TOKEN_CACHE_TTL_S (default 5)."""
        return cls(nc, pepper=pepper_of(env, admin_token), cache_ttl_s=cache_ttl_of(env))

    # -- tokens ---------------------------------------------------------------------------------------
    def digest(self, secret: str) -> str:
        return hmac.new(self.pepper, secret.encode(), hashlib.sha256).hexdigest()

    async def authenticate(self, secret: str) -> Principal | None:
        """The principal a minted token speaks for, or None if it is unknown or revoked."""
        if not secret.startswith(TOKEN_PREFIX):
            return None  # not one of ours: no bus trip, and nothing to cache
        digest = self.digest(secret)
        cached = self.cache.get(digest)
        if cached is not None:
            return cached.principal
        principal = await self._lookup(digest)
        self.cache.put(digest, principal)
        return principal

    async def _lookup(self, digest: str) -> Principal | None:
        try:
            record = await self.tokens.get(None, digest[:ID_LENGTH])
        except kit.NotFound:
            return None
        # The id is only a prefix: the whole digest must match, compared in constant time.
        if not hmac.compare_digest(record.digest, digest):
            return None
        return Principal(name=record.spec.principal, roles=dict(record.spec.roles))

    async def mint(self, spec: TokenSpec) -> Token:
        """A new token for ``spec``: the returned Token carries the secret, which is not kept anywhere."""
        secret = new_secret()
        digest = self.digest(secret)
        record = TokenRecord(metadata=ObjectMeta(name=digest[:ID_LENGTH]), spec=spec, digest=digest)
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
