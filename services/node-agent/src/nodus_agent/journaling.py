"""The simulated fleet's journal: what its nodes ran, run and ran, as JSON lines fsynced once per batch.

It plays the part of the real agent's ``record.json`` files (``nodus_agent.attemptdir``) for a whole fleet
in one file: appended, fsynced once per batch, compacted at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from nodus_agent.attemptdir import Record

log = logging.getLogger(__name__)


class Entry(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """One line of the journal: an attempt's record from now on, or the mark that its finish was sent."""

    namespace: str
    attempt: str
    node: str
    record: Record | None = None
    reported: bool = False


@dataclass(slots=True)
class Known:
    node: str
    record: Record


class Journal:
    """The fleet's durable memory: JSON lines, appended, fsynced once per batch, compacted at start.

    It plays the part of the real agent's ``record.json`` files: what a node ran, runs and ran."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._encoder = msgspec.json.Encoder()
        self._file: Any = None
        self._written = 0  # durable entries appended
        self._synced = 0  # of those, how many an fsync has covered
        self._flight: asyncio.Task[None] | None = None  # the fsync under way, shared by every caller

    def load(self) -> dict[tuple[str, str], Known]:
        """Fold the journal into the latest record per attempt, and rewrite it as just that."""
        known: dict[tuple[str, str], Known] = {}
        decoder = msgspec.json.Decoder(Entry)
        if self.path.exists():
            with self.path.open("rb") as f:
                for n, line in enumerate(f, 1):
                    try:
                        e = decoder.decode(line)
                    except msgspec.DecodeError:
                        # Only the last line can be torn (a crash mid-append): everything before it holds.
                        log.warning(
                            "journal line %d unreadable: skipped", n, extra={"journal": str(self.path)}
                        )
                        continue
                    key = (e.namespace, e.attempt)
                    if e.record is not None:
                        known[key] = Known(e.node, e.record)
                    elif e.reported and key in known:
                        rec = known[key].record
                        known[key].record = msgspec.structs.replace(rec, reported=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            for (ns, attempt), k in known.items():
                f.write(self._line(Entry(namespace=ns, attempt=attempt, node=k.node, record=k.record)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._file = self.path.open("ab")
        return known

    def _line(self, entry: Entry) -> bytes:
        return self._encoder.encode(entry) + b"\n"

    def append(self, entry: Entry, *, durable: bool = True) -> None:
        """Append; ``durable`` entries make the next :meth:`sync` write to disk (others ride along)."""
        self._file.write(self._line(entry))
        if durable:
            self._written += 1

    async def sync(self) -> None:
        """Return once every durable entry appended so far is on disk (fsync off the event loop).

        Callers share fsyncs (a group commit): the first starts one as a task of its own, which begins only
        after the tasks already waiting to run have had their turn. The handlers of one fetched batch of
        assignments run side by side and each appends before it syncs, so the whole batch shares that one
        fsync, and all of them wake together when it ends (their acknowledgements leave in one write)."""
        target = self._written
        while self._synced < target:
            if self._flight is None:
                self._flight = asyncio.create_task(self._fsync(), name="journal:fsync")
                # Its callers may all be cancelled (a halt): its error is then nobody's to raise.
                self._flight.add_done_callback(lambda t: t.cancelled() or t.exception())
            await asyncio.shield(self._flight)  # a cancelled caller leaves the others their fsync

    async def _fsync(self) -> None:
        try:
            mark = self._written
            self._file.flush()
            await asyncio.to_thread(os.fsync, self._file.fileno())
            self._synced = mark
        finally:
            self._flight = None

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(Exception):
                self._file.flush()
            self._file.close()
            self._file = None
