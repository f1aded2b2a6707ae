"""Admin endpoints: projects (cluster admin) and tokens (cluster admin, or a project admin for its own).

* ``GET/POST /apis/nodus.dev/v1/projects``, ``GET/DELETE /apis/nodus.dev/v1/projects/{name}``. A project
  is deleted only when it is empty (Kubernetes deletes a namespace's objects with it; Nodus refuses and
  says what is inside, since a Sweep's Jobs may be running and billing); tokens lose their role in it.
* ``POST /apis/nodus.dev/v1/tokens`` → 201 with the secret, the only time it is shown;
  ``GET /apis/nodus.dev/v1/tokens[/{id}]`` without secrets; ``DELETE /apis/nodus.dev/v1/tokens/{id}``
  revokes. A project admin sees and manages only tokens whose roles are all in projects it admins.
  A token expires: ``spec.expirationSeconds`` (600 s to a year) or ``spec.expirationTimestamp`` (as far
  ahead), else 30 days (nodus_schema.access); ``status.expirationTimestamp`` says when.

Creates are admitted as every other kind's (admitting.admit, with the rows :data:`PROJECT_RESOURCE` and
:func:`token_resource` that live here, outside the resource table): ``?fieldValidation=`` Strict
(the default) refuses an unknown field by name, Warn sends a ``Warning: 299`` for each, Ignore drops them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from fastapi import APIRouter, Request
from starlette.responses import Response

from nodus_gateway import bodies
from nodus_gateway.admitting import admit, field_validation
from nodus_gateway.authorizing import Principal, authorize, forbidden
from nodus_gateway.principals import ID_LENGTH, PROJECTS_BUCKET, TOKENS_BUCKET, Principals, TokenRecord
from nodus_gateway.querying import DryRunQ, FieldValidationQ, dry_run_of
from nodus_gateway.resources import Resource, Stores
from nodus_gateway.responding import ApiError, object_response
from nodus_gateway.routing import admitted_response
from nodus_kit import errors as kit
from nodus_schema import API_GROUP, API_VERSION, CauseType, FieldError, ListMeta, ObjectMeta, to_builtins
from nodus_schema.access import (
    MAX_TOKEN_EXPIRATION_S,
    MIN_TOKEN_EXPIRATION_S,
    ROLES,
    Project,
    ProjectList,
    Token,
    TokenList,
    TokenSpec,
)
from nodus_schema.meta import format_time, parse_time

PREFIX: Final = f"/apis/{API_VERSION}"
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Principal names appear in messages and logs: plain user names or e-mail addresses, nothing else.
_PRINCIPAL: Final = re.compile(r"[a-z0-9]([-a-z0-9._@]{0,251}[a-z0-9])?")
RESERVED_PRINCIPALS: Final = frozenset({"admin"})
"""The bootstrap admin's name: a minted token under it would read like the cluster admin in messages."""
_ADMIN_VERBS: Final = ("create", "delete", "get", "list")


def _unchanged(obj: Any) -> Any:
    return obj


def _project_errors(project: Project) -> list[FieldError]:
    name = project.metadata.name or ""
    if _LABEL.fullmatch(name):
        return []
    return [
        FieldError(
            "metadata.name",
            CauseType.INVALID,
            f"Invalid value: {name!r}: a project name must be a DNS-1123 label "
            "(lower case letters, digits and '-', at most 63 characters)",
        )
    ]


PROJECT_RESOURCE: Final = Resource(
    plural="projects",
    singular="project",
    kind="Project",
    bucket=PROJECTS_BUCKET,
    object_type=Project,
    list_type=ProjectList,
    default=_unchanged,
    validate=_project_errors,
    max_name=63,
    namespaced=False,
    verbs=_ADMIN_VERBS,
    served_by="admin",
)
"""What admission needs to know of a Project (the routes below serve it, not the resource table's)."""


def token_resource(now: Callable[[], float]) -> Resource:
    """The Token row for admission; its rules read the clock (an expiration is checked against ``now``)."""
    return Resource(
        plural="tokens",
        singular="token",
        kind="Token",
        bucket=TOKENS_BUCKET,
        object_type=Token,
        list_type=TokenList,
        default=_unchanged,
        validate=lambda token: _token_spec_errors(token.spec, now()),
        max_name=ID_LENGTH,
        namespaced=False,
        verbs=_ADMIN_VERBS,
        served_by="admin",
    )


def admin_router(principals: Principals, stores: Stores, *, max_body_bytes: int) -> APIRouter:
    router = APIRouter(tags=["admin"])
    _project_routes(router, principals, stores, max_body_bytes)
    _token_routes(router, principals, max_body_bytes)
    return router


# ---------------------------------------------------------------------------------------------------------
# Projects
# ---------------------------------------------------------------------------------------------------------


def _project_routes(router: APIRouter, principals: Principals, stores: Stores, max_body_bytes: int) -> None:
    store = principals.projects

    @router.post(f"{PREFIX}/projects", status_code=201, name="create project")
    async def create_project(
        request: Request, field_validation_: FieldValidationQ = None, dry_run: DryRunQ = None
    ) -> Response:
        await authorize(request, "create", "projects", None)
        validation = field_validation(field_validation_)
        dry = dry_run_of(dry_run)
        data = bodies.parse(await bodies.read_body(request, max_body_bytes), bodies.media_type(request))
        admitted = admit(PROJECT_RESOURCE, data, None, validation)
        project = _project_from(admitted.obj)
        try:
            if dry:  # dryRun=All: answered as the create would be, nothing stored
                if await _exists(store, project.metadata.name or ""):
                    raise kit.AlreadyExists(project.metadata.name or "")
                return admitted_response(PROJECT_RESOURCE, project, admitted.warnings, 201)
            created = await store.create(project)
        except kit.AlreadyExists:
            raise ApiError.of(
                "AlreadyExists",
                f'projects.{API_GROUP} "{project.metadata.name}" already exists',
                name=project.metadata.name,
                kind="projects",
                fix="Pick another name; `nodus get projects` lists the existing ones.",
            ) from None
        return admitted_response(PROJECT_RESOURCE, created, admitted.warnings, 201)

    @router.get(f"{PREFIX}/projects", name="list projects")
    async def list_projects(request: Request) -> Response:
        await authorize(request, "list", "projects", None)
        page = await store.list(None)
        meta = ListMeta(resource_version=str(page.resource_version))
        return object_response(_with_items(ProjectList(metadata=meta, items=page.items)))

    @router.get(f"{PREFIX}/projects/{{name}}", name="get project")
    async def get_project(name: str, request: Request) -> Response:
        await authorize(request, "get", "projects", None)
        return object_response(await _project(store, name))

    @router.delete(f"{PREFIX}/projects/{{name}}", name="delete project")
    async def delete_project(name: str, request: Request) -> Response:
        await authorize(request, "delete", "projects", None)
        await _project(store, name)
        inside = await _contents(stores, name)
        if inside:
            raise ApiError.of(
                "Conflict",
                f'projects.{API_GROUP} "{name}" is not empty: it holds {", ".join(inside)}',
                name=name,
                kind="projects",
                fix=(
                    f"Delete what is inside first (`nodus get sweeps,jobs -n {name}` lists it, "
                    f"`nodus delete sweep NAME -n {name}` deletes a Sweep with its Jobs), then the project."
                ),
            )
        try:
            deleted = await store.delete(None, name)
        except kit.NotFound:
            raise _project_not_found(name) from None
        await principals.drop_project_roles(name)
        return object_response(deleted)


def _project_from(admitted: Project) -> Project:
    """The Project to store: of the admitted object's metadata only the name, labels and annotations are
    the caller's (no finalizers or owners on a project); uid, timestamps and status are the server's."""
    meta = admitted.metadata
    return Project(
        metadata=ObjectMeta(name=meta.name, labels=meta.labels, annotations=meta.annotations),
        spec=admitted.spec,
    )


async def _exists(store: Any, name: str) -> bool:
    try:
        await store.get(None, name)
    except kit.NotFound:
        return False
    return True


async def _project(store: Any, name: str) -> Project:
    if not _LABEL.fullmatch(name):
        raise _project_not_found(name)
    try:
        project: Project = await store.get(None, name)
    except kit.NotFound:
        raise _project_not_found(name) from None
    return project


def _project_not_found(name: str) -> ApiError:
    return ApiError.of(
        "NotFound",
        f'projects.{API_GROUP} "{name}" not found',
        name=name,
        kind="projects",
        fix="Check the name: `nodus get projects` lists them.",
    )


async def _contents(stores: Stores, project: str) -> list[str]:
    """``["2 sweeps", "6 jobs"]``: what a project still holds, by resource."""
    held: list[str] = []
    for plural, store in stores.items():
        page = await store.list(project, limit=1)
        count = len(page.items) + (page.remaining or 0)
        if count:
            held.append(f"{count} {plural}")
    return held


# ---------------------------------------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------------------------------------


def _token_routes(router: APIRouter, principals: Principals, max_body_bytes: int) -> None:
    token_res = token_resource(principals.now)

    @router.post(f"{PREFIX}/tokens", status_code=201, name="create token")
    async def create_token(
        request: Request, field_validation_: FieldValidationQ = None, dry_run: DryRunQ = None
    ) -> Response:
        caller = await authorize(request, "create", "tokens", None)
        validation = field_validation(field_validation_)
        dry = dry_run_of(dry_run)
        data = bodies.parse(await bodies.read_body(request, max_body_bytes), bodies.media_type(request))
        admitted = admit(token_res, _as_token(data), None, validation)
        spec: TokenSpec = admitted.obj.spec
        # Authorization before checking that the projects exist: otherwise a project admin could tell
        # other tenants' projects from missing ones by the error it gets.
        _check_may_grant(caller, spec)
        await _check_projects_exist(principals, spec)
        # dryRun=All: the token as it would be (its expiry included), no secret and nothing stored.
        token = await principals.mint(spec, dry_run=dry)
        return admitted_response(token_res, token, admitted.warnings, 201)

    @router.get(f"{PREFIX}/tokens", name="list tokens")
    async def list_tokens(request: Request) -> Response:
        caller = await authorize(request, "list", "tokens", None)
        page = await principals.token_records()
        items = [r.public() for r in page.items if _manages(caller, r)]
        meta = ListMeta(resource_version=str(page.resource_version))
        return object_response(_with_items(TokenList(metadata=meta, items=items)))

    @router.get(f"{PREFIX}/tokens/{{name}}", name="get token")
    async def get_token(name: str, request: Request) -> Response:
        caller = await authorize(request, "get", "tokens", None)
        return object_response((await _managed_token(principals, caller, name)).public())

    @router.delete(f"{PREFIX}/tokens/{{name}}", name="delete token")
    async def delete_token(name: str, request: Request) -> Response:
        caller = await authorize(request, "delete", "tokens", None)
        record = await _managed_token(principals, caller, name)
        try:
            revoked = await principals.revoke(record)
        except kit.NotFound:
            raise _token_not_found(name) from None
        return object_response(revoked)


_TOKEN_TOP: Final = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})


def _as_token(data: Any) -> Any:
    """A Token object (``{"spec": {"principal", "roles", ...}}``) as it is; the spec alone (the short form
    the endpoint has always taken: no key of a Token's own) as the Token holding it."""
    if isinstance(data, Mapping) and data and not (_TOKEN_TOP & data.keys()):
        return {"spec": data}
    return data


def _token_spec_errors(spec: TokenSpec, now: float) -> list[FieldError]:
    causes: list[FieldError] = _expiration_errors(spec, now)
    if not _PRINCIPAL.fullmatch(spec.principal) or spec.principal in RESERVED_PRINCIPALS:
        causes.append(
            FieldError(
                "spec.principal",
                CauseType.INVALID,
                f"Invalid value: {spec.principal!r}: a principal is a lower-case user name or e-mail "
                f"address (not {', '.join(sorted(RESERVED_PRINCIPALS))})",
            )
        )
    for project, role in spec.roles.items():
        if not _LABEL.fullmatch(project):
            causes.append(
                FieldError(f"spec.roles[{project}]", CauseType.INVALID, "Invalid value: not a project name")
            )
        if role not in ROLES:
            supported = ", ".join(f'"{r}"' for r in ROLES)
            causes.append(
                FieldError(
                    f"spec.roles[{project}]",
                    CauseType.NOT_SUPPORTED,
                    f"Unsupported value: {role!r}: supported values: {supported}",
                )
            )
    return causes


def _expiration_errors(spec: TokenSpec, now: float) -> list[FieldError]:
    """At most one of expirationSeconds and expirationTimestamp, each within 10 minutes to a year."""
    seconds, stamp = spec.expiration_seconds, spec.expiration_timestamp
    bounds = f"between {MIN_TOKEN_EXPIRATION_S} seconds (10 minutes) and {MAX_TOKEN_EXPIRATION_S} (a year)"
    if seconds is not None and stamp is not None:
        message = "Forbidden: may not be set together with spec.expirationSeconds: ask for one of them"
        return [FieldError("spec.expirationTimestamp", CauseType.FORBIDDEN, message)]
    if seconds is not None and not MIN_TOKEN_EXPIRATION_S <= seconds <= MAX_TOKEN_EXPIRATION_S:
        return [
            FieldError(
                "spec.expirationSeconds", CauseType.INVALID, f"Invalid value: {seconds}: must be {bounds}"
            )
        ]
    if stamp is None:
        return []
    try:
        left = parse_time(stamp).timestamp() - now
    except ValueError as e:
        return [FieldError("spec.expirationTimestamp", CauseType.INVALID, f"Invalid value: {stamp!r}: {e}")]
    if not MIN_TOKEN_EXPIRATION_S <= left <= MAX_TOKEN_EXPIRATION_S:
        current = format_time(datetime.fromtimestamp(now, UTC))
        message = f"Invalid value: {stamp!r}: must be {bounds} from now ({current})"
        return [FieldError("spec.expirationTimestamp", CauseType.INVALID, message)]
    return []


def _invalid_token(causes: list[FieldError]) -> ApiError:
    listed = ", ".join(str(c) for c in causes)
    message = f"Token.{API_GROUP} is invalid: " + (listed if len(causes) == 1 else f"[{listed}]")
    return ApiError.of("Invalid", message, kind="Token", causes=causes)


def _check_may_grant(caller: Principal, spec: TokenSpec) -> None:
    """The cluster admin grants anything; a project admin only roles in the projects it admins."""
    if caller.admin:
        return
    if not spec.roles:
        fix = "Give the token a role in a project you admin: spec.roles: {PROJECT: viewer|editor|admin}."
        raise forbidden(caller, "create", "tokens", None, None, fix=fix)
    for project in sorted(spec.roles):
        if not caller.admin_of(project):
            yours = ", ".join(sorted(caller.admin_projects))
            fix = f"You may grant roles only in projects you admin ({yours})."
            raise forbidden(caller, "create", "tokens", project, None, fix=fix)


async def _check_projects_exist(principals: Principals, spec: TokenSpec) -> None:
    missing = [p for p in sorted(spec.roles) if not await principals.project_exists(p)]
    if missing:
        causes = [
            FieldError(f"spec.roles[{p}]", CauseType.NOT_FOUND, f'Not found: project "{p}" does not exist')
            for p in missing
        ]
        raise _invalid_token(causes)


def _manages(caller: Principal, record: TokenRecord) -> bool:
    """The cluster admin manages every token; a project admin those with roles only in its projects."""
    if caller.admin:
        return True
    roles = record.spec.roles
    return bool(roles) and all(caller.admin_of(p) for p in roles)


async def _managed_token(principals: Principals, caller: Principal, token_id: str) -> TokenRecord:
    record = await principals.token_record(token_id)
    # A token the caller does not manage answers as a missing one: its roles are other tenants' business.
    if record is None or not _manages(caller, record):
        raise _token_not_found(token_id)
    return record


def _token_not_found(token_id: str) -> ApiError:
    return ApiError.of(
        "NotFound",
        f'tokens.{API_GROUP} "{token_id}" not found',
        name=token_id,
        kind="tokens",
        fix="Check the id: `GET /apis/nodus.dev/v1/tokens` lists the tokens you manage.",
    )


def _with_items(lst: Any) -> dict[str, Any]:
    out: dict[str, Any] = to_builtins(lst)
    out.setdefault("items", [])
    return out
