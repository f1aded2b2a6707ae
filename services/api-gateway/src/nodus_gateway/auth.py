"""Authentication, then authorization from the path, before routing, as Kubernetes' filters do.

Checking before routing means a caller without a valid token learns nothing about which paths exist
(every path is 401, not 404). The health and version endpoints stay open, as Kubernetes'
system:public-info-viewer leaves them.

Two kinds of bearer token are accepted: the bootstrap NODUS_ADMIN_TOKEN (the cluster admin), and tokens
minted through ``POST /apis/nodus.dev/v1/tokens`` (looked up by digest in :mod:`nodus_gateway.principals`).
The principal goes into ``scope["state"]["principal"]`` for :func:`nodus_gateway.authorizing.principal_of`.
A token is never logged: neither this module nor the access log writes the Authorization header.

Then the request's verb, resource and project are read from its path and method (Kubernetes' RequestInfo)
and checked with :func:`nodus_gateway.authorizing.decide`, so a route that forgets its own check is still
covered. Paths outside ``/apis/nodus.dev/v1/<resource>`` (discovery, OpenAPI) are open to every
authenticated principal, as Kubernetes' system:discovery role leaves them.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs

import nats.errors
from starlette.types import ASGIApp, Receive, Scope, Send

from nodus_gateway.authorizing import ADMIN, Principal, decide
from nodus_gateway.principals import Principals
from nodus_gateway.responding import ApiError, bus_unavailable, status_response
from nodus_schema import API_VERSION

PUBLIC_PATHS: Final = frozenset({"/healthz", "/livez", "/readyz", "/version"})
API_PREFIX: Final = f"/apis/{API_VERSION}/"

TOKEN_FIX: Final = (
    "Send `Authorization: Bearer <token>`. The local stack's admin token is NODUS_TOKEN in "
    ".nodus/local.env (written by `make up`; the nodus CLI reads it from there); an admin mints other "
    "tokens with `POST /apis/nodus.dev/v1/tokens`. A revoked token stops working within seconds."
)

# Method -> verb, for a path that names one object and for one that names a collection.
_OBJECT_VERBS: Final = {"GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_COLLECTION_VERBS: Final = {"GET": "list", "HEAD": "list", "POST": "create", "DELETE": "deletecollection"}


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme is case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _authorization(scope: Scope) -> str | None:
    """The first Authorization header, as Starlette's ``Headers(scope=scope).get`` reads it (the server
    hands header names in lower case), without building a Headers object per request."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return str(value.decode("latin-1"))
    return None


def token_matches(given: str, expected: str) -> bool:
    # compare_digest takes as long whatever prefix matches, so the token cannot be guessed byte by byte.
    return hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What a resource request asks for, read from its path and method alone."""

    verb: str
    plural: str
    namespace: str | None
    name: str | None


def request_info(method: str, path: str, query: bytes = b"") -> RequestInfo | None:
    """``GET /apis/nodus.dev/v1/namespaces/a/sweeps/x`` → get sweeps in a named x; None for paths that
    are not resources (discovery) and for methods no resource route serves (those answer 405 anyway)."""
    if not path.startswith(API_PREFIX):
        return None
    parts = [p for p in path[len(API_PREFIX) :].split("/") if p]
    watch = bool(parts) and parts[0] == "watch"  # the old /watch/ paths Kubernetes still serves
    if watch:
        parts = parts[1:]
    namespace: str | None = None
    if len(parts) >= 3 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    if not parts:
        return None
    plural, name = parts[0], (parts[1] if len(parts) > 1 else None)
    verb = (_OBJECT_VERBS if name else _COLLECTION_VERBS).get(method.upper())
    if verb is None:
        return None
    if verb in ("get", "list") and (watch or _truthy(parse_qs(query.decode("latin-1")).get("watch"))):
        verb = "watch"
    return RequestInfo(verb, plural, namespace, name)


def _truthy(values: list[str] | None) -> bool:
    return values is not None and values[-1].lower() not in ("", "0", "false")


class BearerAuth:
    """ASGI middleware: 401 Unauthorized (a Status) unless the request carries a valid token; then 403 or
    404 unless its principal may do what the path asks."""

    def __init__(self, app: ASGIApp, token: str, principals: Principals | None = None) -> None:
        if not token:
            raise ValueError("BearerAuth needs a non-empty token")
        self.app = app
        self.token = token
        self._token_bytes = token.encode()
        self.principals = principals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        given = bearer_token(_authorization(scope))
        if given is not None and hmac.compare_digest(given.encode(), self._token_bytes):
            # The admin token, the bootstrap credential: no store lookup, and the admin may do anything
            # (decide allows every verb for it), so the path need not be read either.
            scope.setdefault("state", {})["principal"] = ADMIN
            await self.app(scope, receive, send)
            return
        try:
            principal = await self.principal(given) if given is not None else None
        except nats.errors.Error as e:
            # The token store is on the bus: the caller should retry, as for any other store read.
            status = bus_unavailable(e).status
            await status_response(status, headers={"Retry-After": "1"})(scope, receive, send)
            return
        if principal is None:
            await self.unauthorized(given, scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        info = request_info(scope["method"], scope["path"], scope.get("query_string", b""))
        error = decide(principal, info.verb, info.plural, info.namespace, info.name) if info else None
        if error is not None:
            await status_response(error.status)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def principal(self, given: str) -> Principal | None:
        if token_matches(given, self.token):
            return ADMIN
        if self.principals is None:
            return None
        return await self.principals.authenticate(given)

    async def unauthorized(self, given: str | None, scope: Scope, receive: Receive, send: Send) -> None:
        message = (
            "no bearer token was sent" if given is None else "the bearer token is not valid for this gateway"
        )
        err = ApiError.of("Unauthorized", f"Unauthorized: {message}", fix=TOKEN_FIX)
        response = status_response(err.status, headers={"WWW-Authenticate": 'Bearer realm="nodus"'})
        await response(scope, receive, send)
