"""The direct lane: requests the gateway answers without FastAPI's per-request machinery, built on what
Starlette, FastAPI and pydantic document.

Why it exists: FastAPI's own handling of a request was most of the gateway's CPU per create
(``bench/gateway_bench.py``, docs/benchmarks.md):

* **Route matching** walks every route in order and runs each one's path regex (31 of them for a create
  of a Sweep), and FastAPI matches included routers level by level.
* **Parameter solving** goes through pydantic for every parameter of every request (the create route's
  query options, as a dependency, cost ~100 µs).
* **The layers around a route**: exception middleware, exit stacks, the router, the route and the
  request-response adapter, each a call and most a wrapper around ``send``.

How, using public interfaces only:

* :class:`DirectLane` is a pure ASGI middleware (Starlette's documented kind), added first so it is the
  innermost of the app's: every request still passes the app's own middlewares (request context,
  authentication, Tables). It answers the requests whose route it can call, and the 404s and 405s of
  FastAPI's router (the same ``HTTPException``, to the same handler). It passes every other request on to
  FastAPI: a trailing-slash redirect, a route it cannot call, and every request while a test overrides
  dependencies (``app.dependency_overrides``).
* :class:`RouteTable` holds the same routes in the same order and picks the route FastAPI's router would
  pick (the first whose path and method match, else the first whose path does: a 405), matching path
  segments against the few routes with as many segments and the same last ones.
* A route it can call is an ``async`` endpoint that answers a ``Response`` and takes only what the
  gateway declares in :class:`Parameters`: the ``Request``, ``str`` path parameters, and query aliases and
  dependencies listed by their ``Annotated`` alias (querying.py and the modules with parameters of their
  own). It reads them from the endpoint's signature (``inspect``, ``typing``), never from FastAPI's
  internals. A query value is converted and checked by pydantic with the alias's own constraints (FastAPI's
  ``Query()`` is a pydantic ``FieldInfo``, as its documentation says), so a bad value gets the messages
  FastAPI's path gives it, raised as FastAPI's ``RequestValidationError``.
* Its errors are answered by the handlers the app registers with FastAPI (passed in: the same functions).

The routes themselves are FastAPI's, included with ``include_router``: discovery and the OpenAPI documents
read them there.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[..., Awaitable[Any]]
Handler = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Any], Awaitable[Response] | Response]

# ---------------------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Query:
    name: str  # the endpoint's parameter
    key: str  # the query parameter, as sent
    default: Any
    adapter: TypeAdapter[Any] | None  # converts and checks the value; None: the string as sent

    def read(self, request: Request, errors: list[dict[str, Any]]) -> Any:
        raw = request.query_params.get(self.key)
        if raw is None:
            return self.default
        if self.adapter is None:
            return raw
        try:
            return self.adapter.validate_python(raw)
        except ValidationError as e:
            # Located as FastAPI locates a query parameter's errors, which the app's handler reads.
            errors.extend(
                {**err, "loc": ("query", self.key, *err["loc"])} for err in e.errors(include_url=False)
            )
            return None


def _scalar(annotation: Any) -> type | None:
    """``str`` or ``int`` for ``str``, ``int`` and their ``| None`` forms; None for anything else."""
    if annotation in (str, int):
        return typing.cast(type, annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _scalar(args[0])
    return None


def _query_of(alias: Any) -> tuple[str | None, TypeAdapter[Any] | None]:
    """The URL name (None: the parameter's own) and the checks of ``Annotated[T | None, Query(...)]``."""
    if typing.get_origin(alias) is not Annotated:
        raise ValueError(f"{alias!r} is not an Annotated query alias")
    base, *meta = typing.get_args(alias)
    infos = [m for m in meta if isinstance(m, FieldInfo)]
    kind = _scalar(base)
    if len(infos) != 1 or kind is None:
        raise ValueError(f"{alias!r}: the lane reads str and int query parameters declared with Query()")
    constraints = infos[0].metadata  # pydantic's own form of ge=..., max_length=...: checked as FastAPI does
    if kind is str and not constraints:
        return infos[0].alias, None
    return infos[0].alias, TypeAdapter(Annotated[(kind, *constraints)])


class Parameters:
    """What the lane may pass an endpoint, besides the Request and path parameters: the query aliases and
    the dependencies the gateway declares, each an ``Annotated`` alias that FastAPI reads too. Known by
    identity, so a parameter annotated with anything else (an alias not listed here, a header, a body)
    leaves its route to FastAPI."""

    def __init__(
        self, queries: Iterable[Any] = (), dependencies: Iterable[tuple[Any, Endpoint]] = ()
    ) -> None:
        self.queries = {id(alias): (alias, _query_of(alias)) for alias in queries}
        self.dependencies = {id(alias): (alias, call) for alias, call in dependencies}

    def query(self, hint: Any, name: str, default: Any) -> _Query | None:
        found = self.queries.get(id(hint))
        if found is None or found[0] is not hint:
            return None
        key, adapter = found[1]
        return _Query(name, key or name, default, adapter)

    def dependency(self, hint: Any) -> Endpoint | None:
        found = self.dependencies.get(id(hint))
        return found[1] if found is not None and found[0] is hint else None


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to call one endpoint (or dependency) with its arguments read directly."""

    call: Endpoint
    paths: tuple[str, ...]
    request: str | None
    queries: tuple[_Query, ...]
    dependencies: tuple[tuple[str, _Plan], ...]

    async def solve(self, request: Request, errors: list[dict[str, Any]]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        # In FastAPI's order: dependencies first (one whose own parameters are invalid is not called).
        for name, sub in self.dependencies:
            before = len(errors)
            sub_values = await sub.solve(request, errors)
            if len(errors) == before:
                values[name] = await sub.call(**sub_values)
        params = request.path_params
        for name in self.paths:
            values[name] = params[name]
        if self.request is not None:
            values[self.request] = request
        for q in self.queries:
            values[q.name] = q.read(request, errors)
        return values


def _signature(call: Any) -> tuple[inspect.Signature, dict[str, Any]] | None:
    try:
        return inspect.signature(call), typing.get_type_hints(call, include_extras=True)
    except (NameError, TypeError, ValueError):  # an annotation that does not resolve: FastAPI's to report
        return None


def _plan(call: Any, path_names: frozenset[str], params: Parameters) -> _Plan | None:
    """The plan of an async callable whose every parameter the lane can read; None otherwise."""
    found = _signature(call) if inspect.iscoroutinefunction(call) else None
    if found is None:
        return None
    signature, hints = found
    paths: list[str] = []
    queries: list[_Query] = []
    dependencies: list[tuple[str, _Plan]] = []
    request: str | None = None
    for p in signature.parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return None
        hint = hints.get(p.name)
        default = None if p.default is p.empty else p.default
        if hint is Request and request is None:
            request = p.name
        elif p.name in path_names and hint is str:
            paths.append(p.name)
        elif (query := params.query(hint, p.name, default)) is not None:
            if p.default is p.empty:
                return None  # a required query parameter: FastAPI's to report missing
            queries.append(query)
        elif (dependency := params.dependency(hint)) is not None:
            sub = _plan(dependency, path_names, params)
            if sub is None:
                return None
            dependencies.append((p.name, sub))
        else:
            return None
    return _Plan(call, tuple(paths), request, tuple(queries), tuple(dependencies))


def _handler(plan: _Plan) -> Handler:
    async def handle(request: Request) -> Response:
        errors: list[dict[str, Any]] = []
        values = await plan.solve(request, errors)
        if errors:
            raise RequestValidationError(errors)
        response = await plan.call(**values)
        if not isinstance(response, Response):  # only endpoints annotated to answer one are planned
            raise TypeError(f"{plan.call!r} answered {type(response).__name__}, not a Response")
        return response

    return handle


# ---------------------------------------------------------------------------------------------------------
# Routes
# ---------------------------------------------------------------------------------------------------------

_ANY: Final = "\0param"  # the index key of a segment that is a parameter, or a literal no route has


@dataclass(frozen=True, slots=True)
class _Template:
    """A route's path as segments: a literal, or (for ``{name}``) a parameter's name in ``names``."""

    parts: tuple[str, ...]
    names: tuple[str | None, ...]  # the parameter at each segment; None for a literal
    tail: str | None  # a last ``{name:path}``: it takes the rest of the path, slashes included

    def match(self, segments: list[str]) -> dict[str, str] | None:
        n = len(self.parts)
        if (len(segments) != n) if self.tail is None else (len(segments) <= n):
            return None
        params: dict[str, str] = {}
        # strict=False: the segments past the template's are a tail's, joined below.
        for part, name, seg in zip(self.parts, self.names, segments, strict=False):
            if name is None:
                if seg != part:
                    return None
            elif not seg:  # Starlette's {name} matches one segment or more characters: never an empty one
                return None
            else:
                params[name] = seg
        if self.tail is not None:
            params[self.tail] = "/".join(segments[n:])
        return params

    def key_at(self, back: int) -> str:
        """The index key of the segment ``back`` places from the end (1: the last)."""
        if back > len(self.parts):
            return _ANY
        return _ANY if self.names[-back] is not None else self.parts[-back]


def _template(path: str) -> _Template | None:
    """The template of a path of ``{name}`` and final ``{name:path}`` parameters; None for any other (a
    converter such as ``:int``, a parameter inside a segment), which the lane leaves to FastAPI."""
    segments = path.split("/")
    tail = None
    if segments[-1].endswith(":path}") and segments[-1].startswith("{"):
        tail = segments.pop()[1 : -len(":path}")]
    names: list[str | None] = []
    for seg in segments:
        if seg.startswith("{") and seg.endswith("}") and seg[1:-1].isidentifier():
            names.append(seg[1:-1])
        elif "{" in seg or "}" in seg:
            return None
        else:
            names.append(None)
    if tail is not None and not tail.isidentifier():
        return None
    return _Template(tuple(segments), tuple(names), tail)


@dataclass(frozen=True, slots=True)
class _Entry:
    template: _Template | None  # None: a route the lane cannot match (it could match anything)
    methods: frozenset[str] | None  # None: every method
    handler: Handler | None  # None: FastAPI's to run
    allow: str = ""  # a 405's Allow header, as Starlette's route writes it (its own set, in its order)


def _answers_response(hints: Mapping[str, Any]) -> bool:
    returned = hints.get("return")
    return isinstance(returned, type) and issubclass(returned, Response)


def _entry(route: BaseRoute, params: Parameters) -> _Entry:
    # Only a Route matches a path as its template says (a Mount matches every path under its own).
    if not isinstance(route, Route) or (template := _template(route.path)) is None:
        return _Entry(None, None, None)
    methods = frozenset(route.methods) if route.methods is not None else None
    allow = ", ".join(route.methods or ())
    handler = None
    # Route-level dependencies would be FastAPI's to run; the gateway declares none.
    if isinstance(route, APIRoute) and not route.dependencies:
        signature = _signature(route.endpoint)
        names = frozenset(n for n in (*template.names, template.tail) if n is not None)
        plan = _plan(route.endpoint, names, params) if signature and _answers_response(signature[1]) else None
        handler = _handler(plan) if plan is not None else None
    return _Entry(template, methods, handler, allow)


class RouteTable:
    """The app's routes in order, matched by segments: the route FastAPI's router would pick for a path."""

    def __init__(self, routes: Sequence[BaseRoute], params: Parameters) -> None:
        self.routes = list(routes)
        self.entries = [_entry(r, params) for r in self.routes]
        placed = [e for e in self.entries if e.template is not None and e.template.tail is None]
        self.longest = max((len(e.template.parts) for e in placed if e.template), default=0)
        self.literals = {
            (len(e.template.parts), back, e.template.key_at(back))
            for e in placed
            if e.template
            for back in (1, 2)
        }
        self.cache: dict[tuple[int, str, str], list[_Entry]] = {}

    def indirect(self) -> list[BaseRoute]:
        """The routes the lane leaves to FastAPI (a parameter it does not read, a path it cannot match)."""
        return [r for r, e in zip(self.routes, self.entries, strict=True) if e.handler is None]

    def _key(self, segments: list[str]) -> tuple[int, str, str]:
        # A segment no route has at that place is _ANY, and any length past the longest route's is one:
        # the cache's keys are bounded by the routes, whatever paths are asked.
        n = min(len(segments), self.longest + 1)
        last = segments[-1] if (n, 1, segments[-1]) in self.literals else _ANY
        before = segments[-2] if n > 1 and (n, 2, segments[-2]) in self.literals else _ANY
        return n, last, before

    def _candidates(self, segments: list[str]) -> list[_Entry]:
        key = self._key(segments)
        found = self.cache.get(key)
        if found is None:
            n, last, before = key
            found = self.cache[key] = [
                e
                for e in self.entries
                if e.template is None
                or e.template.tail is not None
                or (
                    len(e.template.parts) == n
                    and e.template.key_at(1) in (last, _ANY)
                    and e.template.key_at(2) in (before, _ANY)
                )
            ]
        return found

    def find(self, method: str, path: str) -> tuple[Handler, dict[str, str]] | HTTPException | None:
        """What FastAPI's router would do: run a route (its direct handler and path parameters), or raise
        the HTTPException of a 404 or a 405 (the app's handler answers it, as it answers FastAPI's); None
        when FastAPI must tell (a route the lane does not call or cannot match, a trailing-slash redirect).

        FastAPI matches included routers level by level, which made its 404s and 405s cost several times
        a create's dispatch: they are the lane's too."""
        segments = path.split("/")
        partial: _Entry | None = None
        for entry in self._candidates(segments):
            if entry.template is None:
                return None  # it might match: FastAPI's to tell
            params = entry.template.match(segments)
            if params is None:
                continue
            if entry.methods is None or method in entry.methods:
                return (entry.handler, params) if entry.handler is not None else None
            partial = partial or entry  # a later route may take the method; else the first one's 405
        if partial is not None:
            return HTTPException(status_code=405, headers={"Allow": partial.allow})
        if path in ("", "/") or self._matches(_toggled_slash(path)) is not False:
            return None  # Starlette's redirect to the path with (or without) its trailing slash
        return HTTPException(status_code=404)

    def _matches(self, path: str) -> bool | None:
        """Whether any route's path matches (for any method); None when the lane cannot tell."""
        segments = path.split("/")
        for entry in self._candidates(segments):
            if entry.template is None:
                return None
            if entry.template.match(segments) is not None:
                return True
        return False


def _toggled_slash(path: str) -> str:
    return path.rstrip("/") if path.endswith("/") else path + "/"


# ---------------------------------------------------------------------------------------------------------
# The lane
# ---------------------------------------------------------------------------------------------------------


def route_path(scope: Scope) -> str:
    """The path routes match against: the request's less the root path, as Starlette's routing reads it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    if path == root:
        return ""
    return path[len(root) :] if path[len(root)] == "/" else path


class DirectLane:
    """ASGI middleware, the innermost of the app's: answers a request whose route the table calls directly,
    and passes any other to FastAPI (see the module's doc)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        table: RouteTable,
        handlers: Mapping[type[Exception], ErrorHandler],
        owner: FastAPI,
    ) -> None:
        self.app, self.table, self.handlers, self.owner = app, table, dict(handlers), owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A test's dependency_overrides are FastAPI's to apply: then every request goes its way.
        found = None
        if scope["type"] == "http" and not self.owner.dependency_overrides:
            found = self.table.find(scope["method"], route_path(scope))
        # A 404 or 405 without a handler of the app's is FastAPI's own (its plain-text answer).
        if found is None or (isinstance(found, HTTPException) and self._error_handler(found) is None):
            await self.app(scope, receive, send)
            return
        if isinstance(found, HTTPException):
            response = await self._answer(Request(scope, receive), found)
        else:
            handler, params = found
            scope["path_params"] = params  # what Request.path_params reads, as Starlette's routing sets it
            request = Request(scope, receive)
            try:
                response = await handler(request)
            except Exception as exc:
                response = await self._answer(request, exc)
        await response(scope, receive, send)

    async def _answer(self, request: Request, exc: Exception) -> Response:
        """The app's answer to an exception, or the exception again when no handler takes it (then the
        request context's: a logged 500 InternalError)."""
        on_error = self._error_handler(exc)
        if on_error is None:
            raise exc
        answered = on_error(request, exc)
        return await answered if inspect.isawaitable(answered) else answered

    def _error_handler(self, exc: Exception) -> ErrorHandler | None:
        # As Starlette looks one up: the handler of the nearest class in the exception's MRO.
        for cls in type(exc).__mro__:
            found = self.handlers.get(cls)
            if found is not None:
                return found
        return None
