"""Watch streams: ``?watch=true`` on a list route, as Kubernetes serves them.

The response is newline-delimited JSON WatchEvents (``{"type": "ADDED", "object": {...}}``) with
``Content-Type: application/json``, which is what the apiserver sends and what kubectl and client-go read.
Without a resourceVersion (or with "0") the stream starts with the current objects as ADDED events.

A resourceVersion older than the store's history is an event, not an HTTP status, as in Kubernetes: a
200 stream whose only event is ``{"type": "ERROR", "object": <Status 410 Expired>}`` (the apiserver's
watch cache answers so, and clients handle one path: relist on an ERROR event). Bad parameters are 400s
before any stream; an error after the stream started is its last event, an ERROR with the Status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import nats.errors
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from nodus_gateway import versions
from nodus_gateway.responding import JSON, ApiError, bus_unavailable
from nodus_gateway.selecting import FieldSelector
from nodus_kit import errors as kit
from nodus_kit.selecting import Selector
from nodus_kit.storing import ObjectStore
from nodus_schema import API_VERSION, Status, WatchEvent, encode, status_for

log = logging.getLogger(__name__)

BOOKMARK_INTERVAL_S: float = 10.0
"""With allowWatchBookmarks, a BOOKMARK comes after this long without an event (a module variable, so a
test can shorten it). Kubernetes sends them about once a minute; a shorter interval lets a client that
reconnects resume from a recent resourceVersion even on a quiet namespace."""
# How often a quiet stream looks up from its store watch: to see a deadline pass or the client go.
_TICK_S: Final = 1.0
# The shortest wait handed to the store watch: NATS' next_msg with a zero timeout never returns a message.
_MIN_WAIT_S: Final = 0.01


@dataclass(slots=True)
class WatchRequest:
    """A watch, parsed and checked: what to watch, from where, through which filters, for how long."""

    store: ObjectStore[Any]
    kind: str
    namespace: str | None
    resource_version: int | None
    labels: Selector | None = None
    fields: FieldSelector | None = None
    namespaces: frozenset[str] | None = None
    """The projects the caller may see (an all-namespaces watch); None: all."""
    timeout_s: float | None = None
    bookmarks: bool = False
    redact: Callable[[Any], Any] = lambda obj: obj
    """Write-only fields out of every object that leaves the API (the resource row's ``redact``)."""
    _matched: set[tuple[str, str]] = field(default_factory=set)
    """Objects last sent as matching the selectors: a change that makes one stop matching is a DELETED,
    one that makes a new one match an ADDED, as the apiserver's watch cache reports them."""

    def visible(self, obj: Any) -> bool:
        return self.namespaces is None or obj.metadata.namespace in self.namespaces

    def selected(self, obj: Any) -> bool:
        labels_ok = self.labels is None or self.labels.matches(obj.metadata.labels or {})
        return labels_ok and (self.fields is None or self.fields.matches(obj))


def parse_resource_version(value: str | None) -> int | None:
    """A watch's resourceVersion: absent and "0" both mean "from the current state" (None); a value this
    server never issued (versions.py) is a 400."""
    if value is None or value in ("", "0"):
        return None
    revision = versions.parse_resource_version(value)
    if revision is None:
        raise ApiError.of(
            "BadRequest",
            f'resourceVersion "{value}" is not one this server issued: it is an opaque value, copy it '
            "from a list or an object",
            fix="Watch without a resourceVersion, or from metadata.resourceVersion of a list.",
        )
    return revision


async def watch_response(request: Request, wr: WatchRequest) -> Response:
    """The streaming response of a watch. The store watch is open before the response starts, so a
    client that has the 200 sees every change made after it, as with Kubernetes' watch."""
    # The pinned name narrows the store watch to one key; it needs the namespace, the key's first token.
    name = wr.fields.exact_name() if wr.fields is not None and wr.namespace is not None else None
    watch = wr.store.watch(wr.namespace, resource_version=wr.resource_version, name=name)
    try:
        await watch.start()
    except kit.Expired as e:
        await watch.stop()
        return StreamingResponse(_only(_error_line(e)), media_type=JSON)
    except BaseException:
        await watch.stop()
        raise  # before the stream: an HTTP error (503 when NATS does not answer)
    return _WatchResponse(watch, _stream(request, wr, watch))


class _WatchResponse(StreamingResponse):
    """A StreamingResponse that stops its store watch however the response ends: finished, failed, or
    cancelled because the client went away (then the stop must run shielded from that cancellation, or
    the NATS consumer behind the watch would outlive the request)."""

    def __init__(self, watch: Any, lines: AsyncIterator[bytes]) -> None:
        super().__init__(lines, media_type=JSON)
        self._watch = watch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._watch.stop()


async def _only(line: bytes) -> AsyncIterator[bytes]:
    yield line


async def _stream(request: Request, wr: WatchRequest, watch: Any) -> AsyncIterator[bytes]:
    try:
        async for line in _events(request, wr, watch):
            yield line
    except (kit.Expired, nats.errors.Error) as e:
        yield _error_line(e)
    except Exception as e:
        # The headers are sent: a crash can only be told as the stream's last event (and in the log).
        log.exception("watch stream failed", extra={"kind": wr.kind, "namespace": wr.namespace})
        yield _error_line(e)


async def _events(request: Request, wr: WatchRequest, watch: Any) -> AsyncIterator[bytes]:
    """The stream's lines until the timeout, the client leaving, or an error (the last line)."""
    loop = asyncio.get_running_loop()
    end = None if wr.timeout_s is None else loop.time() + wr.timeout_s
    bookmark_at = loop.time() + BOOKMARK_INTERVAL_S
    while True:
        now = loop.time()
        if end is not None and now >= end:
            return  # timeoutSeconds: end the stream cleanly; the client watches again from its last rv
        wakes = [now + _TICK_S]
        if wr.bookmarks:
            wakes.append(bookmark_at)
        if end is not None:
            wakes.append(end)
        wake = min(wakes)
        try:
            event = await watch.next(timeout=max(wake - now, _MIN_WAIT_S))
        except TimeoutError:
            if await request.is_disconnected():
                return
            if wr.bookmarks and loop.time() >= bookmark_at:
                bookmark_at = loop.time() + BOOKMARK_INTERVAL_S
                yield _line("BOOKMARK", _bookmark(wr.kind, watch.last))
            continue
        line = _filtered(wr, event)
        if line is not None:
            bookmark_at = loop.time() + BOOKMARK_INTERVAL_S
            yield line


def _filtered(wr: WatchRequest, event: Any) -> bytes | None:
    """The event as the caller's selectors see it (None: not for this caller)."""
    obj = event.object
    if not wr.visible(obj):
        return None
    key = (obj.metadata.namespace or "", obj.metadata.name or "")
    was, now = key in wr._matched, wr.selected(obj)
    kind = event.type
    if kind == "DELETED":
        wr._matched.discard(key)
        return _line(kind, wr.redact(obj)) if now or was else None
    if not now:
        if was:  # it stopped matching: for this caller it is gone
            wr._matched.discard(key)
            return _line("DELETED", wr.redact(obj))
        return None
    wr._matched.add(key)
    if kind == "MODIFIED" and not was and _knows_all(wr):
        kind = "ADDED"  # it started matching: for this caller it is new
    return _line(kind, wr.redact(obj))


def _knows_all(wr: WatchRequest) -> bool:
    """Whether every matching object was sent since the start: only then is "not sent yet" the same as
    "did not match before". From a resourceVersion the earlier matches are unknown, so a change of an
    object not seen yet stays a MODIFIED."""
    return wr.resource_version is None


def _bookmark(kind: str, revision: int) -> dict[str, Any]:
    """A BOOKMARK's object: only apiVersion, kind and the resourceVersion to resume from, as Kubernetes'."""
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"resourceVersion": str(revision)}}


def _line(kind: str, obj: Any) -> bytes:
    return encode(WatchEvent(type=kind, object=obj)) + b"\n"


def _error_line(err: Exception) -> bytes:
    return _line("ERROR", error_status(err))


def error_status(err: Exception) -> Status:
    """The Status an ERROR event carries for what stopped a watch."""
    if isinstance(err, kit.Expired):
        return status_for("Expired", str(err))
    if isinstance(err, nats.errors.Error):
        return bus_unavailable(err).status
    return status_for("InternalError", "the watch failed unexpectedly; the error is logged")
