"""A paged list's rest, kept for its continue token: each page after the first costs its own objects.

A KV bucket has no ordered read of keys from a point (etcd's range read, which Kubernetes pages with), so
a page of a list sorted by key needs every key of the namespace: before this, each page read the whole
namespace again, and a walk of N objects in pages of L read N x N / L messages (200 reads of 100,000 Jobs
for one walk; docs/benchmarks.md, "growth"). Now the first page reads everything once, as before, and the
rows after it (key, stored bytes, revision: the bytes as they came from the stream, decoded only when
their page is served) are kept under the continue token the page hands out. The next page with that
token is served from them and keeps what follows under its own token.

So every page of one walk shows the store as the first page read it, at the first page's resourceVersion,
which is what a continue token means in Kubernetes (a consistent snapshot; the store's pages already
reported that revision). A token whose rows are no longer held (another gateway replica, past
:data:`HOLD_S` unused, or pushed out by :data:`MAX_BYTES` of newer lists) reads the store as before: the
rest of the namespace after the token's key, as it is now.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

import msgspec

from nodus_kit.selecting import Selector

MAX_BYTES: Final = 256 * 2**20
"""Rows held for continue tokens, per store (stored bytes plus :data:`ROW_OVERHEAD` a row): a walk of
100,000 Jobs holds about 150 MB at first, and its rows go as it reaches the end."""
HOLD_S: Final = 120.0
"""How long rows wait unused for their next page: a client walks a list page after page, and one that
comes back later still gets its page, read from the store."""
ROW_OVERHEAD: Final = 120
"""What holding a row costs besides its bytes (the tuple, the key and the revision), for :data:`MAX_BYTES`."""

Row = tuple[str, bytes, int]
"""One object of a list: its key, its stored bytes, its revision."""
Rows = list[Row]
Scope = tuple[str | None, Selector | None]
"""What a list reads: the namespace (None: all) and the label selector."""


class _Labelled(msgspec.Struct):
    labels: dict[str, str] | None = None


class _Object(msgspec.Struct):
    metadata: _Labelled = msgspec.field(default_factory=_Labelled)


_labels = msgspec.json.Decoder(_Object)


def selected(data: bytes, selector: Selector | None) -> bool:
    """Whether a stored object matches the selector, reading its labels alone (not the whole object)."""
    return selector is None or selector.matches(_labels.decode(data).metadata.labels or {})


@dataclass
class _Listing:
    """The rows of one list, sorted by key, shared by every token that points into them."""

    rows: list[Row]
    size: int
    used: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class Rest:
    """The rows after a token: ``rows[start:]``, listed at ``revision``."""

    rows: list[Row]
    start: int
    revision: int


class Held:
    """The rest of each paged list still being walked, by scope and token (see the module's docstring)."""

    def __init__(self, max_bytes: int = MAX_BYTES, hold_s: float = HOLD_S) -> None:
        self.max_bytes, self.hold_s = max_bytes, hold_s
        self._tokens: dict[tuple[Scope, str], tuple[_Listing, int, int]] = {}
        self._listings: OrderedDict[int, _Listing] = OrderedDict()  # by id, least recently used first
        self._bytes = 0

    def get(self, scope: Scope, token: str) -> Rest | None:
        self._expire()
        held = self._tokens.get((scope, token))
        if held is None:
            return None
        listing, start, revision = held
        listing.used = time.monotonic()
        self._listings.move_to_end(id(listing.rows))
        return Rest(listing.rows, start, revision)

    def put(self, scope: Scope, token: str, rows: list[Row], start: int, revision: int) -> None:
        """Hold ``rows[start:]`` for ``token``; ``rows`` may already be held for an earlier page."""
        listing = self._listings.get(id(rows))
        if listing is None or listing.rows is not rows:
            listing = _Listing(rows, sum(len(data) + ROW_OVERHEAD for _, data, _ in rows))
            self._listings[id(rows)] = listing
            self._bytes += listing.size
        self._tokens[(scope, token)] = (listing, start, revision)
        listing.used = time.monotonic()
        self._listings.move_to_end(id(rows))
        self._expire()

    def release(self, rows: list[Row]) -> None:
        """A walk reached its end: its rows go (a token asked again reads the store)."""
        listing = self._listings.get(id(rows))
        if listing is not None and listing.rows is rows:
            self._drop(listing)

    def _expire(self) -> None:
        old = time.monotonic() - self.hold_s
        while self._listings:
            listing = next(iter(self._listings.values()))
            if listing.used >= old and self._bytes <= self.max_bytes:
                return
            self._drop(listing)

    def _drop(self, listing: _Listing) -> None:
        del self._listings[id(listing.rows)]
        self._bytes -= listing.size
        for key in [k for k, (held, _, _) in self._tokens.items() if held is listing]:
            del self._tokens[key]
