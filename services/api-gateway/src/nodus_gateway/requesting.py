"""The context of every request: its request id, an access log line, and a Status for any crash.

The request id is the caller's ``X-Request-Id`` when it looks like one, else a new one; it is set for the
whole request (logs carry it, the bus carries it on as ``Nodus-Request-Id``), returned in the
``X-Request-Id`` header of every response and put in every Status as ``requestId``.

Each request also gets its body context (bodies.py): reading a body finds the request's
``fieldValidation`` there, and leaves the warnings it has (a repeated field under ``Warn``), which go out
as ``Warning: 299`` headers when the response starts, whichever route read the body.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from typing import Final

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nodus_gateway import bodies
from nodus_gateway.resources import RESOURCES
from nodus_gateway.responding import status_response
from nodus_kit import measuring, tracing
from nodus_schema import status_for

log = logging.getLogger("nodus_gateway.requests")

HEADER: Final = "X-Request-Id"
# A caller's id is echoed into headers and logs: anything else than a short plain token is replaced.
_ACCEPTABLE_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# The resource label of the request metrics: the API's plurals and billing's and admin's paths, so a
# made-up path can never add a label value.
_METER: Final = measuring.HttpMeter(
    [*(r.plural for r in RESOURCES), "account", "usage", "invoices", "projects", "tokens"]
)


def request_id_from(value: str | None) -> str:
    if value and _ACCEPTABLE_ID.fullmatch(value):
        return value
    return tracing.new_request_id()


_NO_SPAN: Final[contextlib.AbstractContextManager[object]] = contextlib.nullcontext()
_NAMES: Final = re.compile(r"^(/apis/[^/]+/[^/]+)(/namespaces/[^/]+)?(/[^/]+)(/[^/]+)?")


def route_of(path: str) -> str:
    """A low-cardinality span name for ``path``: namespace and object names become placeholders."""
    m = _NAMES.match(path)
    if m is None:
        return path
    ns = "/namespaces/{namespace}" if m.group(2) else ""
    name = "/{name}" if m.group(4) else ""
    return f"{m.group(1)}{ns}{m.group(3)}{name}{path[m.end() :]}"


def _span(scope: Scope, rid: str) -> contextlib.AbstractContextManager[object]:
    """The request's server span: the root of the trace a create continues on its object (ADR-0032).
    Nothing is built when tracing is off (the create path is measured against a bare route)."""
    if not tracing.enabled():
        return _NO_SPAN
    method, path = scope["method"], scope["path"]
    attributes = {"http.request.method": method, "url.path": path, "nodus.request_id": rid}
    return tracing.server_span(f"{method} {route_of(path)}", Headers(scope=scope), attributes)


class RequestContext:
    """ASGI middleware, outermost of the app's: request id, access log, 500 InternalError on a crash."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_from(Headers(scope=scope).get(HEADER))
        token = tracing.set_request_id(rid)
        body_context, body_token = bodies.enter(scope.get("query_string", b""))
        began = time.perf_counter()
        code = 500
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal code, started
            if message["type"] == "http.response.start":
                started, code = True, int(message["status"])
                headers = MutableHeaders(scope=message)
                headers[HEADER] = rid
                for text in body_context.warnings:
                    headers.append("Warning", bodies.warning_header(text))
                tracing.set_attributes({"http.response.status_code": code})
            await send(message)

        try:
            with _span(scope, rid):
                await self.app(scope, receive, send_with_id)
        except Exception:
            # The traceback goes to the log under this request id, never to the caller.
            log.exception("unhandled error", extra={"method": scope["method"], "path": scope["path"]})
            if started:
                raise
            status = status_for("InternalError", "the server failed unexpectedly; the error is logged")
            await status_response(status)(scope, receive, send_with_id)
        finally:
            _METER.observe(scope["method"], scope["path"], code, time.perf_counter() - began)
            if log.isEnabledFor(logging.INFO):  # the line and its fields are built only when written
                log.info(
                    "%s %s %d",
                    scope["method"],
                    scope["path"],
                    code,
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": code,
                        "durationMs": round((time.perf_counter() - began) * 1000, 1),
                    },
                )
            token.var.reset(token)
            bodies.leave(body_token)
