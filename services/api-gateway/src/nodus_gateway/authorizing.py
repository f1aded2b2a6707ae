"""Authorization: may this principal do this verb on this resource in this project?

The hook every route calls after authentication (as Kubernetes' authorizer runs after authn). For now
there is one principal, the admin, allowed everything; per-project roles (viewer, editor, admin) replace
the body of :func:`authorize` and :func:`visible_namespaces` without changing their callers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from starlette.requests import Request

VERBS: Final = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    admin: bool = False
    roles: dict[str, str] = field(default_factory=dict)
    """project -> role (viewer, editor, admin)."""


ADMIN: Final = Principal(name="admin", admin=True)


def principal_of(request: Request) -> Principal:
    """Who is asking: set by the authentication middleware."""
    p = request.scope.get("state", {}).get("principal")
    return p if isinstance(p, Principal) else ADMIN


async def authorize(request: Request, verb: str, plural: str, namespace: str | None) -> Principal:
    """Return the principal if it may ``verb`` ``plural`` in ``namespace`` (None: cluster-scoped or all
    namespaces); else raise an ApiError (403 Forbidden, or 404 where the project must stay hidden)."""
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}")
    return principal_of(request)


def visible_namespaces(principal: Principal) -> frozenset[str] | None:
    """The projects a principal may list and watch across namespaces; None means all of them."""
    return None if principal.admin else frozenset(principal.roles)
