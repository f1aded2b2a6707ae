"""Live views: the API's watch as a stream of changes, and the tables and frames ``get -w`` draws from it.

:func:`changes` lists (or gets) once, then follows ``?watch=true&resourceVersion=...`` (newline-delimited
WatchEvents, gateway watching.py) from where the list ended: a stream the server ends is watched again
from the last resourceVersion seen (BOOKMARKs keep it fresh), an ERROR 410 Expired relists, and a kind the
gateway does not watch (secrets, nodes, offerings) is polled. On a terminal the view is redrawn in place
with ANSI escapes; into a pipe or a file only what changed is written, as ``kubectl get -w`` does.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

import msgspec

from nodus_cli import printing
from nodus_cli.client import ApiError
from nodus_cli.kinds import Kind
from nodus_cli.requesting import Requests
from nodus_cli.tables import table
from nodus_schema import Status

POLL_INTERVAL_S: float = 1.0
"""How often a kind without a server watch is listed again."""
RESET: Final = "RESET"
"""Forget what was seen: a relist follows (after a 410, or before the first list)."""
SYNCED: Final = "SYNCED"
"""Every object of the (re)list has been sent: the view is complete."""
TICK: Final = "TICK"
"""A watch stream ended (its timeoutSeconds, or the server closed it): time to look at the clock."""
EXPIRED_CODE: Final = 410


@dataclass(frozen=True, slots=True)
class Change:
    type: str
    """ADDED, MODIFIED, DELETED, or one of RESET, SYNCED, TICK."""
    obj: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        meta = self.obj.get("metadata") or {}
        return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _rv(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def changes(
    api: Requests,
    kind: Kind,
    namespace: str,
    *,
    name: str | None = None,
    selector: str | None = None,
    timeout_s: Callable[[], float | None] = lambda: None,
    poll_s: float = POLL_INTERVAL_S,
    start: dict[str, Any] | None = None,
) -> Iterator[Change]:
    """Every change of the objects (one object with ``name``), forever: the caller stops iterating.

    ``timeout_s`` is asked before each watch request: a number ends that stream after about as long
    (a TICK follows), so a caller waiting for a deadline gets to look at the clock. ``start`` is the one
    object as the caller already has it (what its create returned): it is the first state, and the watch
    follows from its resourceVersion, so no state after it is missed and none before it is shown (a first
    get could already find a later one).
    """
    if not kind.watchable:
        yield from _polled(api, kind, namespace, name=name, selector=selector, poll_s=poll_s)
        return
    params: dict[str, str] = {"allowWatchBookmarks": "true"}
    if selector:
        params["labelSelector"] = selector
    if name:
        params["fieldSelector"] = f"metadata.name={name}"
    while True:
        yield Change(RESET)
        rv: str | None
        if start is not None and _rv(start):
            yield Change("ADDED", start)
            rv, start = _rv(start), None
        else:
            rv = yield from _listed(api, kind, namespace, name=name, selector=selector)
        yield Change(SYNCED)
        while rv is not None:
            rv = yield from _watched(api, kind, namespace, {**params, "resourceVersion": rv}, timeout_s())
            yield Change(TICK)


def _listed(
    api: Requests, kind: Kind, namespace: str, *, name: str | None, selector: str | None
) -> Generator[Change, None, str]:
    """The current objects as ADDED; returns the resourceVersion to watch from."""
    if name:
        obj = api.get(kind, namespace, name)  # NotFound is the caller's error, as with a plain get
        yield Change("ADDED", obj)
        return _rv(obj)
    listed = api.list(kind, namespace, {"labelSelector": selector} if selector else None)
    for item in listed.get("items") or []:
        yield Change("ADDED", item)
    return str((listed.get("metadata") or {}).get("resourceVersion") or "0")


def _watched(
    api: Requests, kind: Kind, namespace: str, params: dict[str, str], timeout: float | None
) -> Generator[Change, None, str | None]:
    """One watch request's events; returns the last resourceVersion, or None when it must relist."""
    rv: str | None = params["resourceVersion"]
    if timeout is not None:
        params = {**params, "timeoutSeconds": str(max(1, int(timeout + 0.999)))}
    for event in api.watch(kind, namespace, params):
        kind_of, obj = str(event.get("type") or ""), event.get("object") or {}
        if kind_of == "ERROR":
            status = msgspec.convert(obj, Status)
            if status.code == EXPIRED_CODE:
                return None
            raise ApiError(status)
        rv = _rv(obj) or rv
        if kind_of != "BOOKMARK":
            yield Change(kind_of, obj)
    return rv


def _polled(
    api: Requests, kind: Kind, namespace: str, *, name: str | None, selector: str | None, poll_s: float
) -> Iterator[Change]:
    """A watch made of lists, for kinds the gateway does not watch: what changed since the last list."""
    seen: dict[tuple[str, str], str] = {}
    yield Change(RESET)
    first = True
    while True:
        current: dict[tuple[str, str], dict[str, Any]] = {}
        for change in _listed(api, kind, namespace, name=name, selector=selector):
            current[change.key] = change.obj
        for key, obj in current.items():
            if key not in seen:
                yield Change("ADDED", obj)
            elif seen[key] != _rv(obj):
                yield Change("MODIFIED", obj)
        for key in seen.keys() - current.keys():
            yield Change("DELETED", {"metadata": {"namespace": key[0], "name": key[1]}})
        seen = {key: _rv(obj) for key, obj in current.items()}
        if first:
            yield Change(SYNCED)
            first = False
        yield Change(TICK)
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------------------


class Screen:
    """Redraws a block of text in place on a terminal: the cursor goes back up over the last block and
    clears to the end of the screen. A block taller than the terminal clears the whole screen instead
    (the cursor cannot go up past the top)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.lines = 0

    def draw(self, text: str) -> None:
        height = shutil.get_terminal_size((80, 24)).lines
        count = text.count("\n") + 1
        if self.lines and max(self.lines, count) < height:
            prefix = f"\x1b[{self.lines}F\x1b[J"
        elif self.lines:
            prefix = "\x1b[H\x1b[2J"
        else:
            prefix = ""
        self.out.write(prefix + text + "\n")
        self.out.flush()
        self.lines = count


class LiveTable:
    """``get KIND -w``: the objects as a table, kept current from :class:`Change`s.

    On a terminal the whole table is redrawn in place on every change; otherwise the table is printed
    once when the first list is complete and then each changed row on a line of its own (a deleted
    object's last row too), in the first table's column widths, as kubectl prints them.
    """

    def __init__(
        self, kind: Kind, *, wide: bool, out: TextIO | None = None, err: TextIO | None = None
    ) -> None:
        self.kind, self.wide = kind, wide
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.tty = self.out.isatty()
        self.rows: dict[tuple[str, str], list[str]] = {}
        self.synced = False
        self.widths: list[int] = []
        self.screen = Screen(self.out)

    def apply(self, change: Change) -> None:
        if change.type == RESET:
            self.rows.clear()
            return
        if change.type == TICK:
            return
        if change.type == SYNCED:
            first = not self.synced
            self.synced = True
            if first or self.tty:
                self._draw_all()
            return
        row = self._row(change.obj) if change.type != "DELETED" else self.rows.get(change.key)
        if change.type == "DELETED":
            self.rows.pop(change.key, None)
        elif row is not None:
            self.rows[change.key] = row
        if not self.synced:
            return
        if self.tty:
            self._draw_all()
        elif row is not None:
            self._print_row(row)

    def _row(self, obj: dict[str, Any]) -> list[str] | None:
        typed = _typed(self.kind, obj)
        return None if typed is None else printing.row(self.kind, typed, wide=self.wide)

    def _draw_all(self) -> None:
        heads = printing.headers(self.kind, wide=self.wide)
        rows = [self.rows[k] for k in sorted(self.rows)]
        if self.tty:
            self.screen.draw(table(heads, rows))
            return
        if not rows:
            # As kubectl: nothing to show yet; the header comes with the first row, in its widths.
            self.err.write(f"No {self.kind.plural} found; watching for them.\n")
            self.err.flush()
            return
        self.widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(heads)]
        self.out.write(table(heads, rows) + "\n")
        self.out.flush()

    def _print_row(self, row: list[str]) -> None:
        if not self.widths:  # the first row: with the header, in the widths of both
            heads = printing.headers(self.kind, wide=self.wide)
            self.widths = [max(len(h), len(c)) for h, c in zip(heads, row, strict=True)]
            self.out.write(table(heads, [row]) + "\n")
            self.out.flush()
            return
        widths = self.widths
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
        self.out.write(line + "\n")
        self.out.flush()


def _typed(kind: Kind, raw: dict[str, Any]) -> Any:
    try:
        return msgspec.convert(raw, kind.object_type)
    except msgspec.ValidationError:
        return None  # a shape this CLI cannot read: not drawn rather than ending the watch
