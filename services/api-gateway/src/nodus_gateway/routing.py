"""The resource routes: every verb of Kubernetes' for every namespaced row of the resource table.

Paths are Kubernetes': ``/apis/nodus.dev/v1/namespaces/{namespace}/{plural}[/{name}[/status]]``, and
``/apis/nodus.dev/v1/{plural}`` to list and watch across the projects the caller may see.

=========================  ==================  ======================================================
route                      verb                parameters
=========================  ==================  ======================================================
POST   collection          create              fieldValidation, dryRun; If-Match (a dry-run's ETag)
GET    collection          list / watch        labelSelector, fieldSelector, limit, continue; watch,
                                               resourceVersion, timeoutSeconds, allowWatchBookmarks
DELETE collection          deletecollection    labelSelector, fieldSelector, propagationPolicy
GET    item[/status]       get
PUT    item                update              fieldValidation (the body's resourceVersion: CAS)
PATCH  item                patch               fieldValidation, fieldManager, force
DELETE item                delete              propagationPolicy, DeleteOptions body (preconditions)
PUT/PATCH item/status      (405)               users never write status
=========================  ==================  ======================================================

Every handler asks :func:`~nodus_gateway.authorizing.authorize` first, with the verb Kubernetes' RBAC
would see.

A create of a compute kind (Sweep, Job, Pipeline) carries ``status.estimate`` (ADR-031), asked of the
scheduler and billing over the bus (:mod:`nodus_gateway.estimating`; a Pipeline's per stage, with
``status.estimatedDuration``). ``?dryRun=All`` answers the estimate with an ``ETag``; a create sent with
``If-Match: <that ETag>`` is bound to it (412 when the spec changed since). A real create whose estimate
has blocking reasons is refused with the first; one the services do not answer is admitted without an
estimate, with a warning.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from nodus_gateway import bodies, referencing
from nodus_gateway.admitting import (
    Admitted,
    admit,
    admit_update,
    bind,
    with_apply_manager,
    with_generated_name,
)
from nodus_gateway.authorizing import authorize, visible_namespaces
from nodus_gateway.deleting import delete_object, delete_options
from nodus_gateway.estimating import COMPUTE_KINDS, ask, estimable, estimate_for, quoted, with_estimate
from nodus_gateway.patching import PatchApplyError, PatchDecodeError, json_patch, merge_patch
from nodus_gateway.querying import (
    DryRunQ,
    FieldManagerQ,
    FieldSelectorQ,
    ForceQ,
    LabelSelectorQ,
    ListQ,
    ListQuery,
    PropagationQ,
    WriteOptions,
    WriteQ,
    dry_run_of,
)
from nodus_gateway.referencing import ReferenceSettings as Refs
from nodus_gateway.resources import RESOURCES, Resource, Stores
from nodus_gateway.responding import ApiError, already_exists, not_found, object_response, store_errors
from nodus_gateway.selecting import FieldSelector, parse_field_selector
from nodus_gateway.watching import WatchRequest, parse_resource_version, watch_response
from nodus_kit import errors as kit
from nodus_kit import tracing
from nodus_kit.keying import Page
from nodus_kit.selecting import Selector
from nodus_kit.storing import ObjectStore
from nodus_schema import API_VERSION, ListMeta, status_for, to_builtins
from nodus_schema.costs import Estimate
from nodus_schema.estimating import estimate_etag

API_PREFIX: Final = f"/apis/{API_VERSION}"

# Namespaces and names are DNS-1123 labels. Checked before any store access: they become NATS subject
# tokens, where "." splits tokens and "*" / ">" are wildcards.
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Generated names may collide; Kubernetes retries a create a few times before giving up.
_GENERATE_NAME_TRIES: Final = 3
# Object names: label characters, any length up to the resource's max_name (attempt names run past 63).
# No "." either way: a name is a NATS subject token.
_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# A patch re-applied on a fresh read after a lost compare-and-set, as the apiserver retries it.
PATCH_TRIES: Final = 5

MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
# kubectl sends a strategic merge patch only to built-in kinds (for a custom resource it sends a merge
# patch); a client that sends one anyway gets merge-patch semantics, which is what a strategic merge
# patch means for types without patch-merge keys (every list is replaced whole).
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
PATCH_TYPES: Final = (JSON_PATCH, MERGE_PATCH, APPLY_PATCH, STRATEGIC_PATCH)


def _check_namespace(namespace: str) -> None:
    if not _LABEL.fullmatch(namespace):
        raise ApiError.of(
            "BadRequest",
            f'"{namespace}" is not a valid namespace (project) name: it must be a DNS-1123 label '
            "(lower case letters, digits and '-', at most 63 characters)",
        )


def _check_name(res: Resource, namespace: str, name: str) -> None:
    # A name that could never have been created cannot exist: answer as for any missing object.
    if len(name) > res.max_name or not _NAME.fullmatch(name):
        raise not_found(res, name, namespace)


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() not in ("", "0", "false")


def _header_safe(text: str) -> str:
    """A warning's text as a quoted-string header value: quotes and backslashes escaped, and anything
    outside printable ASCII (field names come from the caller) escaped, so it cannot split the header."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text  # the common case: nothing to escape
    out = []
    for ch in text.replace("\\", "\\\\").replace('"', '\\"'):
        out.append(ch if " " <= ch <= "~" else ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def admitted_response(
    res: Resource,
    obj: Any,
    warnings: tuple[str, ...] = (),
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """The stored object (without its write-only fields), with one ``Warning: 299 - "..."`` header per
    warning, as Kubernetes sends them, and any other ``headers`` (a dry-run's ETag)."""
    response = object_response(res.redact(obj), status_code)
    for text in warnings:
        response.headers.append("Warning", f'299 - "{_header_safe(text)}"')
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


@dataclass(frozen=True, slots=True)
class Estimated:
    """A create's admitted object with its estimate in status, and the headers of its answer."""

    admitted: Admitted
    headers: Mapping[str, str]


def _estimate_error(res: Resource, name: str | None, err: kit.NodusError) -> ApiError:
    """A dry run without its estimate: the services did not answer, or could not estimate the spec."""
    if isinstance(err, kit.Invalid):
        subject = f'{res.group_kind} "{name}"' if name else res.group_kind
        return ApiError.of(
            "Invalid",
            f"{subject} cannot be estimated: {err}",
            name=name,
            kind=res.kind,
            fix="Fix the fields the message names (a duration or an amount that does not parse) and send "
            "the object again.",
        )
    fix = (
        "A dry run answers the estimate, which the scheduler and billing services make: check that both "
        "are running and retry. A create without dryRun is admitted meanwhile, without an estimate."
    )
    if isinstance(err, kit.Timeout):
        return ApiError.of("Timeout", f"no estimate: {err}", fix=fix, retry_after=1)
    if isinstance(err, kit.Unavailable):
        return ApiError.of("ServiceUnavailable", f"no estimate: {err}", fix=fix, retry_after=1)
    return ApiError.of("InternalError", f"no estimate: {err.reason}: {err}", fix=fix)


def _refusal(res: Resource, name: str | None, estimate: Estimate) -> ApiError:
    """A create the estimate blocks, refused with its first blocking reason (its code, message and fix)."""
    first = estimate.blocking_reasons[0]
    code = first.code or "Forbidden"
    message = first.message or f"the estimate of this {res.kind} blocks its create"
    try:
        status = status_for(code, message, name=name, kind=res.kind, fix=first.fix)
    except ValueError:  # a reason this gateway does not know yet: still a refusal, said as one
        status = status_for("Forbidden", f"{code}: {message}", name=name, kind=res.kind, fix=first.fix)
    return ApiError(status)


def page_response(res: Resource, page: Page[Any]) -> Response:
    """One page of a list as its list type writes it, each item through the row's redaction."""
    meta = ListMeta(
        resource_version=str(page.resource_version),
        continue_=page.continue_token,
        remaining_item_count=page.remaining,
    )
    out = to_builtins(res.list_type(metadata=meta, items=[res.redact(o) for o in page.items]))
    # Kubernetes always writes "items", [] included, and clients index it without a default; the wire
    # types leave empty lists out (omit_defaults), so it is put back here.
    out.setdefault("items", [])
    return object_response(out)


async def _filtered_list(
    store: ObjectStore[Any],
    namespace: str | None,
    *,
    labels: Selector | None,
    keep: Callable[[Any], bool] | None,
    limit: int | None,
    continue_token: str | None,
) -> Page[Any]:
    """A list page through a filter the store cannot apply (field selectors, visible projects).

    The store pages by key; a filtered page must still end at a key the continue token can point after.
    So: read everything after the token, find where the ``limit``-th match sits, and read again with
    that as the store's own limit, which yields the right token. The count of the rest is unknown with a
    filter, as in Kubernetes (no remainingItemCount)."""
    if keep is None:
        return await store.list(namespace, selector=labels, limit=limit, continue_token=continue_token)
    whole = await store.list(namespace, selector=labels, continue_token=continue_token)
    matches = [i for i, obj in enumerate(whole.items) if keep(obj)]
    if limit is None or len(matches) <= limit:
        return Page([whole.items[i] for i in matches], whole.resource_version, None, None)
    page = await store.list(
        namespace, selector=labels, limit=matches[limit - 1] + 1, continue_token=continue_token
    )
    return Page([o for o in page.items if keep(o)], whole.resource_version, page.continue_token, None)


def _keep(fields: FieldSelector | None, namespaces: frozenset[str] | None) -> Callable[[Any], bool] | None:
    """The filter for a list beyond labels: the field selector and the projects the caller may see."""
    if fields is None and namespaces is None:
        return None

    def keep(obj: Any) -> bool:
        visible = namespaces is None or obj.metadata.namespace in namespaces
        return visible and (fields is None or fields.matches(obj))

    return keep


def _parse_labels(text: str | None) -> Selector | None:
    try:
        return Selector.parse(text)
    except kit.Invalid as e:
        raise ApiError.of("BadRequest", str(e)) from None


def _patch_type(request: Request) -> str:
    media = bodies.media_type(request)
    if media not in PATCH_TYPES:
        raise ApiError.of(
            "UnsupportedMediaType",
            f'the body of the request was in an unknown format ("{media or "none"}") - accepted media types '
            f"include: {', '.join(PATCH_TYPES)}",
            fix=f"Send the patch with Content-Type {MERGE_PATCH} (a partial object) or {JSON_PATCH}.",
        )
    return media


def _patched(kind: str, current: dict[str, Any], patch: Any) -> Any:
    """The stored object's JSON with the patch applied. A patch that cannot be read is a 400; one that
    does not apply (a failed test op, a missing path) a 422, as the apiserver tells them apart."""
    try:
        if kind == JSON_PATCH:
            return json_patch(current, patch)
        if not isinstance(patch, Mapping):
            raise PatchDecodeError("a merge patch must be a JSON object (the fields to change)")
        return merge_patch(current, patch)
    except PatchDecodeError as e:
        raise ApiError.of("BadRequest", f"the patch is not valid: {e}") from None
    except PatchApplyError as e:
        raise ApiError.of(
            "Invalid",
            f"the patch could not be applied: {e}",
            fix="Get the object again, "
            "check the paths and test values of your patch against it, and send it again.",
        ) from None


def _resource_version(data: Any) -> str | None:
    meta = data.get("metadata") if isinstance(data, Mapping) else None
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return rv if isinstance(rv, str) and rv else None


class _Routes:
    """The handlers of one resource; :func:`resource_router` mounts them."""

    def __init__(self, res: Resource, stores: Stores, max_body_bytes: int, refs: Refs) -> None:
        self.res, self.stores, self.max_body_bytes = res, stores, max_body_bytes
        self.store = stores[res.plural]
        self.refs = refs

    # -- create ---------------------------------------------------------------------------------------
    async def create(self, namespace: str, request: Request, opts: WriteQ) -> Response:
        await authorize(request, "create", self.res.plural, namespace)
        _check_namespace(namespace)
        body = await bodies.read_body(request, self.max_body_bytes)
        media = bodies.media_type(request)
        data = bodies.parse(body, media)
        json_body = body if bodies.is_json(media) else None
        admitted = admit(self.res, data, namespace, opts.validation, json_body=json_body)
        # What the spec names in other objects (ADR-0036), before the binding: pinning changes the spec.
        admitted = await self._referenced(admitted, namespace, dry_run=opts.dry_run)
        admitted = bind(self.res, admitted, request.headers.get("if-match"))
        estimated = await self._estimated(admitted, dry_run=opts.dry_run)
        admitted, headers = estimated.admitted, estimated.headers
        if opts.dry_run:
            obj = with_generated_name(admitted.obj)
            return admitted_response(self.res, obj, admitted.warnings, 201, headers)
        created = await self._create(admitted.obj, namespace)
        await referencing.claim_writers(self.stores, created)
        return admitted_response(self.res, created, admitted.warnings, 201, headers)

    async def _referenced(self, admitted: Admitted, namespace: str, *, dry_run: bool) -> Admitted:
        obj = await referencing.resolve(self.stores, self.refs, namespace, admitted.obj, dry_run=dry_run)
        return Admitted(obj, admitted.warnings)

    async def _estimated(self, admitted: Admitted, *, dry_run: bool) -> Estimated:
        """The object to create with ``status.estimate`` (ADR-031), for the compute kinds.

        A dry run exists to get the estimate: it answers it (blocking reasons included) with its ETag, or
        an error when the services do not answer. A real create is refused by a blocking reason, and is
        admitted without an estimate (with a warning) when the services do not answer: the controllers
        still enforce the caps and the queue timeout, and a create must not depend on two more services.
        """
        if not estimable(self.res):
            return Estimated(admitted, {})
        obj, nc = admitted.obj, self.store.nc
        name = obj.metadata.name or obj.metadata.generate_name
        if dry_run:
            try:
                estimate = await ask(nc, self.res, obj)
            except kit.NodusError as e:
                raise _estimate_error(self.res, name, e) from None
            etag = estimate_etag(estimate, obj.spec)
            return Estimated(Admitted(with_estimate(obj, estimate), admitted.warnings), {"ETag": etag})
        try:
            asked = await estimate_for(nc, self.res, obj)
        except kit.Invalid as e:
            raise _estimate_error(self.res, name, e) from None
        if asked.estimate is None:
            warning = f"no estimate: {asked.missing}; the {self.res.kind} is admitted without status.estimate"
            return Estimated(Admitted(obj, (*admitted.warnings, warning)), {})
        if asked.estimate.blocking_reasons:
            raise _refusal(self.res, name, asked.estimate)
        return Estimated(Admitted(quoted(obj, asked.estimate), admitted.warnings), {})

    def _traced(self, obj: Any) -> Any:
        """A Job or Sweep carries the trace of its create, which the controllers continue (ADR-0032)."""
        return tracing.stamp(obj) if self.res.kind in COMPUTE_KINDS else obj

    async def _create(self, obj: Any, namespace: str) -> Any:
        tries = 1 if obj.metadata.name else _GENERATE_NAME_TRIES
        for attempt in range(tries):
            named = with_generated_name(obj)
            try:
                return await self.store.create(self._traced(named))
            except kit.AlreadyExists:
                if attempt + 1 < tries:
                    continue
                raise already_exists(self.res, named.metadata.name, namespace) from None
        raise AssertionError("unreachable")  # the loop returns or raises

    # -- list and watch -------------------------------------------------------------------------------
    async def list_(self, namespace: str, request: Request, q: ListQ) -> Response:
        _check_namespace(namespace)
        return await self._list_or_watch(request, namespace, q, watch=_truthy(q.watch))

    async def list_all(self, request: Request, q: ListQ) -> Response:
        return await self._list_or_watch(request, None, q, watch=_truthy(q.watch))

    async def watch_(self, namespace: str, request: Request, q: ListQ) -> Response:
        _check_namespace(namespace)
        return await self._list_or_watch(request, namespace, q, watch=True)

    async def watch_all(self, request: Request, q: ListQ) -> Response:
        return await self._list_or_watch(request, None, q, watch=True)

    async def _list_or_watch(
        self, request: Request, namespace: str | None, q: ListQuery, *, watch: bool
    ) -> Response:
        verb = "watch" if watch else "list"
        principal = await authorize(request, verb, self.res.plural, namespace)
        if verb not in self.res.verbs:
            raise ApiError.of(
                "MethodNotAllowed",
                f"{self.res.group_resource} does not support {verb}",
                fix=f"{self.res.plural} support {', '.join(self.res.verbs)}.",
            )
        # Across namespaces, only the caller's projects (None: all of them, for the cluster admin).
        namespaces = visible_namespaces(principal) if namespace is None else None
        labels, fields = _parse_labels(q.label_selector), parse_field_selector(q.field_selector)
        if watch:
            return await watch_response(
                request,
                WatchRequest(
                    store=self.store,
                    kind=self.res.kind,
                    namespace=namespace,
                    resource_version=parse_resource_version(q.resource_version),
                    labels=labels,
                    fields=fields,
                    namespaces=namespaces,
                    timeout_s=q.timeout_seconds or None,  # 0: no timeout of its own
                    bookmarks=_truthy(q.allow_watch_bookmarks),
                    redact=self.res.redact,
                ),
            )
        with store_errors(self.res, namespace or ""):
            page = await _filtered_list(
                self.store,
                namespace,
                labels=labels,
                keep=_keep(fields, namespaces),
                # limit=0 means no limit, as in Kubernetes.
                limit=q.limit or None,
                continue_token=q.continue_ or None,
            )
        return page_response(self.res, page)

    # -- get ------------------------------------------------------------------------------------------
    async def get(self, namespace: str, name: str, request: Request) -> Response:
        await authorize(request, "get", self.res.plural, namespace)
        return admitted_response(self.res, await self._get(namespace, name))

    async def get_status(self, namespace: str, name: str, request: Request) -> Response:
        # The status subresource returns the whole object, as Kubernetes' does.
        return await self.get(namespace, name, request)

    async def _get(self, namespace: str, name: str) -> Any:
        _check_namespace(namespace)
        _check_name(self.res, namespace, name)
        with store_errors(self.res, namespace, name):
            return await self.store.get(namespace, name)

    # -- update ---------------------------------------------------------------------------------------
    async def update(self, namespace: str, name: str, request: Request, opts: WriteQ) -> Response:
        await authorize(request, "update", self.res.plural, namespace)
        current = await self._get(namespace, name)
        data = await self._body(request)
        admitted = admit_update(self.res, data, current, validation=opts.validation)
        if opts.dry_run:
            return admitted_response(self.res, admitted.obj, admitted.warnings)
        with store_errors(self.res, namespace, name):
            updated = await self.store.update(admitted.obj)
        return admitted_response(self.res, updated, admitted.warnings)

    async def write_status(self, namespace: str, name: str, request: Request) -> Response:
        verb = "update" if request.method == "PUT" else "patch"
        await authorize(request, verb, self.res.plural, namespace)
        raise ApiError(
            ApiError.of(
                "MethodNotAllowed",
                f"the status of {self.res.group_resource} is written by Nodus' controllers only",
                name=name,
                kind=self.res.plural,
                fix=f"Change the spec instead (PUT or PATCH {self.res.singular}/{name}); the controllers "
                "report the outcome in status.",
            ).status,
            headers={"Allow": "GET"},
        )

    # -- patch ----------------------------------------------------------------------------------------
    async def patch(
        self,
        namespace: str,
        name: str,
        request: Request,
        opts: WriteQ,
        field_manager: FieldManagerQ = None,
        force: ForceQ = None,
    ) -> Response:
        await authorize(request, "patch", self.res.plural, namespace)
        _check_namespace(namespace)
        _check_name(self.res, namespace, name)
        kind = _patch_type(request)
        body = await bodies.read_body(request, self.max_body_bytes)
        # An apply body is YAML (JSON is YAML too); every other patch is JSON.
        patch = bodies.parse(body, "application/yaml" if kind == APPLY_PATCH else "application/json")
        if kind != APPLY_PATCH:
            return await self._patch(namespace, name, kind, patch, opts)
        if not field_manager:
            raise ApiError.of(
                "BadRequest",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for '
                "apply patch",
                fix="Name the applier: add ?fieldManager=<your tool> (kubectl apply --server-side sends it).",
            )
        # force=true takes fields from other managers; without conflict detection every apply wins, so
        # the parameter is accepted and needs no further handling.
        _ = _truthy(force)
        if not isinstance(patch, Mapping):
            raise ApiError.of("BadRequest", f"an apply patch must be a {self.res.kind} object")
        return await self._apply(namespace, name, patch, opts, field_manager)

    async def _patch(self, namespace: str, name: str, kind: str, patch: Any, opts: WriteOptions) -> Response:
        for attempt in range(PATCH_TRIES):
            current = await self._get(namespace, name)
            data = _patched(kind, to_builtins(current), patch)
            admitted = admit_update(
                self.res, data, current, validation=opts.validation, require_resource_version=False
            )
            updated = await self._store_update(admitted, current, data, opts, last=attempt + 1 == PATCH_TRIES)
            if updated is not None:
                return admitted_response(self.res, updated, admitted.warnings)
        raise AssertionError("unreachable")  # the last try returns or raises

    async def _apply(
        self, namespace: str, name: str, patch: Mapping[str, Any], opts: WriteOptions, manager: str
    ) -> Response:
        """Server-side apply, as create-or-merge: the patch creates the object when there is none, and
        is merged into it (a merge patch) when there is; the manager is recorded in managedFields."""
        for attempt in range(PATCH_TRIES):
            try:
                current = await self.store.get(namespace, name)
            except kit.NotFound:
                created = await self._apply_create(namespace, name, patch, opts, manager)
                if created is not None:
                    return created
                continue  # someone created it meanwhile: apply onto theirs
            data = _patched(MERGE_PATCH, to_builtins(current), patch)
            admitted = admit_update(
                self.res, data, current, validation=opts.validation, require_resource_version=False
            )
            admitted = Admitted(with_apply_manager(admitted.obj, manager, patch), admitted.warnings)
            updated = await self._store_update(admitted, current, data, opts, last=attempt + 1 == PATCH_TRIES)
            if updated is not None:
                return admitted_response(self.res, updated, admitted.warnings)
        raise AssertionError("unreachable")

    async def _apply_create(
        self, namespace: str, name: str, patch: Mapping[str, Any], opts: WriteOptions, manager: str
    ) -> Response | None:
        """Create from an apply patch; None if the name was taken meanwhile."""
        meta = patch.get("metadata")
        meta = dict(meta) if isinstance(meta, Mapping) else {}
        if meta.get("name") not in (None, "", name):
            raise ApiError.of(
                "BadRequest",
                f'the name of the object ("{meta["name"]}") does not match the name on the URL ("{name}")',
                name=name,
                kind=self.res.kind,
            )
        admitted = admit(self.res, {**patch, "metadata": {**meta, "name": name}}, namespace, opts.validation)
        admitted = await self._referenced(admitted, namespace, dry_run=opts.dry_run)
        # A create, so estimated as one (ADR-031); an apply has no If-Match to bind it.
        estimated = await self._estimated(admitted, dry_run=opts.dry_run)
        admitted, headers = estimated.admitted, estimated.headers
        obj = with_apply_manager(admitted.obj, manager, patch)
        if opts.dry_run:
            return admitted_response(self.res, obj, admitted.warnings, 201, headers)
        try:
            created = await self.store.create(self._traced(obj))
        except kit.AlreadyExists:
            return None
        await referencing.claim_writers(self.stores, created)
        return admitted_response(self.res, created, admitted.warnings, 201, headers)

    async def _store_update(
        self, admitted: Admitted, current: Any, data: Any, opts: WriteOptions, *, last: bool
    ) -> Any:
        """Compare-and-set the patched object; None when a concurrent write won and the patch should be
        applied again on a fresh read. A resourceVersion the patch itself sets is the caller's
        precondition: then a conflict is theirs to see (409), never retried."""
        pinned = _resource_version(data)
        meta = current.metadata
        obj = admitted.obj
        if pinned is None:
            # The patch removed the resourceVersion: an unconditional patch, on what was just read.
            obj = msgspec.structs.replace(
                obj, metadata=msgspec.structs.replace(obj.metadata, resource_version=meta.resource_version)
            )
        if opts.dry_run:
            return obj
        try:
            with store_errors(self.res, meta.namespace, meta.name):
                return await self.store.update(obj)
        except ApiError as e:
            if e.status.reason != "Conflict" or last or pinned not in (None, meta.resource_version):
                raise
            return None

    # -- delete ---------------------------------------------------------------------------------------
    async def delete(
        self,
        namespace: str,
        name: str,
        request: Request,
        propagation_policy: PropagationQ = None,
        dry_run: DryRunQ = None,
    ) -> Response:
        await authorize(request, "delete", self.res.plural, namespace)
        _check_namespace(namespace)
        _check_name(self.res, namespace, name)
        options = delete_options(propagation_policy, await self._optional_body(request))
        with store_errors(self.res, namespace, name):
            deleted = await delete_object(
                self.res, self.stores, namespace, name, options, dry_run=dry_run_of(dry_run)
            )
        # Kubernetes returns the deleted object for custom resources (a Status only for built-ins).
        return admitted_response(self.res, deleted)

    async def delete_collection(
        self,
        namespace: str,
        request: Request,
        label_selector: LabelSelectorQ = None,
        field_selector: FieldSelectorQ = None,
        propagation_policy: PropagationQ = None,
        dry_run: DryRunQ = None,
    ) -> Response:
        await authorize(request, "deletecollection", self.res.plural, namespace)
        dry = dry_run_of(dry_run)
        _check_namespace(namespace)
        labels, fields = _parse_labels(label_selector), parse_field_selector(field_selector)
        options = delete_options(propagation_policy, await self._optional_body(request))
        with store_errors(self.res, namespace):
            page = await _filtered_list(
                self.store,
                namespace,
                labels=labels,
                keep=_keep(fields, None),
                limit=None,
                continue_token=None,
            )
        deleted = []
        for obj in page.items:
            try:
                deleted.append(
                    await delete_object(
                        self.res, self.stores, namespace, obj.metadata.name, options, dry_run=dry
                    )
                )
            except kit.NotFound:
                continue  # deleted by someone else meanwhile: gone, as asked
        # Kubernetes answers a deletecollection of custom resources with the list of what it deleted.
        return page_response(self.res, Page(deleted, page.resource_version, None, None))

    # -- bodies ---------------------------------------------------------------------------------------
    async def _body(self, request: Request) -> Any:
        body = await bodies.read_body(request, self.max_body_bytes)
        return bodies.parse(body, bodies.media_type(request))

    async def _optional_body(self, request: Request) -> Any:
        """A DELETE's DeleteOptions body, if one was sent (kubectl sends one; curl users rarely do)."""
        body = await bodies.read_body(request, self.max_body_bytes)
        return bodies.parse(body, bodies.media_type(request)) if body.strip() else None


def resource_router(res: Resource, stores: Stores, *, max_body_bytes: int, refs: Refs) -> APIRouter:
    """The routes of one resource, for the verbs its row lists (any other method answers 405)."""
    routes = _Routes(res, stores, max_body_bytes, refs)
    collection = f"{API_PREFIX}/namespaces/{{namespace}}/{res.plural}"
    item = f"{collection}/{{name}}"
    router = APIRouter(tags=[res.plural])

    def add(verbs: set[str], path: str, endpoint: Callable[..., Any], method: str, name: str) -> None:
        if verbs & set(res.verbs):
            router.add_api_route(path, endpoint, methods=[method], name=f"{name} {res.plural}")

    add({"create"}, collection, routes.create, "POST", "create")
    add({"list", "watch"}, collection, routes.list_, "GET", "list")
    add({"deletecollection"}, collection, routes.delete_collection, "DELETE", "deletecollection")
    add({"list", "watch"}, f"{API_PREFIX}/{res.plural}", routes.list_all, "GET", "list all")
    # The old /watch/ paths, which Kubernetes still serves and older clients still use.
    add({"watch"}, f"{API_PREFIX}/watch/namespaces/{{namespace}}/{res.plural}", routes.watch_, "GET", "watch")
    add({"watch"}, f"{API_PREFIX}/watch/{res.plural}", routes.watch_all, "GET", "watch all")
    add({"get"}, item, routes.get, "GET", "get")
    add({"update"}, item, routes.update, "PUT", "update")
    add({"patch"}, item, routes.patch, "PATCH", "patch")
    add({"delete"}, item, routes.delete, "DELETE", "delete")
    if "status" in res.subresources:
        add({"get"}, f"{item}/status", routes.get_status, "GET", "get status of")
        # Served, to answer why: users never write status (the controllers do).
        add({"update"}, f"{item}/status", routes.write_status, "PUT", "update status of")
        add({"patch"}, f"{item}/status", routes.write_status, "PATCH", "patch status of")
    return router


def api_routers(stores: Stores, *, max_body_bytes: int, refs: Refs) -> list[APIRouter]:
    """One router per resource this module serves, in the resource table's order. ``refs``: what
    admission's reads of other objects need (git hosts, the URL runs reach the API at; referencing.py)."""
    # Rows served by other modules (clusterrouting, secreting) have routes of their own.
    return [
        resource_router(res, stores, max_body_bytes=max_body_bytes, refs=refs)
        for res in RESOURCES
        if res.served_by == "routing" and res.namespaced
    ]
