"""Routes of the read-only resources: attempts (namespaced), nodes and offerings (cluster-scoped).

Services write these objects (the scheduler its Attempts and the published price book, node agents their
Nodes); the API only reads them: list and get, and 405 MethodNotAllowed with who writes them for every
write verb. Paths are Kubernetes': ``/apis/nodus.dev/v1/namespaces/{namespace}/attempts[/{name}]`` and,
for cluster-scoped rows, ``/apis/nodus.dev/v1/nodes[/{name}]``. A row whose verbs list ``delete`` (Nodes)
is deleted here too, one object at a time, with Kubernetes' DeleteOptions (deleting.py): only the cluster
admin may (authorizing.py), as ``kubectl delete node`` removes the record of a machine that is gone.

This module serves list and get of the rows with ``served_by="clusterrouting"`` (the cluster-scoped ones:
the generic routes serve namespaced rows only), and, for every ``read_only`` row, the write verbs, so
that a write gets 405 with who writes the resource rather than a bare 405 (its routes are registered
ahead of the generic ones). When the generic routes serve cluster-scoped rows, nodes and offerings move
to ``served_by="routing"`` and only the 405s stay here. The helpers here (name checks, list responses)
are shared with secreting.py.
"""

from __future__ import annotations

import re
from typing import Any, Final

from fastapi import APIRouter, Request
from starlette.responses import Response

from nodus_gateway import bodies
from nodus_gateway.authorizing import authorize
from nodus_gateway.deleting import delete_object, delete_options
from nodus_gateway.querying import DryRunQ, PageQ, PageQuery, PropagationQ, dry_run_of
from nodus_gateway.resources import RESOURCES, Resource, Stores
from nodus_gateway.responding import ApiError, not_found, object_response, store_errors
from nodus_gateway.routing import API_PREFIX, page_response
from nodus_kit.selecting import Selector
from nodus_kit.storing import ObjectStore
from nodus_schema import status_for

# Namespaces and names are DNS-1123 labels: they become NATS subject tokens, where "." splits tokens and
# "*" / ">" are wildcards, so they are checked before any store access.
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAMESPACE_MAX: Final = 63
WRITE_METHODS: Final = ("POST", "PUT", "PATCH", "DELETE")


def check_namespace(namespace: str) -> None:
    if len(namespace) > _NAMESPACE_MAX or not _LABEL.fullmatch(namespace):
        raise ApiError.of(
            "BadRequest",
            f'"{namespace}" is not a valid namespace (project) name: it must be a DNS-1123 label '
            "(lower case letters, digits and '-', at most 63 characters)",
        )


def check_name(res: Resource, name: str, namespace: str | None) -> None:
    # A name that could never have been stored cannot exist: answer as for any missing object.
    if len(name) > res.max_name or not _LABEL.fullmatch(name):
        raise not_found(res, name, namespace or "")


def truthy(value: str | None) -> bool:
    return value is not None and value.lower() not in ("", "0", "false")


def no_watch(res: Resource) -> ApiError:
    return ApiError.of(
        "MethodNotAllowed",
        f"watching {res.plural} is not served yet; list (or poll) instead",
        fix=f"Poll the list: `nodus get {res.plural}`.",
    )


async def list_response(
    res: Resource,
    store: ObjectStore[Any],
    namespace: str | None,
    *,
    label_selector: str | None,
    limit: int | None,
    continue_: str | None,
) -> Response:
    """One page of the list, each item through the row's redaction, as the generic list writes it."""
    with store_errors(res, namespace or ""):
        page = await store.list(
            namespace,
            selector=Selector.parse(label_selector),
            # limit=0 means no limit, as in Kubernetes.
            limit=limit or None,
            continue_token=continue_ or None,
        )
    return page_response(res, page)


async def serve_list(
    request: Request, res: Resource, store: ObjectStore[Any], namespace: str | None, query: PageQuery
) -> Response:
    """A list route of a row that only pages and selects by labels: authorized (a watch as a watch,
    then refused), then :func:`list_response`."""
    await authorize(request, "watch" if truthy(query.watch) else "list", res.plural, namespace)
    if truthy(query.watch):
        raise no_watch(res)
    return await list_response(
        res,
        store,
        namespace,
        label_selector=query.label_selector,
        limit=query.limit,
        continue_=query.continue_,
    )


def method_not_allowed(res: Resource, method: str, *, item: bool = False) -> ApiError:
    """405 for a write to a read-only resource, saying who writes it (Allow says what this path takes:
    an object of a deletable row also takes DELETE)."""
    who = res.written_by or "the Nodus services"
    deletable = item and "delete" in res.verbs
    also = "; the cluster admin may DELETE one" if deletable else ""
    status = status_for(
        "MethodNotAllowed",
        f"{res.group_resource} is read-only: the server does not allow {method} on it",
        kind=res.plural,
        fix=f"{res.plural.capitalize()} are written by {who}; read them with GET (list or get){also}.",
    )
    return ApiError(status, headers={"Allow": "GET, HEAD, DELETE" if deletable else "GET, HEAD"})


def _paths(res: Resource) -> tuple[str, str]:
    scope = f"{API_PREFIX}/namespaces/{{namespace}}" if res.namespaced else API_PREFIX
    collection = f"{scope}/{res.plural}"
    return collection, f"{collection}/{{name}}"


def refusal_router(res: Resource) -> APIRouter:
    """405 for every write verb on a read-only row, with who writes it (and Allow: GET), but the DELETE of
    one object of a row that lists ``delete`` (served by :func:`read_only_router`)."""
    collection, item = _paths(res)
    router = APIRouter(tags=[res.plural])
    methods = [m for m in WRITE_METHODS if m != "DELETE" or "delete" not in res.verbs]

    @router.api_route(collection, methods=["POST", "DELETE"], name=f"write {res.plural}")
    async def write(request: Request) -> Response:
        raise method_not_allowed(res, request.method)

    @router.api_route(item, methods=methods, name=f"write {res.singular}")
    async def write_one(request: Request) -> Response:
        raise method_not_allowed(res, request.method, item=True)

    return router


def read_only_router(res: Resource, stores: Stores, *, max_body_bytes: int) -> APIRouter:
    """List and get of one row (cluster-scoped or namespaced), every object through its redaction; and
    delete where its verbs list it."""
    store = stores[res.plural]
    collection, item = _paths(res)
    router = APIRouter(tags=[res.plural])

    def _namespace(request: Request) -> str | None:
        if not res.namespaced:
            return None
        namespace = str(request.path_params["namespace"])
        check_namespace(namespace)
        return namespace

    @router.get(collection, name=f"list {res.plural}")
    async def list_(request: Request, query: PageQ) -> Response:
        return await serve_list(request, res, store, _namespace(request), query)

    @router.get(item, name=f"get {res.singular}")
    async def get(request: Request, name: str) -> Response:
        namespace = _namespace(request)
        await authorize(request, "get", res.plural, namespace)
        check_name(res, name, namespace)
        with store_errors(res, namespace or "", name):
            obj = await store.get(namespace, name)
        return object_response(res.redact(obj))

    if "delete" not in res.verbs:
        return router

    @router.delete(item, name=f"delete {res.singular}")
    async def delete(
        request: Request, name: str, propagation_policy: PropagationQ = None, dry_run: DryRunQ = None
    ) -> Response:
        namespace = _namespace(request)
        await authorize(request, "delete", res.plural, namespace)
        check_name(res, name, namespace)
        body = await bodies.read_body(request, max_body_bytes)  # DeleteOptions: kubectl sends one
        parsed = bodies.parse(body, bodies.media_type(request)) if body.strip() else None
        options = delete_options(propagation_policy, parsed)
        with store_errors(res, namespace or "", name):
            deleted = await delete_object(res, stores, namespace, name, options, dry_run=dry_run_of(dry_run))
        # Kubernetes returns the deleted object for custom resources (with its deletionTimestamp).
        return object_response(res.redact(deleted))

    return router


def cluster_routers(stores: Stores, *, max_body_bytes: int) -> list[APIRouter]:
    """The routers of this module, in the order their routes are matched: 405s for every read-only row,
    list and get (and delete where allowed) for the rows it serves."""
    routers = []
    for res in RESOURCES:
        if res.read_only:
            routers.append(refusal_router(res))
        if res.served_by == "clusterrouting":
            routers.append(read_only_router(res, stores, max_body_bytes=max_body_bytes))
    return routers
