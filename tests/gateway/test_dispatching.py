"""The direct lane (nodus_gateway.dispatching): every route on it, the same answers as FastAPI's own path,
the route FastAPI's router would pick, and no private name of a third-party module anywhere in the gateway."""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from fastapi import APIRouter, Query, Request
from nats.aio.client import Client as NATS
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response

import nodus_gateway
from nodus_gateway.app import build_app
from nodus_gateway.dispatching import Parameters, RouteTable
from nodus_gateway.principals import Principals
from nodus_gateway.querying import QUERIES, LimitQ
from nodus_gateway.resources import stores_for

TOKEN = "test-admin-token-0123456789"
API = "/apis/nodus.dev/v1"


async def test_every_route_of_the_gateway_is_on_the_direct_lane(nc: NATS) -> None:
    # A route FastAPI must serve still works, only slower: this is where a new parameter alias that
    # querying.QUERIES (or its module's QUERIES) does not list shows up.
    app = build_app(stores_for(nc), admin_token=TOKEN, principals=Principals(nc, pepper=b"lane"))
    table = app.state.direct_routes
    assert len(table.routes) > 90
    assert table.indirect() == []


# ---------------------------------------------------------------------------------------------------------
# The same answers on both paths
# ---------------------------------------------------------------------------------------------------------


async def _unused_dependency() -> None:
    """A dependency no route has: overriding it sends every request FastAPI's way, changing nothing else."""


def _answer(resp: httpx.Response) -> tuple[int, dict[str, str], Any]:
    headers = {k: v for k, v in resp.headers.items() if k not in ("x-request-id", "date")}
    try:
        body: Any = resp.json()
    except json.JSONDecodeError:
        return resp.status_code, headers, resp.text
    if isinstance(body, dict):
        body.pop("requestId", None)
    return resp.status_code, headers, body


async def test_the_lane_answers_as_fastapis_own_path(nc: NATS, unique: str) -> None:
    app = build_app(stores_for(nc), admin_token=TOKEN)
    sweeps = f"{API}/namespaces/{unique}/sweeps"
    requests = [
        ("GET", "/version"),
        ("GET", f"{sweeps}?limit=abc"),
        ("GET", f"{sweeps}?limit=-1&timeoutSeconds=x&watch=0"),
        ("GET", f"{API}/namespaces/{unique}/jobs/j/log?tailLines=-1&sinceSeconds=0&index=a"),
        ("GET", f"{API}/nodes?limit=-2"),
        ("POST", f"{sweeps}?dryRun=Some"),
        ("PUT", f"{sweeps}/lr/status"),
        ("GET", f"{sweeps}/missing"),
        ("GET", f"{sweeps}/lr"),
        ("GET", f"{sweeps}?limit=1"),
        ("GET", f"{sweeps}?labelSelector=a%3D(b"),
        ("GET", "/openapi/v3/apis/nowhere"),
        ("PUT", sweeps),  # the 405 and 404 of FastAPI's router
        ("HEAD", "/version"),
        ("GET", f"{API}/namespaces/{unique}/widgets"),
        ("GET", "/nothing/here"),
        ("GET", "/apis/"),  # its redirect to /apis
    ]
    job = {"image": "ghcr.io/acme/train:1.0", "command": ["python"], "resources": {"gpu": "H100:1"}}
    spec = {"matrix": {"params": {"LR": ["0.1"]}}, "template": {"kind": "Job", "spec": job}}
    body = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "lr"}, "spec": spec}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as client:
        created = await client.post(sweeps, json=body)
        assert created.status_code == 201, created.text
        on_lane = [_answer(await client.request(m, url)) for m, url in requests]
        app.dependency_overrides[_unused_dependency] = _unused_dependency
        on_fastapi = [_answer(await client.request(m, url)) for m, url in requests]
    for (method, url), lane, full in zip(requests, on_lane, on_fastapi, strict=True):
        assert lane == full, (method, url)
    assert on_lane[1][0] == 400 and on_lane[1][2]["details"]["causes"][0]["field"] == "limit"
    assert on_lane[8][0] == 200 and on_lane[8][2]["metadata"]["name"] == "lr"


# ---------------------------------------------------------------------------------------------------------
# The route table
# ---------------------------------------------------------------------------------------------------------


def _table(*routes: tuple[str, str]) -> RouteTable:
    """A table over one route per (method, path)."""
    router = APIRouter()
    for method, path in routes:

        async def endpoint(request: Request, limit: LimitQ = None) -> Response:
            return PlainTextResponse(str(limit))

        router.add_api_route(path, endpoint, methods=[method])
    return RouteTable(router.routes, Parameters(queries=QUERIES))


def test_the_table_picks_the_first_route_whose_path_and_method_match() -> None:
    table = _table(
        ("GET", "/a/{x}"), ("GET", "/a/b"), ("POST", "/a/b"), ("PATCH", "/c/d"), ("GET", "/files/{rest:path}")
    )
    assert table.indirect() == []
    assert _params(table.find("GET", "/a/b")) == {"x": "b"}  # the earlier route wins, as in FastAPI's
    assert _params(table.find("POST", "/a/b")) == {}
    assert _params(table.find("GET", "/files/")) == {"rest": ""}
    assert _params(table.find("GET", "/files/a/b")) == {"rest": "a/b"}
    # What FastAPI's router raises when no route takes the request: a 405 (the first route whose path
    # matches says what it allows), a 404; a redirect to the path with or without its last slash is its own.
    assert _error(table.find("PUT", "/a/b")) == (405, {"Allow": "GET"})
    assert _error(table.find("GET", "/c/d")) == (405, {"Allow": "PATCH"})
    assert _error(table.find("GET", "/a/")) == (404, None)  # a parameter is never an empty segment
    assert _error(table.find("GET", "/nowhere/at/all")) == (404, None)
    assert table.find("GET", "/c/d/") is None
    # Paths of any length: the cache keeps one entry for every length past the longest route's.
    assert _error(table.find("GET", "/" + "/".join("x" * 300))) == (404, None)
    cached = len(table.cache)
    assert _error(table.find("GET", "/" + "/".join("y" * 500))) == (404, None)
    assert len(table.cache) == cached


def _params(found: object) -> dict[str, str]:
    assert isinstance(found, tuple), found
    params: dict[str, str] = found[1]
    return params


def _error(found: object) -> tuple[int, Mapping[str, str] | None]:
    assert isinstance(found, HTTPException), found
    return found.status_code, found.headers


def test_a_route_the_table_cannot_read_goes_to_fastapi() -> None:
    table = _table(("GET", "/a/{x}"), ("GET", "/n/{id:int}"), ("GET", "/z"))
    # A converter the lane does not match: the route might match anything after it, so FastAPI decides.
    assert [r.path for r in table.indirect()] == ["/n/{id:int}"]  # type: ignore[attr-defined]
    assert _params(table.find("GET", "/a/b")) == {"x": "b"}  # it matched before that route
    assert table.find("GET", "/z") is None
    assert table.find("GET", "/nowhere") is None


def test_only_declared_parameters_are_read_directly() -> None:
    router = APIRouter()

    @router.get("/inline")
    async def inline(q: Annotated[str | None, Query()] = None) -> Response:
        return PlainTextResponse(q or "")

    @router.get("/sync")
    def sync(request: Request) -> Response:
        return PlainTextResponse("")

    @router.get("/required")
    async def required(limit: LimitQ) -> Response:
        return PlainTextResponse("")

    @router.get("/plain")
    async def plain(request: Request, name: str = "x") -> Response:  # a query parameter without an alias
        return PlainTextResponse("")

    @router.get("/dict")
    async def as_dict(request: Request) -> dict[str, str]:  # FastAPI serializes it
        return {}

    table = RouteTable(router.routes, Parameters(queries=QUERIES))
    assert len(table.indirect()) == 5


def test_a_parameter_the_lane_cannot_read_is_refused_when_declared() -> None:
    with pytest.raises(ValueError, match="str and int"):
        Parameters(queries=[Annotated[list[str] | None, Query()]])


# ---------------------------------------------------------------------------------------------------------
# Public interfaces only
# ---------------------------------------------------------------------------------------------------------


def _gateway_sources() -> list[Path]:
    return sorted(Path(nodus_gateway.__file__).parent.rglob("*.py"))


def _own_private_names(trees: list[ast.Module]) -> set[str]:
    """Every ``_name`` the gateway defines itself: functions, classes, attributes it assigns, parameters."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {n for n in names if n.startswith("_")}


def _third_party_private_uses(path: Path, tree: ast.Module, own: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            module_parts = (node.module or "").split(".")
            if not module_parts[0].startswith("nodus_") and node.level == 0:
                names = [*module_parts, *(a.name for a in node.names)]
                found += [f"{where}: from {node.module} import {n}" for n in names if n.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if "._" in a.name or a.name[0] == "_"]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            found.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith("attr"):
            literal = node.args[1] if len(node.args) > 1 else None
            if (
                isinstance(literal, ast.Constant)
                and isinstance(literal.value, str)
                and _private(literal.value)
            ):
                found.append(f"{where}: {node.func.id}(..., {literal.value!r})")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_the_gateway_uses_no_private_name_of_another_package() -> None:
    # Issue #19: a FastAPI, Starlette, pydantic, nats or uvicorn upgrade must not break the gateway
    # silently. A name with a leading underscore is one a package may change in any release.
    sources = _gateway_sources()
    trees = [ast.parse(p.read_text(), str(p)) for p in sources]
    own = _own_private_names(trees)
    found = [
        use for p, tree in zip(sources, trees, strict=True) for use in _third_party_private_uses(p, tree, own)
    ]
    assert found == [], "\n".join(found)
