"""Authentication: one admin bearer token for now, checked before routing, as Kubernetes' authn filter is.

Checking before routing means a caller without the token learns nothing about which paths exist (every
path is 401, not 404). The health and version endpoints stay open, as Kubernetes' system:public-info-viewer
leaves them. Per-user tokens and RBAC (authorization after authentication) come with the full API.
"""

from __future__ import annotations

import hmac
from typing import Final

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from nodus_gateway.responding import ApiError, status_response

PUBLIC_PATHS: Final = frozenset({"/healthz", "/livez", "/readyz", "/version"})

TOKEN_FIX: Final = (
    "Send `Authorization: Bearer <token>`. The local stack's token is NODUS_TOKEN in .nodus/local.env "
    "(written by `make up`; the nodus CLI reads it from there); the gateway compares it with its "
    "NODUS_ADMIN_TOKEN."
)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme is case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_matches(given: str, expected: str) -> bool:
    # compare_digest takes as long whatever prefix matches, so the token cannot be guessed byte by byte.
    return hmac.compare_digest(given.encode(), expected.encode())


class BearerAuth:
    """ASGI middleware: 401 Unauthorized (a Status) unless the request carries the admin token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        if not token:
            raise ValueError("BearerAuth needs a non-empty token")
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        given = bearer_token(Headers(scope=scope).get("authorization"))
        if given is not None and token_matches(given, self.token):
            await self.app(scope, receive, send)
            return
        message = (
            "no bearer token was sent" if given is None else "the bearer token is not valid for this gateway"
        )
        err = ApiError.of("Unauthorized", f"Unauthorized: {message}", fix=TOKEN_FIX)
        response = status_response(err.status, headers={"WWW-Authenticate": 'Bearer realm="nodus"'})
        await response(scope, receive, send)
