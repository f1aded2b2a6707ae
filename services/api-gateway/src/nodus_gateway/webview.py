"""The web view (issue #10): static files under ``/ui/``, served by the gateway itself.

=====================  ==============================================================================
path                   answer
=====================  ==============================================================================
GET /ui                308 to ``/ui/`` (the page's relative links need the trailing slash)
GET /ui/               ``web/index.html``: the page; its views are hash routes (``#/sweeps``, ...)
GET /ui/app.js         ``web/app.js``: the script the page loads, an ES module that imports the others
GET /ui/<name>.js      ``web/<name>.js``: the other modules (``api.js``, ``sweep.js``...), plain JavaScript,
                       no framework, no build step
GET /ui/app.css        ``web/app.css``
anything else /ui/...  404 NotFound (a Status, as every error of the gateway)
=====================  ==============================================================================

The files are package data (``nodus_gateway/web``), read once when the app is built, so the page works
offline and a wheel carries it. Every file there whose suffix has a media type below is served, and nothing
else: a module added to the page needs no change here, and a name not in that folder is a 404. They are
public: they hold no data, only code. Every piece of data the page shows comes from the same
``/apis/nodus.dev/v1`` API the CLI calls, with the same bearer token, which the page keeps in the tab's
``sessionStorage`` and sends in the ``Authorization`` header (ADR-0033): no cookie is ever set or read, so a
page on another site cannot make the browser call the API as the user (CSRF).

This is an ASGI middleware rather than routes: it sits between the request context (so a page load has a
request id and an access log line like any request) and authentication (so the files need no token), and
the static paths stay out of the route table that discovery and the OpenAPI documents are read from.
Requests for any other path pass through untouched, for the cost of one prefix check.

Each answer carries a Content-Security-Policy that allows scripts, styles and fetches from this origin only
and no inline script, so an object name or a log line that looks like HTML can never run as code (the
script also only ever writes text nodes), and the token cannot be sent anywhere else.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import PurePosixPath
from typing import Final

from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from nodus_gateway.responding import status_response
from nodus_schema import status_for

PREFIX: Final = "/ui"
MEDIA_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    # Browsers run a module only when it comes with a JavaScript media type (nosniff makes that strict).
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
"""The media type of each kind of file the page is made of: no other file under /ui/ is served."""

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # Revalidate on every load (the ETag makes that a 304): a gateway upgrade shows its new page at once.
    "Cache-Control": "no-cache",
}
NOT_FOUND_FIX: Final = "The web view is at /ui/; its pages are #/sweeps, #/jobs and #/pipelines."


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """The page's files from the package, by name: those of ``web/`` with a media type (MEDIA_TYPES)."""
    folder = resources.files("nodus_gateway").joinpath("web")
    out = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        media_type = MEDIA_TYPES.get(PurePosixPath(entry.name).suffix)
        if media_type is None or entry.name.startswith(".") or not entry.is_file():
            continue  # an editor's backup or a dotfile left there is not part of the page
        body = entry.read_bytes()
        out[entry.name] = Asset(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return out


def is_ui_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def wants_html(scope: Scope) -> bool:
    """A browser's request: its Accept names text/html (kubectl, the SDK and curl's default do not)."""
    accept = next((v for k, v in scope["headers"] if k == b"accept"), b"")
    return b"text/html" in accept


def _root_from_a_browser(scope: Scope) -> bool:
    return (
        scope["type"] == "http"
        and scope["path"] == "/"
        and scope["method"] in ("GET", "HEAD")
        and (wants_html(scope))
    )


class WebView:
    """ASGI middleware: answers ``/ui`` and ``/ui/...`` itself, and a browser's ``GET /`` with a redirect
    to the web view (a JSON client's ``/`` goes on to the list of root paths); passes every other request
    on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.assets = load_assets()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_ui_path(scope["path"]):
            if _root_from_a_browser(scope):
                await RedirectResponse(f"{PREFIX}/", status_code=302)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        await self.respond(scope)(scope, receive, send)

    def respond(self, scope: Scope) -> Response:
        path: str = scope["path"]
        if scope["method"] not in ("GET", "HEAD"):
            status = status_for(
                "MethodNotAllowed",
                f"the web view serves files only: {scope['method']} is not allowed on {path}",
                fix="This path allows GET, HEAD.",
            )
            return status_response(status, headers={"Allow": "GET, HEAD"})
        if path == PREFIX:
            query = scope.get("query_string", b"").decode("latin-1")
            return RedirectResponse(f"{PREFIX}/" + (f"?{query}" if query else ""), status_code=308)
        name = path[len(PREFIX) + 1 :] or "index.html"
        asset = self.assets.get(name)
        if asset is None:
            return status_response(
                status_for("NotFound", f"the web view has no file {path}", fix=NOT_FOUND_FIX)
            )
        headers = {**_HEADERS, "ETag": asset.etag}
        if _matches(scope, asset.etag):
            return Response(status_code=304, headers=headers)
        return Response(asset.body, media_type=asset.media_type, headers=headers)


def _matches(scope: Scope, etag: str) -> bool:
    """Whether the request's If-None-Match names ``etag`` (or is ``*``)."""
    for name, value in scope["headers"]:
        if name == b"if-none-match":
            tags = [t.strip().removeprefix("W/") for t in value.decode("latin-1").split(",")]
            return etag in tags or "*" in tags
    return False
