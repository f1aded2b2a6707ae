"""Authorization: may this principal do this verb on this resource in this project?

Runs after authentication, as Kubernetes' authorizer runs after authn, and twice on purpose: the
authentication middleware decides from the request's path and method alone (Kubernetes' RequestInfo), so
a route that forgets to call :func:`authorize` is still covered; each route then calls :func:`authorize`
with what it knows, which gives the same answer.

Roles are per project (namespace): viewer (read), editor (read and write), admin (editor, and the
project's tokens). The cluster admin (the bootstrap NODUS_ADMIN_TOKEN) may do everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from starlette.requests import Request

from nodus_gateway.resources import RESOURCES
from nodus_gateway.responding import ApiError
from nodus_schema import API_GROUP

VERBS: Final = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
READ: Final = frozenset({"get", "list", "watch"})
WRITE: Final = frozenset({"create", "update", "patch", "delete", "deletecollection"})
ROLE_VERBS: Final[dict[str, frozenset[str]]] = {
    "viewer": READ,
    "editor": READ | WRITE,
    # A project admin may also manage the project's tokens; admin.py checks that part itself.
    "admin": READ | WRITE,
}

# Verbs that name one object: without a role in the project they answer 404, as a missing object would.
OBJECT_VERBS: Final = frozenset({"get", "update", "patch", "delete"})
# Cluster-scoped and readable by every authenticated principal: the read-only catalog of the cluster.
CATALOG: Final = frozenset({"nodes", "offerings"})
# Cluster-scoped resources served outside the resource table (admin.py), and the catalog again: a
# RESOURCES row with ``namespaced=False`` is cluster-scoped too. Namespace None on a namespaced resource
# means "all namespaces"; on any of these it means the cluster scope, which needs the cluster admin.
CLUSTER_SCOPED: Final = frozenset({"nodes", "offerings", "projects", "tokens", "namespaces"})
TOKENS: Final = "tokens"


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    admin: bool = False
    roles: dict[str, str] = field(default_factory=dict)
    """project -> role (viewer, editor, admin)."""
    expires_at: float | None = None
    """When the token this principal came with stops authenticating (Unix seconds); None: it has no end
    the gateway knows of (the bootstrap NODUS_ADMIN_TOKEN, which its operator rotates)."""
    warning: str | None = None
    """Sent as a ``Warning: 299`` header with every response to this principal (a token minted before
    tokens expired: when it will expire)."""

    def admin_of(self, project: str) -> bool:
        return self.admin or self.roles.get(project) == "admin"

    @property
    def admin_projects(self) -> frozenset[str]:
        return frozenset(p for p, r in self.roles.items() if r == "admin")


ADMIN: Final = Principal(name="admin", admin=True)
ANONYMOUS: Final = Principal(name="system:anonymous")
"""Who a request is when no authentication middleware said otherwise: allowed nothing (fail closed)."""


def principal_of(request: Request) -> Principal:
    """Who is asking: set by the authentication middleware in ``scope["state"]["principal"]``."""
    p = request.scope.get("state", {}).get("principal")
    return p if isinstance(p, Principal) else ANONYMOUS


def visible_namespaces(principal: Principal) -> frozenset[str] | None:
    """The projects a principal may list and watch across namespaces; None means all of them."""
    return None if principal.admin else frozenset(principal.roles)


def namespaced(plural: str) -> bool:
    if plural in CLUSTER_SCOPED:
        return False
    for res in RESOURCES:
        if res.plural == plural:
            return res.namespaced
    return True


async def authorize(request: Request, verb: str, plural: str, namespace: str | None) -> Principal:
    """Return the principal if it may ``verb`` ``plural`` in ``namespace`` (None: cluster-scoped or all
    namespaces); else raise an ApiError (403 Forbidden, or 404 where the project must stay hidden)."""
    principal = principal_of(request)
    name = request.path_params.get("name")
    error = decide(principal, verb, plural, namespace, name if isinstance(name, str) else None)
    if error is not None:
        raise error
    return principal


def decide(
    principal: Principal, verb: str, plural: str, namespace: str | None, name: str | None = None
) -> ApiError | None:
    """None if allowed, else the error to answer with. Pure, so the middleware and routes share it."""
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}")
    if principal.admin:
        return None
    if namespace is None:
        return _decide_cluster(principal, verb, plural, name)
    role = principal.roles.get(namespace)
    if role is None:
        if verb in OBJECT_VERBS and name:
            # Kubernetes answers 403 here, which tells the caller the project exists. Nodus projects are
            # tenants: a name in another tenant's project must look exactly like one that does not exist.
            return hidden(plural, name, namespace)
        return forbidden(
            principal, verb, plural, namespace, name, fix=_no_role_fix(principal, namespace, verb)
        )
    if verb not in ROLE_VERBS.get(role, frozenset()):
        return forbidden(principal, verb, plural, namespace, name, fix=_weak_role_fix(namespace, role, verb))
    return None


def _decide_cluster(principal: Principal, verb: str, plural: str, name: str | None) -> ApiError | None:
    if plural in CATALOG and verb in READ:
        return None
    if namespaced(plural) and verb in ("list", "watch"):
        # Across all namespaces: allowed, and the route shows only visible_namespaces(principal).
        return None
    if plural == TOKENS and principal.admin_projects and verb in ("get", "list", "create", "delete"):
        # A project admin manages the tokens of its projects; the tokens routes narrow it to those.
        return None
    fix = "Only the cluster admin (the gateway's NODUS_ADMIN_TOKEN) may do this; ask them."
    return forbidden(principal, verb, plural, None, name, fix=fix)


def forbidden(
    principal: Principal, verb: str, plural: str, namespace: str | None, name: str | None, *, fix: str
) -> ApiError:
    """403 worded as Kubernetes' authorizer words it, so the message reads the same to kubectl users."""
    subject = f'{plural}.{API_GROUP} "{name}"' if name else f"{plural}.{API_GROUP}"
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{principal.name}" cannot {verb} resource "{plural}" '
        f'in API group "{API_GROUP}" {scope}'
    )
    return ApiError.of("Forbidden", message, name=name, kind=plural, fix=fix)


def hidden(plural: str, name: str, namespace: str) -> ApiError:
    """The NotFound a missing object gets (as responding.not_found words it), for a hidden project's."""
    return ApiError.of(
        "NotFound",
        f'{plural}.{API_GROUP} "{name}" not found',
        name=name,
        kind=plural,
        fix=f"Check the name and the project: `nodus get {plural} -n {namespace}` lists them.",
    )


def _needed_role(verb: str) -> str:
    return "viewer" if verb in READ else "editor"


def _no_role_fix(principal: Principal, namespace: str, verb: str) -> str:
    yours = ", ".join(sorted(principal.roles)) or "none"
    return (
        f'Your token has no role in project "{namespace}" (your projects: {yours}). Use -n with one of '
        f"yours, or ask an admin of that project for a token with the {_needed_role(verb)} role there."
    )


def _weak_role_fix(namespace: str, role: str, verb: str) -> str:
    return (
        f'Your role in project "{namespace}" is {role}, and {verb} needs {_needed_role(verb)} or more. '
        "Ask an admin of the project for a token with that role."
    )
