"""Authentication, then authorization from the path, before routing, as Kubernetes' filters do.

Checking before routing means a caller without a valid token learns nothing about which paths exist
(every path is 401, not 404). The health and version endpoints stay open, as Kubernetes'
system:public-info-viewer leaves them.

Three kinds of bearer token are accepted: the bootstrap NODUS_ADMIN_TOKEN (the cluster admin), tokens
minted through ``POST /apis/nodus.dev/v1/tokens`` (looked up by digest in :mod:`nodus_gateway.principals`),
and the tokens of runs that call the API as their Job's ServiceAccount (:mod:`nodus_gateway.minting`).
The principal goes into ``scope["state"]["principal"]`` for :func:`nodus_gateway.authorizing.principal_of`.
A token is never logged: neither this module nor the access log writes the Authorization header.

A minted token that has expired answers 401 saying only that it expired. Rejected credentials are counted
per client (:mod:`nodus_gateway.authlimits`); once a client is limited, a minted token from it is still
checked and works if valid (guessing one of 256 random bits gains nothing, and a shared NAT or proxy
address, or a CI job looping on an expired token, must not lock out everyone behind it), while any other
credential, the admin token included, answers 429 without being compared: that is the one an operator
chose, so the one worth guessing. A request without a token is not a failure (nothing was guessed).

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
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nodus_gateway.authlimits import AuthFailureLimiter
from nodus_gateway.authorizing import ADMIN, Principal, decide
from nodus_gateway.minting import is_run_token
from nodus_gateway.principals import TOKEN_PREFIX, Expired, Principals
from nodus_gateway.responding import ApiError, bus_unavailable, status_response
from nodus_schema import API_VERSION

PUBLIC_PATHS: Final = frozenset({"/healthz", "/livez", "/readyz", "/version"})
API_PREFIX: Final = f"/apis/{API_VERSION}/"

TOKEN_FIX: Final = (
    "Send `Authorization: Bearer <token>`. The local stack's admin token is NODUS_TOKEN in "
    ".nodus/local.env (written by `make up`; the nodus CLI reads it from there); an admin mints other "
    "tokens with `POST /apis/nodus.dev/v1/tokens`. A revoked token stops working within seconds."
)
EXPIRED_FIX: Final = (
    "Tokens expire (30 days after they are minted unless asked otherwise). Ask an admin of your project, or "
    "the cluster admin, for a new one (`POST /apis/nodus.dev/v1/tokens`), then use it: "
    "`nodus login --server URL --token NEW_TOKEN`, NODUS_TOKEN, or the token in your kubeconfig."
)
LIMITED_FIX: Final = (
    "Too many requests from your address were refused for their credentials. Wait Retry-After seconds, "
    "then retry with a valid token (`nodus config view` shows the context the CLI uses); a token that "
    "expired or was revoked needs a new one from an admin of your project."
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

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        principals: Principals | None = None,
        limiter: AuthFailureLimiter | None = None,
    ) -> None:
        """``limiter``: shared by every BearerAuth of one app (the app's two lanes count the same
        failures); None: failures are not limited."""
        if not token:
            raise ValueError("BearerAuth needs a non-empty token")
        self.app = app
        self.token = token
        self._token_bytes = token.encode()
        self.principals = principals
        self.limiter = limiter if limiter is not None else AuthFailureLimiter(failures=0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        given = bearer_token(_authorization(scope))
        if given is None:
            await self.unauthorized("no bearer token was sent", TOKEN_FIX, scope, receive, send)
            return
        # O(1), and nothing at all while no client has failed lately.
        retry_after = self.limiter.retry_after(scope)
        if retry_after is None and hmac.compare_digest(given.encode(), self._token_bytes):
            # The admin token, the bootstrap credential: no store lookup, and the admin may do anything
            # (decide allows every verb for it), so the path need not be read either. compare_digest
            # takes as long whatever prefix matches, so the token cannot be guessed byte by byte.
            scope.setdefault("state", {})["principal"] = ADMIN
            await self.app(scope, receive, send)
            return
        unguessable = given.startswith(TOKEN_PREFIX) or is_run_token(given)  # 256 random or MAC bits
        if retry_after is not None and (self.principals is None or not unguessable):
            # Limited: not compared at all, so a right guess of the admin token looks like a wrong one.
            self.limiter.failed(scope)
            await self.too_many(retry_after, scope, receive, send)
            return
        try:
            principal = await self.principals.authenticate(given) if self.principals is not None else None
        except nats.errors.Error as e:
            # The token store is on the bus: the caller should retry, as for any other store read.
            status = bus_unavailable(e).status
            await status_response(status, headers={"Retry-After": "1"})(scope, receive, send)
            return
        if not isinstance(principal, Principal):
            self.limiter.failed(scope)
            if retry_after is not None:
                await self.too_many(retry_after, scope, receive, send)
            elif isinstance(principal, Expired):
                # Only that it expired: not whose it was, its roles or when, as for a token never minted.
                await self.unauthorized("the bearer token has expired", EXPIRED_FIX, scope, receive, send)
            else:
                message = "the bearer token is not valid for this gateway"
                await self.unauthorized(message, TOKEN_FIX, scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        if principal.warning is not None:
            send = _with_warning(send, principal.warning)
        info = request_info(scope["method"], scope["path"], scope.get("query_string", b""))
        error = decide(principal, info.verb, info.plural, info.namespace, info.name) if info else None
        if error is not None:
            await status_response(error.status)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def unauthorized(self, message: str, fix: str, scope: Scope, receive: Receive, send: Send) -> None:
        err = ApiError.of("Unauthorized", f"Unauthorized: {message}", fix=fix)
        response = status_response(err.status, headers={"WWW-Authenticate": 'Bearer realm="nodus"'})
        await response(scope, receive, send)

    async def too_many(self, retry_after: int, scope: Scope, receive: Receive, send: Send) -> None:
        err = ApiError.of(
            "TooManyRequests",
            f"Too many failed authentications from this client: try again in {retry_after} seconds",
            fix=LIMITED_FIX,
            retry_after=retry_after,
        )
        await status_response(err.status, headers={"Retry-After": str(retry_after)})(scope, receive, send)


def _with_warning(send: Send, text: str) -> Send:
    """``send`` with a ``Warning: 299`` header added to the response's start (Kubernetes' form; ``text``
    is the gateway's own, printable ASCII without quotes)."""
    header = (b"warning", f'299 - "{text}"'.encode("latin-1"))

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), header]}
        await send(message)

    return sending
