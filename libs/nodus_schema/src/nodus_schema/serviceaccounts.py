"""ServiceAccounts: an identity a project's Jobs run as when they call the Nodus API (ADR-0037).

A **ServiceAccount** names a role in its own project, ``viewer`` or ``editor`` (never ``admin``: a run may
not mint tokens or manage other people's access). A Job or a Sweep's template that sets
``spec.serviceAccountName`` gets, for each of its runs, a token that speaks for
``system:serviceaccount:<project>:<name>`` with that role in that project and nowhere else, valid only while
that run (its Attempt) has not finished and the ServiceAccount still exists.

The object holds no secret and no status: the tokens are derived by the gateway when a node agent asks for
a run's grant (nothing is stored), and ``metadata.creationTimestamp`` is all there is to say about it.

Pure: types, rules and the token's outer form (its MAC is the gateway's, nodus_gateway.minting).
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from nodus_schema.fielding import CauseType, ErrorList, FieldError, Path
from nodus_schema.meta import ListMeta, ObjectMeta
from nodus_schema.validating import validate_object_meta
from nodus_schema.wire import API_VERSION, Wire

__all__ = [
    "MAX_SERVICE_ACCOUNT_NAME",
    "SERVICE_ACCOUNT_PRINCIPAL",
    "SERVICE_ACCOUNT_ROLES",
    "SERVICE_ACCOUNT_TOKEN_PREFIX",
    "ServiceAccount",
    "ServiceAccountList",
    "ServiceAccountSpec",
    "TokenParts",
    "principal_name",
    "token_parts",
    "validate_service_account",
]

MAX_SERVICE_ACCOUNT_NAME: Final = 63
SERVICE_ACCOUNT_ROLES: Final = ("viewer", "editor")
"""The roles a ServiceAccount may hold in its project, weakest first (a run never administers a project)."""
SERVICE_ACCOUNT_PRINCIPAL: Final = "system:serviceaccount"
"""``system:serviceaccount:<project>:<name>``: who a run's token speaks for, in Kubernetes' form."""
SERVICE_ACCOUNT_TOKEN_PREFIX: Final = "nodus-sa."
"""A run's token is ``nodus-sa.<project>.<attempt>.<mac>``: the prefix tells it from a minted ``nds_`` one."""

# A project and an Attempt name: DNS labels (an Attempt's may run past 63), never a "." in them.
_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,251}[a-z0-9])?")
# The MAC: HMAC-SHA256 in unpadded url-safe base64, 43 characters.
_MAC: Final = re.compile(r"[A-Za-z0-9_-]{43}")


class ServiceAccountSpec(Wire):
    role: str | None = None
    """``viewer`` or ``editor``: what a run with this account may do in the project (required)."""


class ServiceAccount(Wire):
    """ServiceAccount is an identity the project's Jobs run as when they call the Nodus API."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "ServiceAccount")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ServiceAccountSpec = msgspec.field(default_factory=ServiceAccountSpec)


class ServiceAccountList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of ServiceAccounts."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "ServiceAccountList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[ServiceAccount] = msgspec.field(default_factory=list)


def validate_service_account(account: ServiceAccount) -> list[FieldError]:
    """Every rule of a ServiceAccount: type, metadata (its name is a DNS label), and a role it may hold."""
    errs = ErrorList()
    if account.api_version != API_VERSION:
        errs.not_supported("apiVersion", account.api_version, (API_VERSION,))
    if account.kind != "ServiceAccount":
        errs.not_supported("kind", account.kind, ("ServiceAccount",))
    errs.extend(validate_object_meta(account.metadata, max_name=MAX_SERVICE_ACCOUNT_NAME))
    role, path = account.spec.role, Path("spec").child("role")
    if role is None:
        errs.required(path, "Required value: viewer or editor (what the project's runs may do with it)")
    elif role == "admin":
        # Said apart: a project admin mints tokens and manages access, which no run should ever do.
        errs.add(
            path,
            CauseType.NOT_SUPPORTED,
            'Unsupported value: "admin": supported values: "viewer", "editor" (a run never administers '
            "its project: it may not mint tokens)",
        )
    elif role not in SERVICE_ACCOUNT_ROLES:
        errs.not_supported(path, role, SERVICE_ACCOUNT_ROLES)
    return errs.as_list()


def principal_name(namespace: str, name: str) -> str:
    """``system:serviceaccount:<namespace>:<name>``."""
    return f"{SERVICE_ACCOUNT_PRINCIPAL}:{namespace}:{name}"


class TokenParts(msgspec.Struct, frozen=True):
    """What a run's token says of itself: its project and Attempt, and the MAC that proves the rest."""

    namespace: str
    attempt: str
    mac: str


def token_parts(token: str) -> TokenParts | None:
    """The parts of ``nodus-sa.<namespace>.<attempt>.<mac>``; None for anything else (no store is read for
    a token that cannot be one)."""
    if not token.startswith(SERVICE_ACCOUNT_TOKEN_PREFIX):
        return None
    parts = token[len(SERVICE_ACCOUNT_TOKEN_PREFIX) :].split(".")
    if len(parts) != 3:
        return None
    namespace, attempt, mac = parts
    if len(namespace) > 63 or not _NAME.fullmatch(namespace) or not _NAME.fullmatch(attempt):
        return None
    if not _MAC.fullmatch(mac):
        return None
    return TokenParts(namespace, attempt, mac)
