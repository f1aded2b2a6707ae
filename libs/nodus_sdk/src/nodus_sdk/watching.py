"""Watches as the clients iterate them: typed events, resumed after a dropped connection, relisted on 410.

The gateway streams newline-delimited WatchEvents (``{"type": "ADDED", "object": {...}}``). This module is
the state both clients' iterators share, free of I/O: it reads lines into :class:`Event` objects, keeps
the last resourceVersion seen (bookmarks included; they are not yielded), and says what to send when
the connection must be opened again, how long to wait before, and which pages a relist asks for.

* **Resume**: a stream that ends (the server's timeout, a dropped connection, a dead peer the read timeout
  finds) is opened again from the last resourceVersion, so no change is lost. Before the first event of a
  watch started without a resourceVersion there is none, and the server sends the current objects again;
  those already seen at the same resourceVersion are not yielded twice.
* **Relist**: a resourceVersion older than the server's history is answered with an ERROR event, 410
  Expired. The watch then lists again (the same selectors) and yields the difference from what it had
  seen, as Kubernetes' informers do: ADDED for new objects, MODIFIED for changed ones, DELETED (with the
  last state seen) for those gone; each such event has ``relisted=True``, and :attr:`WatchState.relists`
  counts the relists. Then it watches on from the list's resourceVersion.
* **Timeout**: with ``timeout`` the iteration ends (no error) once that many seconds have passed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import httpx
import msgspec

from nodus_schema import ObjectMeta, Status, WatchEvent, status_for
from nodus_sdk.errors import NotFound, ServerError, Unreachable, error_for
from nodus_sdk.requesting import Call, decode_body
from nodus_sdk.resources import PAGE_SIZE, Calls, Kind, Page

T = TypeVar("T")

READ_TIMEOUT_S: Final = 30.0
"""How long a watch waits for a line before it takes the connection for dead and opens another: the
gateway sends a BOOKMARK after 10 s without events (the watch asks for them)."""


@dataclass(frozen=True, slots=True)
class Event(Generic[T]):
    """One change: ``type`` is ADDED, MODIFIED or DELETED, ``object`` the object after it (before it, for
    a DELETED). ``relisted`` marks the events that a relist after 410 made up (the module's notes)."""

    type: str
    object: T
    relisted: bool = False


class _Meta(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class Expired(Exception):
    """The watch's resourceVersion is older than the server's history: list again."""


class WatchState(Generic[T]):
    """What a watch has seen, and what its next connection asks for."""

    def __init__(
        self,
        calls: Calls[T],
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.calls, self.namespace = calls, namespace
        self.label_selector, self.field_selector = label_selector, field_selector
        self.resource_version = resource_version
        self.clock = clock
        self.deadline = None if timeout is None else clock() + timeout
        self.known: dict[tuple[str, str], T] = {}
        self.relists = 0
        self.connections = 0

    # -- the next connection ---------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self.calls.list_page(self.namespace).path

    def params(self) -> dict[str, str]:
        remaining = self.remaining()
        return self.calls.watch_params(
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            resource_version=self.resource_version,
            timeout_seconds=None if remaining is None else max(1, math.ceil(remaining)),
        )

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock()

    def expired(self) -> bool:
        remaining = self.remaining()
        return remaining is not None and remaining <= 0

    def read_timeout(self) -> float:
        remaining = self.remaining()
        return READ_TIMEOUT_S if remaining is None else min(READ_TIMEOUT_S, max(remaining, 0) + 2.0)

    def reconnect_delay(self, error: Exception, delays: Iterator[float]) -> float | None:
        """How long to wait before opening the watch again after ``error`` (the next of ``delays``, not
        past the timeout); None: give up and raise it (not :func:`reconnectable`, or no delay left)."""
        if not reconnectable(error):
            return None
        delay = next(delays, None)
        return None if delay is None else min(delay, max(self.remaining() or delay, 0))

    def relist(self) -> Relist[T]:
        """A relist after :class:`Expired`: the pages of the list with the watch's selectors."""
        return Relist(self)

    # -- what arrives ----------------------------------------------------------------------------------
    def on_line(self, line: str | bytes) -> Event[T] | None:
        """The event of one line, or None (a blank line, a bookmark, an object already seen); raises
        :class:`Expired` for 410 and the NodusError of any other ERROR event."""
        if not line.strip():
            return None
        raw = line.encode() if isinstance(line, str) else line
        event = decode_body(raw, WatchEvent[msgspec.Raw])
        if event.type == "ERROR":
            status = decode_body(bytes(event.object), Status)
            if status.code == 410 or status.reason in ("Expired", "Gone"):
                raise Expired(status.message)
            raise error_for(status)
        if event.type == "BOOKMARK":
            self.resource_version = decode_body(bytes(event.object), _Meta).metadata.resource_version or (
                self.resource_version
            )
            return None
        obj = decode_body(bytes(event.object), self.calls.kind.type)
        meta = _meta(obj)
        self.resource_version = meta.resource_version or self.resource_version
        key = (meta.namespace or "", meta.name or "")
        if event.type == "DELETED":
            self.known.pop(key, None)
            return Event("DELETED", obj)
        seen = self.known.get(key)
        self.known[key] = obj
        if seen is not None and _meta(seen).resource_version == meta.resource_version:
            return None  # sent again after a reconnect without a resourceVersion
        return Event(event.type, obj)

    def on_relisted(self, page: Page[T]) -> list[Event[T]]:
        """The events that bring a consumer from what it saw to the fresh list; the watch goes on from the
        list's resourceVersion."""
        self.relists += 1
        fresh: dict[tuple[str, str], T] = {}
        events: list[Event[T]] = []
        for obj in page.items:
            meta = _meta(obj)
            key = (meta.namespace or "", meta.name or "")
            fresh[key] = obj
            seen = self.known.get(key)
            if seen is None:
                events.append(Event("ADDED", obj, relisted=True))
            elif _meta(seen).resource_version != meta.resource_version:
                events.append(Event("MODIFIED", obj, relisted=True))
        events.extend(
            Event("DELETED", obj, relisted=True) for key, obj in self.known.items() if key not in fresh
        )
        self.known = fresh
        self.resource_version = page.resource_version
        return events


class Relist(Generic[T]):
    """One relist, page after page, free of I/O: a client sends :meth:`next_call` until it is None, gives
    each page to :meth:`add`, and then yields :meth:`events` (:meth:`WatchState.on_relisted`)."""

    def __init__(self, state: WatchState[T]) -> None:
        self.state = state
        self.items: list[T] = []
        self.resource_version: str | None = None
        """The first page's: the list's, where the watch goes on from."""
        self.continue_: str | None = None
        self.pages = 0

    def next_call(self) -> Call[Page[T]] | None:
        """The call of the next page; None once a page came without a continue token."""
        if self.pages and not self.continue_:
            return None
        state = self.state
        return state.calls.list_page(
            state.namespace,
            label_selector=state.label_selector,
            field_selector=state.field_selector,
            limit=PAGE_SIZE,
            continue_=self.continue_,
        )

    def add(self, page: Page[T]) -> None:
        self.pages += 1
        self.items.extend(page.items)
        self.resource_version = self.resource_version or page.resource_version
        self.continue_ = page.continue_

    def events(self) -> list[Event[T]]:
        return self.state.on_relisted(Page(self.items, self.resource_version))


def _meta(obj: Any) -> ObjectMeta:
    meta: ObjectMeta = obj.metadata
    return meta


def meta_rv(obj: Any) -> str | None:
    return _meta(obj).resource_version


def unread(resp: httpx.Response) -> httpx.Response:
    """A streamed call's reader: the response itself, read line by line by the caller."""
    return resp


def reconnectable(e: BaseException) -> bool:
    """A dropped or dead connection, or a 503: open the watch again (a bounded number of times)."""
    if isinstance(e, Unreachable | httpx.TransportError):
        return True
    return isinstance(e, ServerError) and e.code == 503


def gone(kind: Kind[Any], name: str) -> NotFound:
    """The error of a wait whose object was deleted."""
    return NotFound(status_for("NotFound", f'{kind.plural}.nodus.dev "{name}" was deleted', kind=kind.plural))
