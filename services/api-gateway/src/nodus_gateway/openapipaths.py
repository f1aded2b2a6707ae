"""The operations of the OpenAPI documents (openapi.py), read from the app's routes: one per route and
method, with its parameters, request body and replies, whichever document (v2 or v3) renders it.

The paths are read at request time rather than listed, so a route added anywhere (another module, another
router) is documented without a change here, and nothing is documented that is not served. Resource routes
(discovery.classify knows their shape) get Kubernetes' operation ids and extensions; every other route
(discovery, version, health, the admin endpoints, billing's and results' views) is documented from its
path and the views openapischemas.py names. Every error reply is the Status schema (ADR-028).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from fastapi import FastAPI

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
)
from nodus_gateway.resources import Resource
from nodus_schema import API_GROUP, list_kind
from nodus_schema.volumes import Volume

Ref = Callable[[str], Schema]
"""How an operation names a component schema: a $ref in the dialect of the document being built."""

YAML: Final = "application/yaml"
TABLE: Final = "application/json;as=Table;g=meta.k8s.io;v=v1"
WATCH_STREAM: Final = "application/json;stream=watch"
PATCH_TYPES: Final = (
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
)
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
    """One operation per route and method the app serves (HEAD left out), with unique operation ids. A
    route that an earlier one shadows (the same path and method: volumeapi.py's guarded deletes come
    before the generic ones) is never reached, so it is not documented."""
    known = discovery.resources_by_plural()
    public = _public_paths()
    out: list[Operation] = []
    seen: set[str] = set()
    served: set[tuple[str, str]] = set()
    for route in discovery.http_routes(app):
        path = _PATH_PARAM.sub(r"{\1}", getattr(route, "path_format", None) or route.path)
        shape = discovery.classify(path, known)
        for method in sorted(m for m in route.methods or () if m != "HEAD"):
            if (path, method) in served:
                continue
            served.add((path, method))
            if shape is not None:
                op = _resource_operation(route, path, method, shape, c, ref)
            else:
                op = _plain_operation(route, path, method, c, ref, path.rstrip("/") in public)
            media = _text_media(route)
            if media is not None and path not in _TEXT_PATHS:  # a route that answers text (a Job's log)
                op.replies = {**op.replies, "200": {media: {"type": "string"}}}
            _code_and_data(op, c, ref)
            op.operation_id = _unique(op.operation_id, seen)
            out.append(op)
    return out


_TEXT_PATHS: Final = ("/healthz", "/livez", "/readyz")  # documented with their own schema above

# -- code and data (ADR-0036): blobs, Volume revisions, Workspace files -----------------------------------
OCTETS: Final = "application/octet-stream"
_BLOB_REPLY: Final[Schema] = {
    "description": "The blob: its digest and size in bytes.",
    "type": "object",
    "required": ["digest", "sizeBytes"],
    "properties": {"digest": {"type": "string"}, "sizeBytes": {"type": "integer"}},
}
_BLOB_RECORD: Final[Schema] = {
    "description": "The gateway's record of an uploaded blob (kind Blob): spec.sizeBytes, spec.creator, "
    "status.lastUsedTime; the size is also in the X-Nodus-Size header (HEAD answers only that).",
    "type": "object",
}
_REVISION_REQUEST: Final[Schema] = {
    "description": "VolumeRevisionRequest: an uploaded blob of the project becomes the next revision.",
    "type": "object",
    "required": ["digest"],
    "properties": {"digest": {"type": "string", "description": "sha256:<64 lower-case hex digits>"}},
}
_FILE_REPLY: Final[Schema] = {
    "description": "The file written or deleted: its path in the home and its size in bytes.",
    "type": "object",
    "required": ["path", "sizeBytes"],
    "properties": {"path": {"type": "string"}, "sizeBytes": {"type": "integer"}},
}
_FILE_LIST: Final[Schema] = {
    "description": "Files of the home under prefix (a directory), one page; continue pages on.",
    "type": "object",
    "required": ["items"],
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["path", "sizeBytes", "lastModified"],
                "properties": {
                    "path": {"type": "string"},
                    "sizeBytes": {"type": "integer"},
                    "lastModified": {"type": "string"},
                },
            },
        },
        "continue": {"type": "string"},
    },
}
_OCTET_BODY: Final = Body({"type": "string", "format": "binary"}, (OCTETS,))
_CODE_AND_DATA_DOCS: Final = {
    "prefix": "A directory of the home to list (all of it when left out).",
    "path": "A file's path in the Workspace's home (no '..' segments).",
}


def _code_and_data(op: Operation, c: Components, ref: Ref) -> None:
    """The replies and bodies of the routes of blobbing.py, volumeapi.py and workspacefiles.py, which
    neither the generic resource shapes nor a view describe."""
    prefix = f"{API_PREFIX}/namespaces/{{namespace}}/"
    tail = op.path[len(prefix) :] if op.path.startswith(prefix) else ""
    errors = _errors(False, ref)
    key = (tail, op.method)
    if key == ("blobs/{name}", "PUT"):
        op.replies, op.body = {"200": {JSON: _BLOB_REPLY}, "201": {JSON: _BLOB_REPLY}, **errors}, _OCTET_BODY
    elif key == ("blobs/{name}", "GET"):
        op.replies = {"200": {JSON: _BLOB_RECORD}, **errors}
    elif key == ("volumes/{name}/revisions", "POST"):
        op.replies = {"201": {JSON: ref(c.names[Volume])}, **errors}
        op.body = Body(_REVISION_REQUEST, (JSON,))
        # A create of a revision, answered with the Volume (as a POST to a subresource is in Kubernetes).
        op.operation_id = "create" + op.operation_id.removeprefix("post")
        op.extensions.update({"x-kubernetes-action": "post", "x-nodus-response-kind": "Volume"})
    elif key == ("workspaces/{name}/files", "GET"):
        op.replies = {"200": {JSON: _FILE_LIST}, **errors}
    elif key == ("workspaces/{name}/files/{path}", "PUT"):
        op.replies, op.body = {"200": {JSON: _FILE_REPLY}, "201": {JSON: _FILE_REPLY}, **errors}, _OCTET_BODY
    elif key == ("workspaces/{name}/files/{path}", "GET"):
        op.replies = {"200": {OCTETS: {"type": "string", "format": "binary"}}, **errors}
    elif key == ("workspaces/{name}/files/{path}", "DELETE"):
        op.replies = {"200": {JSON: _FILE_REPLY}, **errors}
    else:
        return
    for p in op.params:
        p.description = p.description or _CODE_AND_DATA_DOCS.get(p.name, "")


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
