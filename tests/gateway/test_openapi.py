"""/openapi/v2 and /openapi/v3: every served route documented, and every response as documented.

schemathesis runs in CI against a live gateway; here a property-style check does the same for every GET
that needs no object name: call it, and validate the body against the schema the document declares for
that status code and content type. jsonschema is not a dependency, so a small validator of the subset the
documents use (type, nullable, properties, required, items, additionalProperties, enum, anyOf, allOf, $ref)
does the checking.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from fastapi import FastAPI

from nodus_gateway.discovery import served_routes

TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1"
TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def violations(value: Any, schema: dict[str, Any], schemas: dict[str, Any], at: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema`` (OpenAPI 3.0 dialect); empty when it conforms."""
    if "$ref" in schema:
        return violations(value, schemas[schema["$ref"].rsplit("/", 1)[-1]], schemas, at)
    if value is None:
        return [] if schema.get("nullable") or not schema.get("type") else [f"{at}: null"]
    found = [v for sub in schema.get("allOf", []) for v in violations(value, sub, schemas, at)]
    if "anyOf" in schema and all(violations(value, sub, schemas, at) for sub in schema["anyOf"]):
        found.append(f"{at}: matches none of anyOf")
    kind = schema.get("type")
    # bool is an int in Python, never in JSON.
    if kind and (not isinstance(value, TYPES[kind]) or (isinstance(value, bool) and kind != "boolean")):
        return [*found, f"{at}: {type(value).__name__} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{at}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        found += [f"{at}.{k}: required" for k in schema.get("required", []) if k not in value]
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if k in props:
                found += violations(v, props[k], schemas, f"{at}.{k}")
            elif isinstance(extra, dict):
                found += violations(v, extra, schemas, f"{at}.{k}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += violations(item, schema["items"], schemas, f"{at}[{i}]")
    return found


def test_the_validator_catches_what_it_should() -> None:
    schemas = {"X": {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}}
    assert violations({"a": 1}, {"$ref": "#/components/schemas/X"}, schemas) == []
    assert violations({}, {"$ref": "#/c/X"}, schemas) == ["$.a: required"]
    assert violations({"a": "1"}, {"$ref": "#/c/X"}, schemas) == ["$.a: str is not integer"]
    assert violations({"a": True}, {"$ref": "#/c/X"}, schemas) == ["$.a: bool is not integer"]
    assert violations(None, {"type": "string", "nullable": True}, schemas) == []
    assert violations(3, {"anyOf": [{"type": "string"}, {"type": "array"}]}, schemas)


async def get_json(api: httpx.AsyncClient, path: str, **headers: str) -> Any:
    resp = await api.get(path, headers=headers)
    assert resp.status_code == 200, resp.text
    return json.loads(resp.content)


async def v3_documents(api: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    index = await get_json(api, "/openapi/v3")
    docs = {}
    for key, entry in index["paths"].items():
        url = entry["serverRelativeURL"]
        assert re.fullmatch(rf"/openapi/v3/{re.escape(key)}\?hash=[0-9A-F]{{128}}", url), url
        docs[key] = await get_json(api, url)
    return docs


async def test_v3_index_has_the_group_version_document(api: httpx.AsyncClient) -> None:
    docs = await v3_documents(api)
    doc = docs["apis/nodus.dev/v1"]
    assert doc["openapi"].startswith("3.0")
    sweep = doc["components"]["schemas"]["Sweep"]
    assert sweep["x-kubernetes-group-version-kind"] == [
        {"group": "nodus.dev", "kind": "Sweep", "version": "v1"}
    ]
    assert (
        doc["components"]["schemas"]["SweepList"]["x-kubernetes-group-version-kind"][0]["kind"] == "SweepList"
    )
    spec = doc["components"]["schemas"]["SweepSpec"]["properties"]
    # Field docs come from the types' source, so kubectl explain has something to say.
    assert spec["maxParallel"]["type"] == "integer"
    assert "1 to 256" in spec["maxParallel"]["description"]


async def test_every_route_and_verb_is_documented(api: httpx.AsyncClient, app: FastAPI) -> None:
    docs = await v3_documents(api)
    documented = {
        (path, method.upper())
        for doc in docs.values()
        for path, item in doc["paths"].items()
        for method in item
    }
    served = {
        (re.sub(r"\{(\w+):\w+\}", r"{\1}", path), method)
        for path, methods in served_routes(app)
        for method in methods
    }
    assert served - documented == set()
    assert documented - served == set()


async def test_every_operation_is_well_formed(api: httpx.AsyncClient) -> None:
    ids = []
    for doc in (await v3_documents(api)).values():
        schemas = doc["components"]["schemas"]
        for path, item in doc["paths"].items():
            for method, op in item.items():
                ids.append(op["operationId"])
                params = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
                assert params == set(re.findall(r"\{(\w+)\}", path)), (method, path)
                # Every error is a Status (ADR-028), whatever the route.
                assert op["responses"]["default"]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Status"
                }
                refs = re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(op))
                assert set(refs) <= set(schemas), (method, path)
                if path.startswith("/apis/nodus.dev/v1/") and "x-kubernetes-action" in op:
                    assert op["x-kubernetes-group-version-kind"]["group"] == "nodus.dev"
    assert len(ids) == len(set(ids))


async def test_create_and_patch_declare_server_side_field_validation(api: httpx.AsyncClient) -> None:
    # kubectl skips its own (protobuf /openapi/v2) validation when the PATCH of the kind takes
    # fieldValidation: the server validates strictly.
    doc = (await v3_documents(api))["apis/nodus.dev/v1"]
    item = doc["paths"]["/apis/nodus.dev/v1/namespaces/{namespace}/sweeps/{name}"]
    assert "patch" in item, "PATCH of a Sweep must be in the OpenAPI document"
    assert "fieldValidation" in {p["name"] for p in item["patch"]["parameters"]}
    assert item["patch"]["x-kubernetes-group-version-kind"] == {
        "group": "nodus.dev",
        "kind": "Sweep",
        "version": "v1",
    }


async def test_v2_is_swagger_2_and_protobuf_is_refused(api: httpx.AsyncClient) -> None:
    doc = await get_json(api, "/openapi/v2", Accept="application/json")
    assert doc["swagger"] == "2.0"
    assert doc["definitions"]["Sweep"]["x-kubernetes-group-version-kind"][0]["kind"] == "Sweep"
    assert "/apis/nodus.dev/v1/namespaces/{namespace}/sweeps" in doc["paths"]
    # Swagger 2.0 has no anyOf and no null type: none may be left in.
    text = json.dumps(doc)
    assert '"anyOf"' not in json.dumps(doc["definitions"]) and '"nullable"' not in text
    proto = await api.get(
        "/openapi/v2", headers={"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"}
    )
    assert proto.status_code == 406 and proto.json()["reason"] == "NotAcceptable"


async def test_an_unknown_v3_document_is_a_not_found_status(api: httpx.AsyncClient) -> None:
    resp = await api.get("/openapi/v3/apis/example.com/v1")
    assert resp.status_code == 404 and resp.json()["kind"] == "Status"


def _declared(op: dict[str, Any], code: int, media: str) -> dict[str, Any] | None:
    reply = op["responses"].get(str(code)) or op["responses"].get("default")
    if reply is None:
        return None
    content = reply.get("content", {})
    schema = content.get(media)
    return schema["schema"] if schema else None


async def test_every_get_answers_as_documented(api: httpx.AsyncClient, unique: str) -> None:
    """The schemathesis property, for every GET that needs no object name: no server error, and a body
    that matches the declared schema of its status code (as JSON, and as a Table where one is declared)."""
    checked = 0
    base = f"/apis/nodus.dev/v1/namespaces/{unique}/sweeps"
    body = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": "lr"},
        "spec": {
            "matrix": {"params": {"LR": ["0.1", "0.01"]}},
            "template": {"spec": {"image": "busybox", "command": ["true"], "resources": {"gpu": "H100:1"}}},
        },
    }
    assert (await api.post(base, json=body)).status_code == 201  # lists with an item in them
    for doc in (await v3_documents(api)).values():
        schemas = doc["components"]["schemas"]
        for path, item in doc["paths"].items():
            op = item.get("get")
            params = set(re.findall(r"\{(\w+)\}", path))
            if op is None or params - {"namespace"} or "watch" in path.split("/"):
                continue
            url = path.replace("{namespace}", unique)
            declared_media = {m for r in op["responses"].values() for m in r.get("content", {})}
            for media in ("application/json", TABLE):
                if media not in declared_media:
                    continue
                resp = await api.get(url, headers={"Accept": media})
                assert resp.status_code < 500, (url, resp.text)
                got = resp.headers["content-type"].split(";")[0]
                if got != "application/json":
                    assert got == "text/plain" and "text/plain" in declared_media, url
                    continue
                schema = _declared(op, resp.status_code, media)
                assert schema is not None, (url, resp.status_code, media)
                assert violations(resp.json(), schema, schemas) == [], (url, media)
                checked += 1
    assert checked >= 10
