"""The FastAPI application: routes, middleware and the error handlers that make every error a Status."""

from __future__ import annotations

from collections.abc import Callable

import nats.errors
from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from nodus_gateway.admin import admin_router
from nodus_gateway.auth import BearerAuth
from nodus_gateway.authlimits import AuthFailureLimiter
from nodus_gateway.billingapi import billing_router
from nodus_gateway.clusterrouting import cluster_router
from nodus_gateway.config import MAX_BODY_BYTES
from nodus_gateway.discovery import discovery_router
from nodus_gateway.dispatching import GatewayApp, accelerate
from nodus_gateway.logstreaming import log_router
from nodus_gateway.openapi import openapi_router
from nodus_gateway.principals import Principals
from nodus_gateway.requesting import RequestContext
from nodus_gateway.resources import Stores, resource
from nodus_gateway.responding import ApiError, bus_unavailable, status_response
from nodus_gateway.resultsapi import results_router
from nodus_gateway.routing import API_PREFIX, api_router
from nodus_gateway.secreting import secret_router
from nodus_gateway.system import VERSION, system_router
from nodus_gateway.tabling import TableResponses
from nodus_gateway.webview import WebView
from nodus_kit import errors as kit
from nodus_schema import CauseType, FieldError, reason_for_code, status_for

NOT_FOUND_FIX = (
    f"Resources live under {API_PREFIX}/namespaces/<project>/sweeps and .../jobs; "
    "check the path (or use the nodus CLI)."
)


def build_app(
    stores: Stores,
    *,
    admin_token: str,
    ready: Callable[[], bool] = lambda: True,
    max_body_bytes: int = MAX_BODY_BYTES,
    principals: Principals | None = None,
    auth_limiter: AuthFailureLimiter | None = None,
) -> FastAPI:
    """``principals`` holds minted tokens and projects; without it only the admin token is accepted and
    the projects and tokens endpoints are not served. ``auth_limiter`` counts failed authentications per
    client (authlimits.py; default: its default limits, a new one per app)."""
    limiter = auth_limiter if auth_limiter is not None else AuthFailureLimiter()
    # FastAPI's own OpenAPI and docs pages are off: kubectl reads /openapi/v2 and /openapi/v3 in
    # Kubernetes' shape, which the full API serves with discovery.
    app = GatewayApp(title="Nodus API", version=VERSION, openapi_url=None, docs_url=None, redoc_url=None)
    routers = [
        system_router(ready),
        discovery_router(),
        openapi_router(),
        # Rows served by modules of their own (resources.Resource.served_by) come before the generic
        # routes, so that theirs answer first on any path both would serve.
        cluster_router(stores, max_body_bytes=max_body_bytes),
        secret_router(stores, max_body_bytes=max_body_bytes),
        log_router(stores),
        # A Sweep's results (rows, best cells, CSV), read from the Sweep its controller keeps current.
        results_router(stores),
        # Billing's books, asked over the bus on the connection the stores use.
        billing_router(stores[resource("budgets").plural].nc, max_body_bytes=max_body_bytes),
        api_router(stores, max_body_bytes=max_body_bytes),
    ]
    if principals is not None:
        routers.append(admin_router(principals, stores, max_body_bytes=max_body_bytes))
    for router in routers:
        _include_flat(app, router)
    _install_error_handlers(app)
    # Same routes, same answers, less of FastAPI's per-request work (dispatching says which and why).
    accelerate(app)
    # Innermost: a GET of a resource that asks for a Table (kubectl get) gets its list, object or watch
    # events as Tables, whichever route wrote them (tabling.TableResponses says why it is a middleware).
    app.add_middleware(TableResponses)
    # Added last runs first: the request context wraps authentication, so a 401 has its request id too.
    app.add_middleware(BearerAuth, token=admin_token, principals=principals, limiter=limiter)
    app.add_middleware(WebView)  # /ui/: the web view's static files, outside auth (webview.py says why)
    app.add_middleware(RequestContext)

    # The lane of routes with direct handlers (dispatching.GatewayApp): the same middlewares, in the
    # same order, around the handler alone.
    def wrap(inner: ASGIApp) -> ASGIApp:
        authenticated = BearerAuth(
            TableResponses(inner), token=admin_token, principals=principals, limiter=limiter
        )
        return RequestContext(WebView(authenticated))  # WebView: a browser's GET / is sent to /ui/

    app.open_lane(wrap)
    return app


def _include_flat(app: FastAPI, router: APIRouter) -> None:
    """``app.include_router(router)``, with the routes of ``router`` and of the routers it includes added
    to the app's own list, in the same order.

    FastAPI keeps an included router nested and matches a request through every level of it (with
    bookkeeping in the scope at each), which cost about a quarter of the gateway's CPU per request. The
    routers here are included without a prefix, tags or dependencies of their own, so each route already
    is what it would be once included: the same routes, in the same order, matched in one flat list.
    """
    for context in iter_route_contexts(router.routes):
        app.router.routes.append(context.original_route)


def _param(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """``("query", "limit")`` → ``limit``: the parameter's name, as the caller wrote it."""
    return ".".join(str(p) for p in loc[1:]) or str(loc[0])


def _install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return status_response(exc.status, headers=exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        # Starlette's own: no route (404), a route without this verb (405, with Allow).
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            status = status_for(
                "NotFound", "the server could not find the requested resource", fix=NOT_FOUND_FIX
            )
        elif exc.status_code == 405:
            allowed = headers.get("allow", headers.get("Allow", ""))
            fix = f"This path allows {allowed}." if allowed else "Use a verb this path supports."
            status = status_for(
                "MethodNotAllowed",
                f"the server does not allow this method ({request.method}) on the requested resource",
                fix=fix,
            )
        else:
            status = status_for(reason_for_code(exc.status_code), str(exc.detail))
        return status_response(status, headers=headers)

    async def parameter_error(_: Request, exc: Exception) -> Response:
        # A bad query or path parameter (limit=abc): a malformed request, not an invalid object.
        assert isinstance(exc, RequestValidationError)
        causes = [FieldError(_param(e["loc"]), CauseType.INVALID, e["msg"]) for e in exc.errors()]
        listed = "; ".join(str(c) for c in causes)
        status = status_for("BadRequest", f"invalid request parameters: {listed}", causes=causes)
        return status_response(status)

    async def bus_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, nats.errors.Error)
        return status_response(bus_unavailable(exc).status, headers={"Retry-After": "1"})

    async def kit_error(_: Request, exc: Exception) -> Response:
        # Routes translate store errors with the resource's wording; this is the net under them.
        assert isinstance(exc, kit.NodusError)
        return status_response(status_for(exc.reason if exc.reason != "Invalid" else "BadRequest", str(exc)))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, parameter_error)
    app.add_exception_handler(nats.errors.Error, bus_error)
    app.add_exception_handler(kit.NodusError, kit_error)
