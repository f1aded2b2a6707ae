"""Access: projects (the namespaces objects live in) and bearer tokens bound to a role per project.

Both are cluster-scoped objects of nodus.dev/v1, served by the gateway's admin endpoints:

* a Project is a namespace, as Kubernetes' Namespace is (``metadata.name`` is the project);
* a Token binds a principal to a role per project (``{"team-a": "editor"}``). The gateway stores only a
  hash of the secret; ``secret`` is set in the create response alone, the one time it can be read. A token
  expires (``status.expirationTimestamp``): its create asks for a lifetime (``spec.expirationSeconds``, as
  Kubernetes' TokenRequest does) or an end (``spec.expirationTimestamp``), else it gets the default one
  (docs/tokens.md).
"""

from __future__ import annotations

from typing import Final

import msgspec

from nodus_schema.meta import ListMeta, ObjectMeta
from nodus_schema.wire import API_VERSION, Wire

__all__ = [
    "DEFAULT_TOKEN_EXPIRATION_S",
    "MAX_TOKEN_EXPIRATION_S",
    "MIN_TOKEN_EXPIRATION_S",
    "PROJECT_PHASES",
    "ROLES",
    "Project",
    "ProjectList",
    "ProjectSpec",
    "ProjectStatus",
    "Token",
    "TokenList",
    "TokenSpec",
    "TokenStatus",
]

ROLES: Final = ("viewer", "editor", "admin")
"""A role in one project, weakest first: each one may do what the one before it may, and more."""

PROJECT_PHASES: Final = ("Active", "Terminating")

MIN_TOKEN_EXPIRATION_S: Final = 600
"""10 minutes: the shortest lifetime a token may ask for, Kubernetes' TokenRequest minimum."""
MAX_TOKEN_EXPIRATION_S: Final = 365 * 24 * 3600
"""One year: the longest lifetime a token may ask for (GitHub's fine-grained tokens stop at a year too)."""
DEFAULT_TOKEN_EXPIRATION_S: Final = 30 * 24 * 3600
"""30 days: the lifetime of a token whose create asks for none (GitHub's default for personal tokens).
These tokens are minted by an admin and pasted into ``nodus login`` or a kubeconfig, with no refresh
flow, so a day would mean a new token every morning; a month bounds a forgotten or leaked one."""


class ProjectSpec(Wire):
    """What an admin says about a project; nothing is required."""

    description: str | None = None


class ProjectStatus(Wire):
    # default_factory (not default) keeps the phase on the wire despite omit_defaults.
    phase: str = msgspec.field(default_factory=lambda: "Active")
    """Phase is Active (Terminating is reserved for a cascading delete, which Nodus does not do yet)."""


class Project(Wire):
    """A project: the namespace its objects live in, and the unit roles are granted on."""

    # default_factory (not default) keeps apiVersion and kind on the wire despite omit_defaults.
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Project")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ProjectSpec = msgspec.field(default_factory=ProjectSpec)
    status: ProjectStatus = msgspec.field(default_factory=ProjectStatus)


class ProjectList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Projects, as GET /apis/nodus.dev/v1/projects returns."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "ProjectList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Project] = msgspec.field(default_factory=list)


class TokenSpec(Wire):
    """Who a token speaks for, and the role it holds in each project."""

    principal: str = ""
    """The name the gateway knows the caller by (in Forbidden messages and logs), e.g. ``alice``.
    Required: an empty one is refused when the token is created."""
    roles: dict[str, str] = msgspec.field(default_factory=dict)
    """Project -> role (viewer, editor or admin)."""
    expiration_seconds: int | None = None
    """The lifetime asked for at create, in seconds (``MIN_TOKEN_EXPIRATION_S`` to
    ``MAX_TOKEN_EXPIRATION_S``), as Kubernetes' TokenRequest ``spec.expirationSeconds``. Not defaulted here:
    a create that asks for neither this nor ``expiration_timestamp`` gets ``DEFAULT_TOKEN_EXPIRATION_S``,
    shown in ``status.expirationTimestamp``."""
    expiration_timestamp: str | None = None
    """Or the end asked for (RFC 3339), within the same bounds from now; at most one of the two."""


class TokenStatus(Wire):
    expiration_timestamp: str | None = None
    """When the token stops authenticating (RFC 3339, UTC, whole seconds), set by the gateway at create.
    A token minted before tokens expired has none stored; the gateway shows (and enforces) its creation
    time plus ``MAX_TOKEN_EXPIRATION_S`` for it (docs/tokens.md)."""
    last_used: str | None = None
    """Reserved: the gateway does not record use yet (it would mean a write per request)."""


class Token(Wire):
    """A bearer token; ``metadata.name`` is its id (derived from the hash of the secret, never the secret)."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Token")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: TokenSpec = msgspec.field(default_factory=TokenSpec)
    status: TokenStatus = msgspec.field(default_factory=TokenStatus)
    secret: str | None = None
    """The bearer token itself: only in the response to the create, never stored and never read back."""


class TokenList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Tokens (without secrets), as GET /apis/nodus.dev/v1/tokens returns."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "TokenList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Token] = msgspec.field(default_factory=list)
