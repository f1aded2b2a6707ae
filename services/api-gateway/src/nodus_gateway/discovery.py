"""API discovery as Kubernetes serves it: /api, /api/v1, /apis, /apis/nodus.dev and /apis/nodus.dev/v1.

kubectl (and every client-go program) reads these before anything else: they turn ``kubectl get sw`` into
the path of the sweeps collection. The resource list is built at request time from the resource table and
from the routes the app really serves, so a verb or resource added elsewhere shows up without a change
here, and discovery never promises a verb the gateway does not answer.

kubectl 1.32 first asks for aggregated discovery (``as=APIGroupDiscoveryList``); answering with the
legacy documents and a plain ``application/json`` Content-Type makes client-go fall back to them, which is
what kube-apiservers older than 1.26 do too.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from fastapi import APIRouter, FastAPI, Request
from fastapi.routing import iter_route_contexts
from starlette.responses import Response

from nodus_gateway.resources import RESOURCES, Resource
from nodus_gateway.responding import ApiError, object_response
from nodus_schema import API_GROUP, API_VERSION
from nodus_schema.wire import Wire

GROUP_VERSION: Final = API_VERSION
VERSION: Final = GROUP_VERSION.partition("/")[2]
API_PREFIX: Final = f"/apis/{GROUP_VERSION}"
CATEGORIES: Final = ("all", "nodus")

# Kubernetes lists verbs in this order (kubectl api-resources -o wide prints them as given).
VERB_ORDER: Final = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

# Which verb each HTTP method is, on a collection and on one object.
COLLECTION_VERBS: Final = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}
ITEM_VERBS: Final = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_PARAM: Final = re.compile(r"\{[^}]*\}")
# A DNS-1123 label: what a namespace (project) name must be.
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


# ---------------------------------------------------------------------------------------------------------
# The discovery documents (k8s.io/apimachinery/pkg/apis/meta/v1 types, field for field)
# ---------------------------------------------------------------------------------------------------------


class ServerAddressByClientCIDR(Wire):
    """Where clients in a network reach the server (one entry for every client: 0.0.0.0/0)."""

    client_cidr: str = msgspec.field(name="clientCIDR")
    server_address: str


class APIVersions(Wire):
    """The legacy (core) group's versions, as GET /api returns them."""

    versions: list[str]
    server_address_by_client_cidrs: list[ServerAddressByClientCIDR] = msgspec.field(
        name="serverAddressByClientCIDRs"
    )
    kind: str = msgspec.field(default_factory=lambda: "APIVersions")


class GroupVersionForDiscovery(Wire):
    group_version: str
    version: str


class APIGroup(Wire):
    """One API group and its versions, as GET /apis/<group> returns it."""

    name: str
    versions: list[GroupVersionForDiscovery]
    preferred_version: GroupVersionForDiscovery
    api_version: str = msgspec.field(default_factory=lambda: "v1")
    kind: str = msgspec.field(default_factory=lambda: "APIGroup")


class APIGroupList(Wire):
    """Every API group, as GET /apis returns them."""

    groups: list[APIGroup]
    api_version: str = msgspec.field(default_factory=lambda: "v1")
    kind: str = msgspec.field(default_factory=lambda: "APIGroupList")


class APIResource(Wire):
    """One resource (or subresource) of a group version: its names, scope, kind and verbs."""

    name: str
    singular_name: str
    namespaced: bool
    kind: str
    verbs: list[str]
    short_names: list[str] = msgspec.field(default_factory=list)
    categories: list[str] = msgspec.field(default_factory=list)


class APIResourceList(Wire):
    """The resources of one group version, as GET /apis/<group>/<version> returns them."""

    group_version: str
    resources: list[APIResource]
    api_version: str = msgspec.field(default_factory=lambda: "v1")
    kind: str = msgspec.field(default_factory=lambda: "APIResourceList")


DISCOVERY_TYPES: Final = (APIVersions, APIGroupList, APIGroup, APIResourceList)


# ---------------------------------------------------------------------------------------------------------
# What the app serves, read from its routes
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourceRoute:
    """A route of the resource API, understood: which resource, which scope, collection or object."""

    resource: Resource
    namespaced: bool
    item: bool
    subresource: str | None
    watch: bool


def http_routes(app: FastAPI) -> Iterator[Any]:
    """Every HTTP route of the app, those of included routers too (FastAPI keeps them nested)."""
    for route in iter_route_contexts(app.routes):
        if isinstance(route.path, str) and route.methods:
            yield route


def served_routes(app: FastAPI) -> Iterator[tuple[str, frozenset[str]]]:
    """(path, methods) of every HTTP route of the app, HEAD left out (Starlette adds it to every GET)."""
    for route in http_routes(app):
        yield route.path, frozenset(m for m in route.methods or () if m != "HEAD")


def resources_by_plural() -> dict[str, Resource]:
    return {r.plural: r for r in RESOURCES}


def classify(path: str, known: dict[str, Resource] | None = None) -> ResourceRoute | None:
    """What a route path of the resource API is about, or None for any other path.

    ``/apis/nodus.dev/v1[/watch][/namespaces/{namespace}]/<plural>[/{name}[/<subresource>]]``.
    """
    if not path.startswith(API_PREFIX + "/"):
        return None
    known = resources_by_plural() if known is None else known
    segments = _PARAM.sub("{}", path[len(API_PREFIX) + 1 :]).split("/")
    watch = segments[0] == "watch"
    if watch:
        segments = segments[1:]
    namespaced = len(segments) >= 3 and segments[:2] == ["namespaces", "{}"]
    if namespaced:
        segments = segments[2:]
    if not segments or segments[0] not in known or len(segments) > 3:
        return None
    if len(segments) >= 2 and segments[1] != "{}":
        return None
    sub = segments[2] if len(segments) == 3 else None
    return ResourceRoute(known[segments[0]], namespaced, len(segments) >= 2, sub, watch)


def _verbs(methods: Iterable[str], shape: ResourceRoute) -> set[str]:
    if shape.watch:
        return {"watch"}
    table = ITEM_VERBS if shape.item else COLLECTION_VERBS
    return {table[m] for m in methods if m in table}


def _watch_served() -> bool:
    # Watch is a query parameter of the list route (``?watch=true``), so the routes cannot tell whether
    # it is served; the watch module of the verbs work can. A resource row's own ``verbs`` wins anyway.
    return importlib.util.find_spec("nodus_gateway.watching") is not None


def _ordered(verbs: Iterable[str]) -> list[str]:
    rank = {v: i for i, v in enumerate(VERB_ORDER)}
    return sorted(set(verbs), key=lambda v: (rank.get(v, len(rank)), v))


def api_resources(app: FastAPI) -> list[APIResource]:
    """Every resource of nodus.dev/v1 with the verbs its routes serve, then its subresources."""
    known = resources_by_plural()
    verbs: dict[str, set[str]] = {}
    subverbs: dict[tuple[str, str], set[str]] = {}
    namespaced: dict[str, bool] = {}
    for path, methods in served_routes(app):
        shape = classify(path, known)
        if shape is None:
            continue
        plural = shape.resource.plural
        if shape.subresource is not None:
            subverbs.setdefault((plural, shape.subresource), set()).update(_verbs(methods, shape))
            continue
        verbs.setdefault(plural, set()).update(_verbs(methods, shape))
        namespaced[plural] = namespaced.get(plural, False) or shape.namespaced
    out: list[APIResource] = []
    for res in RESOURCES:
        if res.plural not in verbs:
            continue  # a row without routes yet is not served
        scope = _namespaced(res, namespaced[res.plural])
        out.append(_api_resource(res, verbs[res.plural], scope))
        # Subresources follow their resource, as Kubernetes lists them; a row that names its
        # subresources narrows the routes' (generic routes may serve more than the row declares).
        declared = getattr(res, "subresources", None)
        for (plural, sub), sv in sorted(subverbs.items()):
            if plural == res.plural and (declared is None or sub in declared):
                out.append(_subresource(res, sub, sv, scope))
    return out


def _subresource(res: Resource, sub: str, verbs: set[str], namespaced: bool) -> APIResource:
    return APIResource(
        name=f"{res.plural}/{sub}",
        singular_name="",
        namespaced=namespaced,
        kind=res.kind,
        verbs=_ordered(verbs),
    )


def _namespaced(res: Resource, from_routes: bool) -> bool:
    flag = getattr(res, "namespaced", None)
    return from_routes if flag is None else bool(flag)


def _api_resource(res: Resource, route_verbs: set[str], from_routes: bool) -> APIResource:
    declared = getattr(res, "verbs", None)
    verbs = set(declared) if declared else set(route_verbs)
    if not declared and "list" in verbs and _watch_served():
        verbs.add("watch")
    return APIResource(
        name=res.plural,
        singular_name=res.singular,
        namespaced=_namespaced(res, from_routes),
        kind=res.kind,
        verbs=_ordered(verbs),
        short_names=list(getattr(res, "short_names", ()) or ()),
        # A row's own categories, none included (a Budget is in none); CATEGORIES for rows that say nothing.
        categories=list(_categories(res)),
    )


def _categories(res: Resource) -> tuple[str, ...]:
    declared = getattr(res, "categories", None)
    return CATEGORIES if declared is None else tuple(declared)


# ---------------------------------------------------------------------------------------------------------
# The documents and their routes
# ---------------------------------------------------------------------------------------------------------


def _group() -> APIGroup:
    version = GroupVersionForDiscovery(group_version=GROUP_VERSION, version=VERSION)
    return APIGroup(name=API_GROUP, versions=[version], preferred_version=version)


def _address(request: Request) -> str:
    return request.headers.get("host") or f"{request.url.hostname}:{request.url.port or 80}"


def discovery_router() -> APIRouter:
    router = APIRouter(tags=["discovery"])

    @router.get("/api", name="get core API versions")
    async def api(request: Request) -> Response:
        cidr = ServerAddressByClientCIDR(client_cidr="0.0.0.0/0", server_address=_address(request))
        # No core (legacy) version: the gateway serves no core resource, and client-go fails discovery
        # ("received empty response for: v1") when a version it is told of lists no resources. An
        # aggregated API server answers the same way.
        return _discovery(APIVersions(versions=[], server_address_by_client_cidrs=[cidr]))

    @router.get("/api/v1", name="get core API resources")
    async def api_v1() -> Response:
        # Not listed by /api, but answered (empty) rather than 404 for clients that ask anyway.
        return _discovery(APIResourceList(group_version="v1", resources=[]))

    @router.get("/api/v1/namespaces/{namespace}", name="get namespace")
    async def namespace(namespace: str) -> Response:
        # kubectl asks for the namespace after a NotFound, to say "namespace not found" instead when it
        # is the namespace that is missing; a 404 here would replace the object's NotFound message.
        # Projects (namespaces) exist implicitly: any valid name is one.
        if not _LABEL.fullmatch(namespace):
            raise ApiError.of(
                "NotFound", f'namespaces "{namespace}" not found', name=namespace, kind="namespaces"
            )
        return object_response(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace},
                "spec": {},
                "status": {"phase": "Active"},
            }
        )

    @router.get("/apis", name="get API groups")
    async def apis() -> Response:
        return _discovery(APIGroupList(groups=[_group()]))

    @router.get(f"/apis/{API_GROUP}", name="get nodus.dev API group")
    async def group() -> Response:
        return _discovery(_group())

    @router.get(API_PREFIX, name="get nodus.dev/v1 API resources")
    async def resources(request: Request) -> Response:
        app = request.app
        assert isinstance(app, FastAPI)
        return _discovery(APIResourceList(group_version=GROUP_VERSION, resources=api_resources(app)))

    return router


def _discovery(doc: Any) -> Response:
    # Plain application/json whatever the Accept asked: see the module docstring (aggregated discovery).
    return object_response(doc)
