"""Request dispatch without FastAPI's per-request machinery where the gateway does not need it.

Two costs of FastAPI showed up as a third of the gateway's CPU per create (``bench/gateway_bench.py``):

* **Route matching** walks every route in order and runs each one's path regex: 31 of them for a create
  of a Sweep. :class:`IndexedDispatch` keeps the same routes in the same order, but looks only at those
  whose path has as many segments as the request's and whose last segment is the request's (or a
  parameter). Every route that could match (fully, or by path with another method: a 405) is among
  them, in its original order, so the route chosen is the one the full walk would choose. A request
  that none of them matches goes to the router itself, for its trailing-slash redirect and its 404.
* **Parameter solving**: FastAPI solves a route's parameters through pydantic on every request (the
  create route's query options as a dependency cost ~100 µs). :func:`accelerate` gives each route whose
  parameters are all simple (path strings, the Request, optional string or bounded integer query
  parameters, and async dependencies made of those) a handler that reads them directly. Errors are
  FastAPI's own ``RequestValidationError`` with the same locations and messages, so the app's handler
  answers them exactly as before. Any other route keeps FastAPI's handler.

* **The layers around a route**: FastAPI wraps every request in ten ASGI layers (its telemetry check,
  Starlette's error and exception middlewares, two exit stacks, the router, the route, the request-response
  adapter), each a call and most a wrapper around ``send``. :class:`GatewayApp` gives a request whose route
  has a direct handler a lane of its own: the app's middlewares (request context, authentication, Tables:
  the same classes with the same settings), then the handler, its exceptions answered by the app's own
  exception handlers. Anything else (no route, a 405, a route FastAPI keeps, FastAPI's telemetry switched
  on, a test's dependency overrides) takes FastAPI's full path, so the answers are the same either way.

The route table itself is untouched: discovery and the OpenAPI documents still read it.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, request_response
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

try:  # FastAPI's own telemetry hook (newer releases): keep the route name on its span.
    from fastapi.telemetry._api import _route_selected
except ImportError:  # pragma: no cover - older FastAPI
    _route_selected = None

_ANY: Final = "\0param"  # the index key of a last segment that is a path parameter
FAST_ROUTE_KEY: Final = "nodus.fast_route"  # the scope key of the lane's (handler, route scope)


# ---------------------------------------------------------------------------------------------------------
# Route matching
# ---------------------------------------------------------------------------------------------------------


_Shape = tuple[int, str, str]  # (segments, last segment, the one before it), each literal or _ANY
_SPANS: Final[_Shape] = (0, "", "")  # a route whose last parameter spans segments ({key:path})


def _shape(route: BaseRoute) -> _Shape | None:
    """The shape of a plain route's path; _SPANS for one whose path ends in a ``{x:path}`` parameter (it
    can match any number of segments); None for one the index cannot place (a Mount, a parameter inside
    a segment)."""
    if not isinstance(route, Route):
        return None
    segments = route.path.split("/")
    spans = segments[-1].startswith("{") and segments[-1].endswith(":path}")
    if spans:
        segments = segments[:-1]
    for seg in segments:
        if "{" in seg and not (seg.startswith("{") and seg.endswith("}") and ":" not in seg):
            return None
    if spans:
        return _SPANS
    last, before = segments[-1], segments[-2] if len(segments) > 1 else ""
    return len(segments), _literal(last), _literal(before)


def _literal(segment: str) -> str:
    return _ANY if segment.startswith("{") else segment


def _route_path(scope: Scope) -> str:
    """The path routes match against: the request's, less the app's root path (as Starlette's)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class IndexedDispatch:
    """The router's route walk, over the few routes that can match the request's path."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self._index(router.routes)

    def _index(self, routes: list[BaseRoute]) -> None:
        self.routes_seen = len(routes)
        shapes = [_shape(r) for r in routes]
        # None: a route the index cannot place; every request then walks them all, as the router does.
        self.shapes: list[tuple[BaseRoute, _Shape]] | None = (
            None if any(s is None for s in shapes) else list(zip(routes, shapes, strict=True))  # type: ignore[arg-type]
        )
        self.lasts = {(s[0], s[1]) for s in shapes if s is not None and s[1] != _ANY}
        self.befores = {(s[0], s[2]) for s in shapes if s is not None and s[2] != _ANY}
        self.cache: dict[_Shape, list[BaseRoute]] = {}

    def candidates(self, path: str) -> list[BaseRoute] | None:
        """The routes that can match ``path`` (fully, or but for the method), in their order."""
        if len(self.router.routes) != self.routes_seen:  # a route added after start: index again
            self._index(self.router.routes)
        if self.shapes is None:
            return None
        segments = path.split("/")
        n = len(segments)
        last = segments[-1] if (n, segments[-1]) in self.lasts else _ANY
        before = segments[-2] if n > 1 and (n, segments[-2]) in self.befores else _ANY
        # Segments no route has there are _ANY: the key space is bounded by the routes' own literals.
        key = (n, last, before)
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = [
                route
                for route, (rn, rlast, rbefore) in self.shapes
                if (rn, rlast, rbefore) == _SPANS
                or (rn == n and rlast in (last, _ANY) and rbefore in (before, _ANY))
            ]
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        candidates = self.candidates(_route_path(scope)) if scope["type"] == "http" else None
        if candidates is None:
            await self.router.app(scope, receive, send)
            return
        scope.setdefault("router", self.router)
        partial: tuple[BaseRoute, Scope] | None = None
        for route in candidates:
            match, child_scope = route.matches(scope)
            if match == Match.FULL:
                await self._handle(route, child_scope, scope, receive, send)
                return
            if match == Match.PARTIAL and partial is None:
                partial = (route, child_scope)
        if partial is not None:
            await self._handle(partial[0], partial[1], scope, receive, send)
            return
        await self.router.app(scope, receive, send)  # nothing matches: its redirect or its 404

    @staticmethod
    async def _handle(route: BaseRoute, child: Scope, scope: Scope, receive: Receive, send: Send) -> None:
        scope.update(child)
        if _route_selected is not None:
            _route_selected(scope=scope, path=getattr(route, "path_format", None))
        await route.handle(scope, receive, send)


# ---------------------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Query:
    name: str  # the endpoint's parameter
    alias: str  # the query parameter
    integer: bool
    ge: int | None
    default: Any


@dataclass(frozen=True, slots=True)
class _Plan:
    call: Callable[..., Awaitable[Any]]
    paths: tuple[str, ...]
    request: str | None
    queries: tuple[_Query, ...]
    dependencies: tuple[tuple[str, _Plan], ...]


def _scalar(annotation: Any) -> type | None:
    """``str`` or ``int`` for ``str``, ``int`` and their ``| None`` forms; None for anything else."""
    if annotation in (str, int):
        return typing.cast(type, annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and args[0] in (str, int):
            return typing.cast(type, args[0])
    return None


def _plan(dependant: Any) -> _Plan | None:
    """How to call a route's endpoint with its parameters read directly, or None when it takes anything
    this module does not read (a body, headers, cookies, security, a sync dependency, ...)."""
    call = dependant.call
    if call is None or not inspect.iscoroutinefunction(call):
        return None
    if dependant.header_params or dependant.cookie_params or dependant.body_params:
        return None
    if (
        dependant.security_scopes_param_name
        or dependant.own_oauth_scopes
        or dependant.background_tasks_param_name
    ):
        return None
    if (
        dependant.websocket_param_name
        or dependant.http_connection_param_name
        or dependant.response_param_name
    ):
        return None
    queries = []
    for f in dependant.query_params:
        kind = _scalar(f.field_info.annotation)
        if kind is None or f.field_info.is_required():
            return None
        ge = next((m.ge for m in f.field_info.metadata if getattr(m, "ge", None) is not None), None)
        if any(
            getattr(m, attr, None) is not None for m in f.field_info.metadata for attr in ("le", "gt", "lt")
        ):
            return None
        queries.append(_Query(f.name, f.alias, kind is int, ge, f.field_info.default))
    if any(_scalar(f.field_info.annotation) is not str for f in dependant.path_params):
        return None
    subs = []
    for sub in dependant.dependencies:
        plan = _plan(sub)
        if plan is None or sub.name is None:
            return None
        subs.append((sub.name, plan))
    return _Plan(
        call=call,
        paths=tuple(f.name for f in dependant.path_params),
        request=dependant.request_param_name,
        queries=tuple(queries),
        dependencies=tuple(subs),
    )


def _query_value(q: _Query, request: Request, errors: list[dict[str, Any]]) -> Any:
    raw = request.query_params.get(q.alias)
    if raw is None:
        return q.default
    if not q.integer:
        return raw
    try:
        value = int(raw)
    except ValueError:
        errors.append(
            {
                "type": "int_parsing",
                "loc": ("query", q.alias),
                "msg": "Input should be a valid integer, unable to parse string as an integer",
                "input": raw,
            }
        )
        return None
    if q.ge is not None and value < q.ge:
        errors.append(
            {
                "type": "greater_than_equal",
                "loc": ("query", q.alias),
                "msg": f"Input should be greater than or equal to {q.ge}",
                "input": raw,
                "ctx": {"ge": q.ge},
            }
        )
    return value


async def _solve(plan: _Plan, request: Request, errors: list[dict[str, Any]]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    params = request.path_params
    for name in plan.paths:
        values[name] = params[name]
    if plan.request is not None:
        values[plan.request] = request
    for q in plan.queries:
        values[q.name] = _query_value(q, request, errors)
    for name, sub in plan.dependencies:
        sub_values = await _solve(sub, request, errors)
        if errors:  # FastAPI does not call a dependency whose parameters are invalid
            return values
        values[name] = await sub.call(**sub_values)
    return values


def _handler(plan: _Plan) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        errors: list[dict[str, Any]] = []
        values = await _solve(plan, request, errors)
        if errors:
            raise RequestValidationError(errors)
        response = await plan.call(**values)
        if not isinstance(response, Response):  # only routes that answer Responses are planned
            raise TypeError(f"{plan.call!r} answered {type(response).__name__}, not a Response")
        return response

    return handle


def _answers_response(route: APIRoute) -> bool:
    hints = typing.get_type_hints(route.endpoint) if callable(route.endpoint) else {}
    returned = hints.get("return")
    return isinstance(returned, type) and issubclass(returned, Response)


def accelerate(app: FastAPI) -> int:
    """Give the app indexed dispatch and each simple route a direct handler; the number of routes that got
    one (the rest keep FastAPI's)."""
    fast = 0
    for route in app.router.routes:
        # dependency_overrides (a test's replacement of a dependency) are FastAPI's to apply.
        if not isinstance(route, APIRoute) or app.dependency_overrides:
            continue
        plan = _plan(route.dependant) if _answers_response(route) else None
        if plan is not None:
            handler = _handler(plan)
            route.app = request_response(handler)
            _FAST_HANDLERS[id(route)] = (route, handler)
            fast += 1
    dispatch = IndexedDispatch(app.router)
    app.router.middleware_stack = dispatch
    if isinstance(app, GatewayApp):
        app.dispatch = dispatch
    return fast


# ---------------------------------------------------------------------------------------------------------
# The lane
# ---------------------------------------------------------------------------------------------------------

_Handler = Callable[[Request], Awaitable[Response]]
# Route id -> (the route, kept alive so its id is never reused; its direct handler).
_FAST_HANDLERS: dict[int, tuple[BaseRoute, _Handler]] = {}
_ErrorHandler = Callable[[Request, Exception], Awaitable[Response] | Response]


class GatewayApp(FastAPI):
    """FastAPI, with a short lane for requests whose route has a direct handler (see the module's doc).

    ``wrap`` builds the lane's middlewares around an ASGI app, the same ones ``add_middleware`` gave the
    full path: :func:`nodus_gateway.app.build_app` sets it once every middleware is added.
    """

    dispatch: IndexedDispatch | None = None
    lane: ASGIApp | None = None

    def open_lane(self, wrap: Callable[[ASGIApp], ASGIApp]) -> None:
        self.lane = wrap(self._endpoint)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.lane is not None and scope["type"] == "http" and self._fast(scope):
            await self.lane(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def _fast(self, scope: Scope) -> bool:
        """Find the route FastAPI would run; True (and the route noted in the scope) if it has a direct
        handler and nothing asks for FastAPI's own per-request work."""
        if self.dispatch is None or self.root_path or self.dependency_overrides:
            return False
        telemetry = getattr(self, "_native_telemetry", None)
        if telemetry is not None and telemetry.enabled():
            return False
        candidates = self.dispatch.candidates(_route_path(scope))
        if candidates is None:
            return False
        for route in candidates:
            match, child = route.matches(scope)
            if match == Match.FULL:
                fast = _FAST_HANDLERS.get(id(route))
                if fast is None or fast[0] is not route:
                    return False
                scope[FAST_ROUTE_KEY] = (fast[1], child)
                return True
        return False  # a 405 or a 404: the router's to answer

    async def _endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler, child = scope.pop(FAST_ROUTE_KEY)
        scope.update(child)
        scope["app"] = self
        scope.setdefault("router", self.router)
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
        except Exception as exc:
            on_error = self._error_handler(exc)
            if on_error is None:
                raise  # the request context's: a logged 500 InternalError
            answered = on_error(request, exc)
            response = await answered if inspect.isawaitable(answered) else answered
        await response(scope, receive, send)

    def _error_handler(self, exc: Exception) -> _ErrorHandler | None:
        # Starlette's lookup: the handler of the nearest class in the exception's MRO.
        for cls in type(exc).__mro__:
            found = self.exception_handlers.get(cls)
            if found is not None:
                return typing.cast(_ErrorHandler, found)
        return None
