"""The FastAPI application: routes, middleware and the error handlers that make every error a Status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import nats.errors
from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.telemetry import TelemetryConfig
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from nodus_gateway import billingapi, logstreaming, querying, workspacefiles
from nodus_gateway.admin import admin_router
from nodus_gateway.auth import BearerAuth
from nodus_gateway.authlimits import AuthFailureLimiter
from nodus_gateway.billingapi import billing_router
from nodus_gateway.blobbing import blob_router
from nodus_gateway.clusterrouting import cluster_routers
from nodus_gateway.config import MAX_BODY_BYTES
from nodus_gateway.discovery import discovery_router
from nodus_gateway.dispatching import DirectLane, ErrorHandler, Parameters, RouteTable
from nodus_gateway.gitrefs import GitSettings
from nodus_gateway.logstreaming import log_router
from nodus_gateway.openapi import openapi_router
from nodus_gateway.principals import Principals
from nodus_gateway.reaching import RunAccess
from nodus_gateway.referencing import ReferenceSettings
from nodus_gateway.requesting import RequestContext
from nodus_gateway.resources import Stores, resource
from nodus_gateway.responding import ApiError, bus_unavailable, status_response
from nodus_gateway.resultsapi import results_router
from nodus_gateway.routing import API_PREFIX, api_routers
from nodus_gateway.secreting import secret_router
from nodus_gateway.storeaccess import StoreAccess
from nodus_gateway.system import VERSION, system_router
from nodus_gateway.tabling import TableResponses
from nodus_gateway.volumeapi import volume_router
from nodus_gateway.webview import WebView
from nodus_gateway.workspacefiles import workspace_file_router
from nodus_kit import errors as kit
from nodus_schema import CauseType, FieldError, reason_for_code, status_for

NOT_FOUND_FIX = (
    f"Resources live under {API_PREFIX}/namespaces/<project>/sweeps and .../jobs; "
    "check the path (or use the nodus CLI)."
)


# FastAPI's own OpenTelemetry (FastAPI(telemetry=...)) is off: the gateway opens the server span of every
# request itself (requesting.py, ADR-0032), the root of a create's trace; FastAPI's would be a second
# server span per request, in a trace of its own, and a check of the providers on every request.
NO_FASTAPI_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}

# The query parameters and dependencies the direct lane reads (dispatching.Parameters).
LANE_PARAMETERS: Final = Parameters(
    queries=(*querying.QUERIES, *logstreaming.QUERIES, *billingapi.QUERIES, *workspacefiles.QUERIES),
    dependencies=querying.DEPENDENCIES,
)


def build_app(
    stores: Stores,
    *,
    admin_token: str,
    ready: Callable[[], bool] = lambda: True,
    max_body_bytes: int = MAX_BODY_BYTES,
    principals: Principals | None = None,
    auth_limiter: AuthFailureLimiter | None = None,
    store: StoreAccess | None = None,
    git: GitSettings | None = None,
    run_access: RunAccess | None = None,
) -> FastAPI:
    """``principals`` holds minted tokens and projects; without it only the admin token is accepted and
    the projects and tokens endpoints are not served. ``auth_limiter`` counts failed authentications per
    client (authlimits.py; default: its default limits, a new one per app). ``store`` is Nodus's S3 store
    of blobs and Workspace files (storeaccess.py); without it (or its bucket) those endpoints answer 503.
    ``git``: how admission asks git hosts about spec.source.git (gitrefs.py; default: GitHub).
    ``run_access``: the URL runs reach the API at (reaching.py); without one, Jobs and Sweeps that name a
    ServiceAccount are refused at admission (ADR-0037)."""
    limiter = auth_limiter if auth_limiter is not None else AuthFailureLimiter()
    # FastAPI's own OpenAPI and docs pages are off: kubectl reads /openapi/v2 and /openapi/v3 in
    # Kubernetes' shape, which the full API serves with discovery.
    app = FastAPI(
        title="Nodus API",
        version=VERSION,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        telemetry=NO_FASTAPI_TELEMETRY,
    )
    routers = _routers(
        stores,
        ready=ready,
        max_body_bytes=max_body_bytes,
        principals=principals,
        store=store,
        refs=ReferenceSettings(git or GitSettings(), (run_access or RunAccess()).url),
    )
    for router in routers:
        app.include_router(router)
    handlers = _error_handlers()
    for cls, handler in handlers.items():
        app.add_exception_handler(cls, handler)
    # Same routes, same answers, less of FastAPI's per-request work (dispatching says which and why).
    # Added first, so innermost: its requests pass every middleware below, as FastAPI's do.
    table = RouteTable([route for router in routers for route in router.routes], LANE_PARAMETERS)
    app.state.direct_routes = table  # for the test that every route is on the lane
    app.add_middleware(DirectLane, table=table, handlers=handlers, owner=app)
    # Innermost but for the lane: a GET of a resource that asks for a Table (kubectl get) gets its list,
    # object or watch events as Tables, whichever route wrote them (tabling.TableResponses says why it
    # is a middleware).
    app.add_middleware(TableResponses)
    # Added last runs first: the request context wraps authentication, so a 401 has its request id too.
    app.add_middleware(BearerAuth, token=admin_token, principals=principals, limiter=limiter)
    app.add_middleware(WebView)  # /ui/: the web view's static files, outside auth (webview.py says why)
    app.add_middleware(RequestContext)
    return app


def _routers(
    stores: Stores,
    *,
    ready: Callable[[], bool],
    max_body_bytes: int,
    principals: Principals | None,
    store: StoreAccess | None = None,
    refs: ReferenceSettings | None = None,
) -> list[APIRouter]:
    """Every router of the app, in the order their routes are matched."""
    routers = [
        system_router(ready),
        discovery_router(),
        openapi_router(),
        # Rows served by modules of their own (resources.Resource.served_by) come before the generic
        # routes, so that theirs answer first on any path both would serve.
        *cluster_routers(stores, max_body_bytes=max_body_bytes),
        secret_router(stores, max_body_bytes=max_body_bytes),
        log_router(stores),
        # A Sweep's results (rows, best cells, CSV), read from the Sweep its controller keeps current.
        results_router(stores),
        # Billing's books, asked over the bus on the connection the stores use.
        billing_router(stores[resource("budgets").plural].nc, max_body_bytes=max_body_bytes),
        # Code and data (ADR-0036): blobs, Volume revisions, Workspace files, and the deletes of Volumes
        # and Workspaces, which must first ask whether a Job still uses them (before the generic delete).
        blob_router(stores, store),
        workspace_file_router(stores, store),
        volume_router(stores, store, max_body_bytes=max_body_bytes),
        *api_routers(stores, max_body_bytes=max_body_bytes, refs=refs or ReferenceSettings()),
    ]
    if principals is not None:
        routers.append(admin_router(principals, stores, max_body_bytes=max_body_bytes))
    return routers


def _param(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """``("query", "limit")`` → ``limit``: the parameter's name, as the caller wrote it."""
    return ".".join(str(p) for p in loc[1:]) or str(loc[0])


def _error_handlers() -> dict[type[Exception], ErrorHandler]:
    """Every error as a Status: given to FastAPI (``add_exception_handler``) and to the direct lane alike."""

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

    return {
        ApiError: api_error,
        HTTPException: http_error,
        RequestValidationError: parameter_error,
        nats.errors.Error: bus_error,
        kit.NodusError: kit_error,
    }
