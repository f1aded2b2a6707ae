"""The API's OpenAPI documents, in Kubernetes' shape: /openapi/v2 (Swagger 2.0) and /openapi/v3 (3.0).

kubectl reads them: ``explain`` walks the v3 schema of a kind, and create/apply ask the v3 document
whether the server validates fields itself (a PATCH operation of the kind that takes ``fieldValidation``).
Other clients generate code from them, and the property tests (and schemathesis in CI) check every
response against them, so they must be exact:

* the component schemas are generated from the msgspec wire types the gateway encodes, so a field added
  to a type is documented by the same change;
* the paths are read from the app's routes at request time, so a route added anywhere (another module,
  another router) is documented without a change here, and nothing is documented that is not served;
* every error response is the Status schema (ADR-028: no error leaves the gateway in another shape).

As in Kubernetes, /openapi/v3 is an index of one document per group version (``apis/nodus.dev/v1``)
and per other path root (``version``, ``apis``, ``healthz``...), each with a content hash in its URL.
"""

from __future__ import annotations

import hashlib
import json
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from nodus_gateway import discovery
from nodus_gateway.discovery import API_PREFIX, ResourceRoute
from nodus_gateway.openapischemas import (
    ADMIN_KINDS,
    CSV,
    GROUP_VERSION_KIND,
    JSON,
    PROJECT_VIEWS,
    SUBRESOURCE_VIEWS,
    Components,
    Schema,
    View,
    components,
)
from nodus_gateway.resources import Resource
from nodus_gateway.responding import ApiError, object_response
from nodus_gateway.system import VERSION
from nodus_schema import API_GROUP, list_kind

Ref = Callable[[str], Schema]

REF_V3: Final = "#/components/schemas/{name}"
REF_V2: Final = "#/definitions/{name}"
YAML: Final = "application/yaml"
TABLE: Final = "application/json;as=Table;g=meta.k8s.io;v=v1"
WATCH_STREAM: Final = "application/json;stream=watch"
PATCH_TYPES: Final = (
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
)
PROTOBUF_V2: Final = "application/com.github.proto-openapi.spec.v2"
SECURITY: Final = "BearerToken"
_PATH_PARAM: Final = re.compile(r"\{(\w+)(?::\w+)?\}")

PARAMETER_DOCS: Final = {
    "namespace": "The project (Kubernetes namespace) of the objects.",
    "name": "The object's name.",
    "labelSelector": "Only the objects whose labels match (Kubernetes label selector syntax).",
    "fieldSelector": "Only the objects whose fields match (metadata.name, metadata.namespace).",
    "limit": "At most this many objects; 0 means no limit. metadata.continue pages on.",
    "continue": "The continue token of the previous page (metadata.continue).",
    "watch": "Stream ADDED, MODIFIED and DELETED events (newline-delimited WatchEvents) instead of listing.",
    "resourceVersion": "The resourceVersion to list or watch from.",
    "includeObject": "What each row of a Table carries: None, Metadata (the default) or Object.",
    "month": "A UTC month, YYYY-MM (usage: every month when left out).",
    "format": "json (the default) or csv; without it, an Accept header listing text/csv first asks for CSV.",
    "Idempotency-Key": "Names the grant when the body has no id: a retry with the same key counts once.",
    "fieldValidation": (
        "Kubernetes' field validation directive, for unknown and duplicate fields: Strict (the default: "
        "an error naming each), Warn (accepted, each named in a Warning header) or Ignore (dropped; the "
        "last of duplicates wins)."
    ),
}


# ---------------------------------------------------------------------------------------------------------
# Operations, from the routes
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Param:
    name: str
    where: str
    schema: Schema
    required: bool = False
    description: str = ""


@dataclass
class Body:
    schema: Schema
    media_types: tuple[str, ...]
    required: bool = True


@dataclass
class Operation:
    path: str
    method: str
    operation_id: str
    description: str
    tags: list[str]
    params: list[Param]
    replies: dict[str, dict[str, Schema]]
    """Code → media type → schema; "default" is every error."""
    body: Body | None = None
    extensions: dict[str, Any] = field(default_factory=dict)
    public: bool = False


def _camel(text: str) -> str:
    words = re.split(r"[^A-Za-z0-9]+", text)
    return "".join(w[:1].upper() + w[1:] for w in words if w)


def _annotation_schema(annotation: Any) -> Schema:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return _annotation_schema(args[0]) if len(args) == 1 else {}
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, set):
        return {"type": "array", "items": _annotation_schema(args[0]) if args else {}}
    scalar = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return {"type": scalar[annotation]} if annotation in scalar else {"type": "string"}


def _query_params(route: Any) -> list[Param]:
    out: list[Param] = []
    seen: set[str] = set()
    for f in _query_fields(getattr(route, "dependant", None)):
        if f.alias in seen:
            continue
        seen.add(f.alias)
        schema = _annotation_schema(f.field_info.annotation)
        for m in getattr(f.field_info, "metadata", None) or []:
            for attr, key in (("ge", "minimum"), ("le", "maximum")):
                if getattr(m, attr, None) is not None:
                    schema[key] = getattr(m, attr)
        out.append(
            Param(f.alias, "query", schema, f.field_info.is_required(), PARAMETER_DOCS.get(f.alias, ""))
        )
    return out


def _query_fields(dependant: Any) -> Iterable[Any]:
    """The query parameters of a route, those its dependencies declare (a shared list query) included."""
    if dependant is None:
        return
    yield from getattr(dependant, "query_params", None) or []
    for sub in getattr(dependant, "dependencies", None) or []:
        yield from _query_fields(sub)


def _path_params(path: str) -> list[Param]:
    return [
        Param(n, "path", {"type": "string"}, True, PARAMETER_DOCS.get(n, ""))
        for n in _PATH_PARAM.findall(path)
    ]


def _errors(public: bool, ref: Ref) -> dict[str, dict[str, Schema]]:
    errors = {"default": {JSON: ref("Status")}}
    return errors if public else {"401": {JSON: ref("Status")}, **errors}


def _operation_id(name: str, method: str, path: str) -> str:
    """``getCoreAPIVersions`` from a descriptive route name ("get core API versions"), else from the
    method and path (``getHealthz``), lower camel case as Kubernetes' operation ids are."""
    words = name if " " in name else f"{method} {_PATH_PARAM.sub('', path)}"
    text = _camel(words)
    return text[:1].lower() + text[1:]


def _plain_operation(route: Any, path: str, method: str, c: Components, ref: Ref, public: bool) -> Operation:
    """A route outside the resource API: discovery, version, health, OpenAPI, the admin endpoints, and
    whatever else is served."""
    known: dict[str, dict[str, Schema]] = {
        "/healthz": {"text/plain": {"type": "string"}},
        "/livez": {"text/plain": {"type": "string"}},
        "/readyz": {"text/plain": {"type": "string"}},
        "/version": {JSON: ref("Info")},
        "/api": {JSON: ref("APIVersions")},
        "/api/v1": {JSON: ref("APIResourceList")},
        "/api/v1/namespaces/{namespace}": {JSON: ref("Namespace")},
        "/apis": {JSON: ref("APIGroupList")},
        f"/apis/{API_GROUP}": {JSON: ref("APIGroup")},
        API_PREFIX: {JSON: ref("APIResourceList")},
        "/openapi/v2": {JSON: {"type": "object"}},
        "/openapi/v3": {JSON: {"type": "object"}},
        "/openapi/v3/{key}": {JSON: {"type": "object"}},
    }
    code = str(getattr(route, "status_code", None) or 200)
    reply = known.get(path, {JSON: {}})
    body: Body | None = None
    admin = _admin_kind(path)
    if admin is not None:
        (obj, lst), item = admin
        listed = method == "GET" and not item
        reply = {JSON: ref(c.names[lst if listed else obj])}
        if method == "POST":
            body = Body(ref(c.names[obj]), (JSON, YAML))
    params = _path_params(path) + _query_params(route)
    view = _project_view(path)
    if view is not None:
        reply = _view_reply(view, c, ref)
        if view.body is not None:
            body = Body(ref(c.names[view.body]), (JSON, YAML))
            params.append(
                Param(
                    "Idempotency-Key", "header", {"type": "string"}, False, PARAMETER_DOCS["Idempotency-Key"]
                )
            )
    return Operation(
        path=path,
        method=method,
        operation_id=_operation_id(route.name or "", method, path),
        description=(getattr(route, "description", "") or route.name or "").strip(),
        tags=[str(t) for t in getattr(route, "tags", []) or []],
        params=params,
        replies={code: reply, **_errors(public, ref)},
        body=body,
        public=public,
    )


def _view_reply(view: View, c: Components, ref: Ref) -> dict[str, Schema]:
    """What a view answers: its type as JSON, and a CSV string where it serves one."""
    return {JSON: ref(c.names[view.reply])} | ({CSV: {"type": "string"}} if view.csv else {})


def _project_view(path: str) -> View | None:
    """The view a project path serves (``/apis/nodus.dev/v1/namespaces/{namespace}/account``), else None."""
    prefix = f"{API_PREFIX}/namespaces/{{namespace}}/"
    return PROJECT_VIEWS.get(path[len(prefix) :]) if path.startswith(prefix) else None


def _admin_kind(path: str) -> tuple[tuple[type[Any], type[Any]], bool] | None:
    """The kind an admin path serves (``/apis/nodus.dev/v1/projects[/{name}]``), and whether it is one
    object's path; None for any other path."""
    if not path.startswith(API_PREFIX + "/"):
        return None
    segments = path[len(API_PREFIX) + 1 :].split("/")
    if segments[0] not in ADMIN_KINDS or segments[1:] not in ([], ["{name}"]):
        return None
    return ADMIN_KINDS[segments[0]], len(segments) == 2


_ACTIONS: Final = {
    # (item, method) → (verb for the operation id, x-kubernetes-action)
    (False, "GET"): ("list", "list"),
    (False, "POST"): ("create", "post"),
    (False, "DELETE"): ("deletecollection", "deletecollection"),
    (True, "GET"): ("read", "get"),
    (True, "PUT"): ("replace", "put"),
    (True, "PATCH"): ("patch", "patch"),
    (True, "DELETE"): ("delete", "delete"),
}


def _resource_operation(
    route: Any, path: str, method: str, shape: ResourceRoute, c: Components, ref: Ref
) -> Operation:
    res = shape.resource
    obj, lst = ref(c.names[res.object_type]), ref(c.names[res.list_type])
    verb, action = (
        ("watch", "watch") if shape.watch else _ACTIONS.get((shape.item, method), (method.lower(), ""))
    )
    scope = "Namespaced" if shape.namespaced else ""
    suffix = _camel(shape.subresource or "") + ("ForAllNamespaces" if _all_namespaces(res, shape) else "")
    params = _path_params(path) + _query_params(route)
    declared = {p.name for p in params}
    replies = _resource_replies(shape, method, res, obj, lst, ref)
    body: Body | None = None
    if _refused(res, shape, method):
        # Served only to say so: 405 with who writes the resource, whatever the body.
        replies = {"405": {JSON: ref("Status")}, **_errors(False, ref)}
    elif method in ("POST", "PUT"):
        body = Body(obj, (JSON, YAML))
    elif method == "PATCH":
        body = Body(ref("Patch"), _patch_types(res))
    elif method == "DELETE" and shape.item:
        body = Body(ref("DeleteOptions"), (JSON,), required=False)
    extra = []
    if method in ("POST", "PUT", "PATCH"):
        extra.append(
            Param("fieldValidation", "query", {"type": "string", "enum": ["Ignore", "Warn", "Strict"]})
        )
    if method == "GET" and shape.subresource is None and not shape.watch:
        extra.append(
            Param("includeObject", "query", {"type": "string", "enum": ["None", "Metadata", "Object"]})
        )
    for p in extra:
        if p.name not in declared:
            p.description = PARAMETER_DOCS[p.name]
            params.append(p)
    kind = res.kind if shape.item or method != "GET" else list_kind(res.kind)
    view = SUBRESOURCE_VIEWS.get((res.plural, shape.subresource or "")) if method == "GET" else None
    if view is not None:
        replies = {"200": _view_reply(view, c, ref), **_errors(False, ref)}
        kind = view.reply.__name__
    return Operation(
        path=path,
        method=method,
        operation_id=f"{verb}{_camel(API_GROUP)}{_camel(discovery.VERSION)}{scope}{res.kind}{suffix}",
        description=(getattr(route, "description", "") or route.name or "").strip(),
        tags=[f"{API_GROUP}_{discovery.VERSION}"],
        params=params,
        replies=replies,
        body=body,
        extensions={
            "x-kubernetes-action": action or verb,
            GROUP_VERSION_KIND: {"group": API_GROUP, "kind": res.kind, "version": discovery.VERSION},
            "x-nodus-response-kind": kind,
        },
    )


def _refused(res: Resource, shape: ResourceRoute, method: str) -> bool:
    """Whether the route answers this method with 405 whatever is sent: a write of a read-only resource
    (attempts, nodes and offerings are written by Nodus' services), a write of a status subresource (the
    controllers' alone, ADR-0012), or a verb the resource's row does not list."""
    if shape.watch:
        return "watch" not in res.verbs
    if shape.subresource == "status":
        return method != "GET"
    verb = (discovery.ITEM_VERBS if shape.item else discovery.COLLECTION_VERBS).get(method)
    return verb is None or verb not in res.verbs


def _patch_types(res: Resource) -> tuple[str, ...]:
    # Secrets take merge and JSON patches only (secreting.py); the generic routes take all three.
    if res.served_by == "secreting":
        return tuple(t for t in PATCH_TYPES if t != "application/apply-patch+yaml")
    return PATCH_TYPES


def _all_namespaces(res: Resource, shape: ResourceRoute) -> bool:
    return not shape.namespaced and bool(getattr(res, "namespaced", True)) and not shape.item


def _resource_replies(
    shape: ResourceRoute, method: str, res: Resource, obj: Schema, lst: Schema, ref: Ref
) -> dict[str, dict[str, Schema]]:
    errors = _errors(False, ref)
    table = ref("Table")
    if shape.watch:
        return {"200": {JSON: ref("WatchEvent"), WATCH_STREAM: ref("WatchEvent")}, **errors}
    if method == "GET" and not shape.item:
        listed = {JSON: lst, TABLE: table}
        if "watch" in (getattr(res, "verbs", None) or ()):
            listed[WATCH_STREAM] = ref("WatchEvent")
        return {"200": listed, **errors}
    if method == "GET":
        return {"200": {JSON: obj} if shape.subresource else {JSON: obj, TABLE: table}, **errors}
    if method == "POST":
        return {code: {JSON: obj} for code in ("200", "201", "202")} | errors
    if method in ("PUT", "PATCH"):
        return {code: {JSON: obj} for code in ("200", "201")} | errors
    if method == "DELETE" and shape.item:
        # The deleted object (what custom resources return), or a Status when nothing is left to show.
        either = {"anyOf": [obj, ref("Status")]}
        return {code: {JSON: either} for code in ("200", "202")} | errors
    if method == "DELETE":
        return {"200": {JSON: {"anyOf": [lst, ref("Status")]}}, **errors}
    return {"200": {JSON: {}}, **errors}


def operations(app: FastAPI, c: Components, ref: Ref) -> list[Operation]:
    """One operation per route and method the app serves (HEAD left out), with unique operation ids."""
    known = discovery.resources_by_plural()
    public = _public_paths()
    out: list[Operation] = []
    seen: set[str] = set()
    for route in discovery.http_routes(app):
        path = _PATH_PARAM.sub(r"{\1}", getattr(route, "path_format", None) or route.path)
        shape = discovery.classify(path, known)
        for method in sorted(m for m in route.methods or () if m != "HEAD"):
            if shape is not None:
                op = _resource_operation(route, path, method, shape, c, ref)
            else:
                op = _plain_operation(route, path, method, c, ref, path.rstrip("/") in public)
            media = _text_media(route)
            if media is not None and path not in _TEXT_PATHS:  # a route that answers text (a Job's log)
                op.replies = {**op.replies, "200": {media: {"type": "string"}}}
            op.operation_id = _unique(op.operation_id, seen)
            out.append(op)
    return out


_TEXT_PATHS: Final = ("/healthz", "/livez", "/readyz")  # documented with their own schema above


def _text_media(route: Any) -> str | None:
    """``text/plain`` for a route declared with a text response class, else None."""
    media = getattr(getattr(route, "response_class", None), "media_type", None)
    return media if isinstance(media, str) and media.startswith("text/") else None


def _unique(operation_id: str, seen: set[str]) -> str:
    candidate, n = operation_id, 2
    while candidate in seen:
        candidate, n = f"{operation_id}{n}", n + 1
    seen.add(candidate)
    return candidate


def _public_paths() -> frozenset[str]:
    # The paths open without a token are the authentication module's to say.
    from nodus_gateway import auth

    return frozenset(getattr(auth, "PUBLIC_PATHS", ()))


# ---------------------------------------------------------------------------------------------------------
# The documents
# ---------------------------------------------------------------------------------------------------------


def _ref3(name: str) -> Schema:
    return {"$ref": REF_V3.format(name=name)}


def _ref2(name: str) -> Schema:
    return {"$ref": REF_V2.format(name=name)}


def _operation_v3(op: Operation) -> Schema:
    out: Schema = {"operationId": op.operation_id, "description": op.description, "tags": op.tags}
    if op.params:
        out["parameters"] = [_param_v3(p) for p in op.params]
    if op.body is not None:
        content = {t: {"schema": op.body.schema} for t in op.body.media_types}
        out["requestBody"] = {"required": op.body.required, "content": content}
    out["responses"] = {
        code: {"description": _describe(code), "content": {t: {"schema": s} for t, s in media.items()}}
        for code, media in op.replies.items()
    }
    if op.public:
        out["security"] = []
    return {**out, **op.extensions}


def _param_v3(p: Param) -> Schema:
    out: Schema = {"name": p.name, "in": p.where, "schema": p.schema}
    if p.required:
        out["required"] = True
    if p.description:
        out["description"] = p.description
    return out


def _describe(code: str) -> str:
    return {
        "200": "OK",
        "201": "Created",
        "202": "Accepted",
        "401": "Unauthorized (a Status)",
        "405": "MethodNotAllowed (a Status): this is not written through the API",
        "default": "An error, always a Status",
    }.get(code, "")


def _operation_v2(op: Operation) -> Schema:
    out: Schema = {"operationId": op.operation_id, "description": op.description, "tags": op.tags}
    params = [_param_v2(p) for p in op.params]
    if op.body is not None:
        out["consumes"] = list(op.body.media_types)
        params.append({"name": "body", "in": "body", "required": op.body.required, "schema": op.body.schema})
    if params:
        out["parameters"] = params
    out["produces"] = sorted({t for media in op.replies.values() for t in media})
    out["responses"] = {code: _reply_v2(code, media) for code, media in op.replies.items()}
    if op.public:
        out["security"] = []
    return {**out, **op.extensions}


def _param_v2(p: Param) -> Schema:
    out: Schema = {"name": p.name, "in": p.where, **(p.schema or {"type": "string"})}
    if p.required:
        out["required"] = True
    if p.description:
        out["description"] = p.description
    return out


def _reply_v2(code: str, media: dict[str, Schema]) -> Schema:
    # Swagger 2.0 has one schema per response: the JSON one (the others are alternate encodings).
    schema = media.get(JSON) or next(iter(media.values()), {})
    out: Schema = {"description": _describe(code)}
    if schema:
        out["schema"] = _v2_schema(schema)
    return out


def _v2_schema(schema: Schema) -> Schema:
    return {k: v for k, v in schema.items() if k != "anyOf"} if "anyOf" in schema else schema


def _paths(ops: Iterable[Operation], render: Callable[[Operation], Schema]) -> dict[str, Schema]:
    paths: dict[str, Schema] = {}
    for op in ops:
        paths.setdefault(op.path, {})[op.method.lower()] = render(op)
    return dict(sorted(paths.items()))


def _info() -> Schema:
    return {
        "title": "Nodus",
        "description": "The nodus.dev/v1 API: Sweeps, Jobs and what runs them, Kubernetes-shaped.",
        "version": VERSION,
    }


def swagger_v2(app: FastAPI) -> Schema:
    """The whole API as one Swagger 2.0 document, as the kube-apiserver serves /openapi/v2."""
    c = components(REF_V2, v2=True)
    return {
        "swagger": "2.0",
        "info": _info(),
        "paths": _paths(operations(app, c, _ref2), _operation_v2),
        "definitions": c.schemas,
        "securityDefinitions": {
            SECURITY: {"type": "apiKey", "name": "authorization", "in": "header", "description": _TOKEN_DOC}
        },
        "security": [{SECURITY: []}],
    }


_TOKEN_DOC: Final = "Bearer token authentication: `Authorization: Bearer <token>`."


def document_key(path: str) -> str:
    """The /openapi/v3 document a path belongs to, as Kubernetes groups them: a group version
    (``apis/nodus.dev/v1``), a group (``apis/nodus.dev``), ``api/v1``, or the path's first segment."""
    segments = [s for s in path.split("/") if s]
    if not segments:
        return ""
    if segments[0] == "apis" and len(segments) >= 2:
        return "/".join(segments[:3])
    if segments[0] == "api" and len(segments) >= 2:
        return "/".join(segments[:2])
    return segments[0]


def openapi_v3(app: FastAPI) -> dict[str, Schema]:
    """Every /openapi/v3 document, by key."""
    c = components(REF_V3, v2=False)
    grouped: dict[str, list[Operation]] = {}
    for op in operations(app, c, _ref3):
        grouped.setdefault(document_key(op.path), []).append(op)
    return {key: _document_v3(ops, c) for key, ops in sorted(grouped.items())}


def _document_v3(ops: list[Operation], c: Components) -> Schema:
    return {
        "openapi": "3.0.0",
        "info": _info(),
        "paths": _paths(ops, _operation_v3),
        "components": {
            "schemas": c.schemas,
            "securitySchemes": {
                SECURITY: {"type": "http", "scheme": "bearer", "description": _TOKEN_DOC},
            },
        },
        "security": [{SECURITY: []}],
    }


def _hash(doc: Schema) -> str:
    # Kubernetes' hash is the SHA-512 of the document, upper-case hex; clients cache by it.
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest().upper()


def index_v3(docs: dict[str, Schema]) -> Schema:
    return {
        "paths": {
            key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={_hash(doc)}"} for key, doc in docs.items()
        }
    }


# ---------------------------------------------------------------------------------------------------------
# Routes
# ---------------------------------------------------------------------------------------------------------


class _Cache:
    """The documents of the routes as they are: rebuilt only when the set of routes changes."""

    def __init__(self) -> None:
        self._key: tuple[tuple[str, frozenset[str]], ...] | None = None
        self._v2: Schema = {}
        self._v3: dict[str, Schema] = {}

    def _refresh(self, app: FastAPI) -> None:
        key = tuple(discovery.served_routes(app))
        if key != self._key:
            self._v2, self._v3, self._key = swagger_v2(app), openapi_v3(app), key

    def v2(self, app: FastAPI) -> Schema:
        self._refresh(app)
        return self._v2

    def v3(self, app: FastAPI) -> dict[str, Schema]:
        self._refresh(app)
        return self._v3


def _app(request: Request) -> FastAPI:
    app = request.app
    assert isinstance(app, FastAPI)
    return app


def _accepts_json(accept: str) -> bool:
    if not accept.strip():
        return True
    ranges = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    return any(r in (JSON, "application/*", "*/*") for r in ranges)


def openapi_router() -> APIRouter:
    router = APIRouter(tags=["openapi"])
    cache = _Cache()

    @router.get("/openapi/v2", name="get OpenAPI v2 document")
    async def v2(request: Request) -> Response:
        # client-go asks for the protobuf encoding first; only JSON is served, so say so rather than send
        # JSON to a protobuf decoder.
        if not _accepts_json(request.headers.get("accept", "")):
            raise ApiError.of(
                "NotAcceptable",
                "only application/json is served for /openapi/v2",
                fix="Ask for Accept: application/json, or read /openapi/v3 (kubectl explain does).",
            )
        return object_response(cache.v2(_app(request)))

    @router.get("/openapi/v3", name="get OpenAPI v3 index")
    async def v3_index(request: Request) -> Response:
        return object_response(index_v3(cache.v3(_app(request))))

    @router.get("/openapi/v3/{key:path}", name="get OpenAPI v3 document")
    async def v3_document(key: str, request: Request) -> Response:
        docs = cache.v3(_app(request))
        if key.strip("/") not in docs:
            raise ApiError.of(
                "NotFound",
                f'no OpenAPI v3 document "{key}"',
                fix="GET /openapi/v3 lists the documents (apis/nodus.dev/v1 holds the resources).",
            )
        return object_response(docs[key.strip("/")])

    return router
