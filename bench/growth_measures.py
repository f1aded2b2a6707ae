"""What the growth benchmark measures at each size: lists, watch fan-out and reconcile lag.

* **Lists** through the gateway: a walk of ``limit=500`` pages along the continue tokens (each page's
  latency, and the whole walk's time per object), and a GET without a limit (its latency per object).
* **Watch fan-out**: :data:`WATCHERS` clients each hold ``GET ...?watch=true`` open from a list's
  resourceVersion; one Job's label is changed through the store, and the time runs until the last of
  them has read the change. Each client reads raw bytes and looks for the change's unique label value, so
  the bench's own JSON decoding is not in the measure.
* **Reconcile lag**: a Suspended Job is cancelled through the store (``spec.state``, as a PATCH through
  the gateway writes it) and the time runs until the scheduler's write of phase Cancelled, and until
  billing's write of its final cost, seen on a watch of that one key.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
import msgspec

from bench.growth_stack import headers, jobs_path
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job

PAGE: Final = 500
WATCHERS: Final = 100
WALK_CAP_S: Final = 120.0
"""A walk of pages stops after this long (the pages measured so far count): before the listing fix of this
issue a walk of 100,000 Jobs read the whole namespace for every page, 200 times."""
WAIT_S: Final = 60.0


def p99(values: list[float]) -> float:
    """Nearest rank: the smallest value that at least 99% of the values do not exceed."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass
class Walk:
    pages: list[float] = field(default_factory=list)  # seconds per page
    objects: int = 0
    seconds: float = 0.0
    complete: bool = True


async def walk(http: httpx.AsyncClient, namespace: str | None) -> Walk:
    """Every page of the list, ``limit=500``, following the continue tokens."""
    out = Walk()
    params: dict[str, str | int] = {"limit": PAGE}
    began = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        resp = await http.get(jobs_path(namespace), params=params)
        out.pages.append(time.perf_counter() - t0)
        resp.raise_for_status()
        body = msgspec.json.decode(resp.content)
        out.objects += len(body["items"])
        token = body["metadata"].get("continue")
        if not token:
            break
        if time.perf_counter() - began > WALK_CAP_S:
            out.complete = False
            break
        params = {"limit": PAGE, "continue": token}
    out.seconds = sum(out.pages)
    return out


async def whole(http: httpx.AsyncClient, namespace: str | None) -> tuple[float, int]:
    """One GET without a limit: its seconds and the objects it returned."""
    t0 = time.perf_counter()
    resp = await http.get(jobs_path(namespace))
    seconds = time.perf_counter() - t0
    resp.raise_for_status()
    return seconds, len(msgspec.json.decode(resp.content)["items"])


class _Watcher:
    """One watch client on its own connection: HTTP/1.1 by hand, the body read as raw bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.seen: asyncio.Event = asyncio.Event()
        self.marker = b""

    @classmethod
    async def open(cls, base: str, namespace: str, rv: str) -> _Watcher:
        url = urlsplit(base)
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        auth = headers()["Authorization"]
        path = f"{jobs_path(namespace)}?watch=true&resourceVersion={rv}"
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: {auth}\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"watch refused: {head[:200]!r}")
        return cls(reader, writer)

    async def read(self) -> None:
        tail = b""
        while data := await self.reader.read(65536):
            buf = tail + data
            if self.marker and self.marker in buf:
                self.seen.set()
            tail = buf[-64:]

    def expect(self, marker: bytes) -> None:
        self.marker = marker
        self.seen = asyncio.Event()

    def close(self) -> None:
        self.writer.close()


async def fan_out(base: str, jobs: ObjectStore[Job], namespace: str, name: str, updates: int) -> list[float]:
    """Seconds from each label change of one Job until all :data:`WATCHERS` watch clients read it."""
    rv = str(await jobs.last_revision())
    watchers = await asyncio.gather(*(_Watcher.open(base, namespace, rv) for _ in range(WATCHERS)))
    readers = [asyncio.create_task(w.read()) for w in watchers]
    out: list[float] = []
    try:
        for _ in range(updates):
            value = secrets.token_hex(6)
            for w in watchers:
                w.expect(f'"probe":"{value}"'.encode())
            t0 = time.perf_counter()
            await jobs.mutate(namespace, name, _labelled(value))
            await asyncio.wait_for(asyncio.gather(*(w.seen.wait() for w in watchers)), WAIT_S)
            out.append(time.perf_counter() - t0)
    finally:
        for task in readers:
            task.cancel()
        for w in watchers:
            w.close()
        await asyncio.gather(*readers, return_exceptions=True)
    return out


def _labelled(value: str) -> Callable[[Job], Job]:
    def change(job: Job) -> Job:
        meta = msgspec.structs.replace(job.metadata, labels={**job.metadata.labels, "probe": value})
        return msgspec.structs.replace(job, metadata=meta)

    return change


def _cancelled(job: Job) -> Job:
    return msgspec.structs.replace(job, spec=msgspec.structs.replace(job.spec, state="Cancelled"))


async def lag(jobs: ObjectStore[Job], namespace: str, name: str) -> tuple[float, float]:
    """Seconds from cancelling a Suspended Job until the scheduler wrote phase Cancelled, and until
    billing wrote its final cost; :data:`WAIT_S` (a lower bound) for a write not seen by then."""
    current = await jobs.get(namespace, name)
    rv = int(current.metadata.resource_version or 0)
    scheduler = billing = 0.0
    async with jobs.watch(namespace, resource_version=rv, name=name) as w:
        t0 = time.perf_counter()
        await jobs.mutate(namespace, name, _cancelled)
        end = time.monotonic() + WAIT_S
        while not (scheduler and billing):
            try:
                event = await w.next(timeout=max(0.01, end - time.monotonic()))
            except TimeoutError:
                return scheduler or WAIT_S, billing or WAIT_S
            status: Any = event.object.status
            if not scheduler and status.phase == "Cancelled":
                scheduler = time.perf_counter() - t0
            if not billing and status.cost is not None and status.cost.final:
                billing = time.perf_counter() - t0
    return scheduler, billing
