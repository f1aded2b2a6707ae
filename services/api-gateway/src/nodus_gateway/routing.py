"""The resource routes: create, list, get, get status and delete for every row of the resource table.

Paths are Kubernetes': ``/apis/nodus.dev/v1/namespaces/{namespace}/{plural}[/{name}[/status]]``. Update
(PUT/PATCH), watch and discovery come with the full API; their verbs answer 405 until then.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from nodus_gateway import bodies
from nodus_gateway.admitting import admit_create, with_generated_name
from nodus_gateway.resources import RESOURCES, Resource, Stores
from nodus_gateway.responding import ApiError, already_exists, not_found, object_response, store_errors
from nodus_kit import errors as kit
from nodus_kit.selecting import Selector
from nodus_schema import API_VERSION, ListMeta, to_builtins

API_PREFIX: Final = f"/apis/{API_VERSION}"

# Namespaces and names are DNS-1123 labels. Checked before any store access: they become NATS subject
# tokens, where "." splits tokens and "*" / ">" are wildcards.
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Generated names may collide; Kubernetes retries a create a few times before giving up.
_GENERATE_NAME_TRIES: Final = 3


def _check_namespace(namespace: str) -> None:
    if not _LABEL.fullmatch(namespace):
        raise ApiError.of(
            "BadRequest",
            f'"{namespace}" is not a valid namespace (project) name: it must be a DNS-1123 label '
            "(lower case letters, digits and '-', at most 63 characters)",
        )


def _check_name(res: Resource, namespace: str, name: str) -> None:
    # A name that could never have been created cannot exist: answer as for any missing object.
    if len(name) > res.max_name or not _LABEL.fullmatch(name):
        raise not_found(res, name, namespace)


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() not in ("", "0", "false")


def resource_router(res: Resource, stores: Stores, *, max_body_bytes: int) -> APIRouter:
    store = stores[res.plural]
    collection = f"{API_PREFIX}/namespaces/{{namespace}}/{res.plural}"
    item = f"{collection}/{{name}}"
    router = APIRouter(tags=[res.plural])

    @router.post(collection, status_code=201, name=f"create {res.singular}")
    async def create(namespace: str, request: Request) -> Response:
        _check_namespace(namespace)
        body = await bodies.read_body(request, max_body_bytes)
        obj = admit_create(res, bodies.parse(body, bodies.media_type(request)), namespace)
        tries = 1 if obj.metadata.name else _GENERATE_NAME_TRIES
        for attempt in range(tries):
            named = with_generated_name(obj)
            try:
                created = await store.create(named)
            except kit.AlreadyExists:
                if attempt + 1 < tries:
                    continue
                raise already_exists(res, named.metadata.name, namespace) from None
            return object_response(created, 201)
        raise AssertionError("unreachable")  # the loop returns or raises

    @router.get(collection, name=f"list {res.plural}")
    async def list_(
        namespace: str,
        label_selector: Annotated[str | None, Query(alias="labelSelector")] = None,
        limit: Annotated[int | None, Query(ge=0)] = None,
        continue_: Annotated[str | None, Query(alias="continue")] = None,
        watch: Annotated[str | None, Query()] = None,
    ) -> Response:
        _check_namespace(namespace)
        if _truthy(watch):
            raise ApiError.of(
                "MethodNotAllowed",
                f"watching {res.plural} is not served yet; list (or poll) instead",
                fix="Poll the list, or `nodus get sweep NAME --watch`; watch comes with the full API.",
            )
        with store_errors(res, namespace):
            page = await store.list(
                namespace,
                selector=Selector.parse(label_selector),
                # limit=0 means no limit, as in Kubernetes.
                limit=limit or None,
                continue_token=continue_ or None,
            )
        meta = ListMeta(
            resource_version=str(page.resource_version),
            continue_=page.continue_token,
            remaining_item_count=page.remaining,
        )
        out = to_builtins(res.list_type(metadata=meta, items=page.items))
        # Kubernetes always writes "items", [] included, and clients index it without a default; the wire
        # types leave empty lists out (omit_defaults), so it is put back here.
        out.setdefault("items", [])
        return object_response(out)

    async def _get(namespace: str, name: str) -> Any:
        _check_namespace(namespace)
        _check_name(res, namespace, name)
        with store_errors(res, namespace, name):
            return await store.get(namespace, name)

    @router.get(item, name=f"get {res.singular}")
    async def get(namespace: str, name: str) -> Response:
        return object_response(await _get(namespace, name))

    @router.get(f"{item}/status", name=f"get {res.singular} status")
    async def get_status(namespace: str, name: str) -> Response:
        # The status subresource returns the whole object, as Kubernetes' does.
        return object_response(await _get(namespace, name))

    @router.delete(item, name=f"delete {res.singular}")
    async def delete(namespace: str, name: str) -> Response:
        _check_namespace(namespace)
        _check_name(res, namespace, name)
        with store_errors(res, namespace, name):
            deleted = await store.delete(namespace, name)
        # Kubernetes returns the deleted object for custom resources (a Status only for built-ins).
        # A Sweep's cell Jobs go with it: the sweep controller deletes what the Sweep owns.
        return object_response(deleted)

    return router


def api_router(stores: Stores, *, max_body_bytes: int) -> APIRouter:
    router = APIRouter()
    for res in RESOURCES:
        router.include_router(resource_router(res, stores, max_body_bytes=max_body_bytes))
    return router
