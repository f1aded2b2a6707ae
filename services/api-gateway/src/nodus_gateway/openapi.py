"""The API's OpenAPI documents, in Kubernetes' shape: /openapi/v2 (Swagger 2.0) and /openapi/v3 (3.0).

kubectl reads them: ``explain`` walks the v3 schema of a kind, and create/apply ask the v3 document
whether the server validates fields itself (a PATCH operation of the kind that takes ``fieldValidation``).
Other clients generate code from them, and the property tests (and schemathesis in CI) check every
response against them, so they must be exact:

* the component schemas are generated from the msgspec wire types the gateway encodes, so a field added
  to a type is documented by the same change (openapischemas.py);
* the paths are read from the app's routes at request time, so a route added anywhere (another module,
  another router) is documented without a change here, and nothing is documented that is not served
  (openapipaths.py: one operation per route and method);
* every error response is the Status schema (ADR-028: no error leaves the gateway in another shape).

This module renders those operations and schemas in each dialect, assembles the documents and serves them.
As in Kubernetes, /openapi/v3 is an index of one document per group version (``apis/nodus.dev/v1``)
and per other path root (``version``, ``apis``, ``healthz``...), each with a content hash in its URL.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Final

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from nodus_gateway import discovery
from nodus_gateway.openapipaths import Operation, Param, operations
from nodus_gateway.openapischemas import JSON, Components, Schema, components
from nodus_gateway.responding import ApiError, object_response
from nodus_gateway.system import VERSION

REF_V3: Final = "#/components/schemas/{name}"
REF_V2: Final = "#/definitions/{name}"
PROTOBUF_V2: Final = "application/com.github.proto-openapi.spec.v2"
SECURITY: Final = "BearerToken"


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
