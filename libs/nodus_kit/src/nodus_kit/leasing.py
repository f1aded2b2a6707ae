"""Leader election with a KV lease: one active replica per controller, the rest warm.

The lease is a message in the ``leases`` bucket with a per-message TTL (nats-server 2.11): if the holder
dies, the server removes its message when the TTL runs out and another replica's compare-and-set create
wins. The holder renews well inside the TTL with a compare-and-set on its own revision, so a replica
that was paused past its TTL finds its revision gone and steps down instead of acting as a second leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js.errors import APIError, NotFoundError

from nodus_kit import measuring
from nodus_kit.cancelling import cancel_and_wait
from nodus_kit.configuring import Env

log = logging.getLogger(__name__)
STREAM = "KV_leases"
PREFIX = "$KV.leases."
WRONG_LAST_SEQUENCE = (10071, 10164)


DEFAULT_TTL_S = 15
TTL_ENV = "NODUS_LEASE_TTL_S"
RESYNC_ENV = "NODUS_RESYNC_S"


class LeaderSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What every service whose controllers run on the lease's leader reads (the scheduler, billing, the
    sweep controller): a service's own settings Struct extends it (``nodus_kit.configuring``)."""

    lease_ttl_s: Annotated[int, msgspec.Meta(ge=1), Env(TTL_ENV, "seconds")] = DEFAULT_TTL_S
    """The lease's TTL, whole seconds (the server's TTL granularity): a standby takes over within about one
    TTL of the leader's death, and a leader that cannot renew for two thirds of it steps down. Shorter
    fails over sooner and renews more often (one KV write per third of it)."""
    resync_s: Annotated[float, msgspec.Meta(gt=0), Env(RESYNC_ENV, "seconds")] = 30.0
    """How often the leader's controllers queue every object not settled again (``Controller.resync_s``)."""


class LeaseRecord(msgspec.Struct, rename="camel"):
    holder: str
    acquired_unix_ms: int
    renewed_unix_ms: int


class Lease:
    def __init__(self, nc: NATS, name: str, holder: str, *, ttl_s: int = DEFAULT_TTL_S) -> None:
        if ttl_s < 1:
            raise ValueError("a lease TTL is whole seconds, at least 1 (the server's TTL granularity)")
        self.js = nc.jetstream()
        self.subject = PREFIX + name
        self.name, self.holder, self.ttl_s = name, holder, ttl_s
        self.revision: int | None = None
        self._acquired_ms = 0

    @property
    def held(self) -> bool:
        return self.revision is not None

    async def current_holder(self) -> str | None:
        msg = await self._last()
        if msg is None or _is_marker(msg):
            return None
        return msgspec.json.decode(msg.data, type=LeaseRecord).holder

    async def try_acquire(self) -> bool:
        """One attempt: take a free lease, or renew our own. False if someone else holds it."""
        msg = await self._last()
        if msg is not None and not _is_marker(msg):
            record = msgspec.json.decode(msg.data, type=LeaseRecord)
            if record.holder != self.holder:
                self.revision = None
                return False
        last = 0 if msg is None else int(msg.seq)
        if msg is None or _is_marker(msg):
            self._acquired_ms = _now_ms()
        return await self._write(last)

    async def renew(self) -> bool:
        if self.revision is None:
            return False
        return await self._write(self.revision)

    async def release(self) -> None:
        """Give the lease up now (graceful shutdown), so a warm replica need not wait for the TTL."""
        if self.revision is None:
            return
        with contextlib.suppress(APIError):
            await self.js.publish(
                self.subject,
                b"",
                headers={
                    "KV-Operation": "PURGE",
                    "Nats-Rollup": "sub",
                    "Nats-Expected-Last-Subject-Sequence": str(self.revision),
                },
            )
        self.revision = None

    async def _write(self, last: int) -> bool:
        now = _now_ms()
        body = msgspec.json.encode(LeaseRecord(self.holder, self._acquired_ms or now, now))
        headers = {"Nats-Expected-Last-Subject-Sequence": str(last), "Nats-TTL": f"{self.ttl_s}s"}
        try:
            ack = await self.js.publish(self.subject, body, headers=headers)
        except APIError as e:
            if e.err_code in WRONG_LAST_SEQUENCE:
                self.revision = None
                return False
            raise
        self.revision = int(ack.seq)
        return True

    async def _last(self) -> Any:
        try:
            return await self.js.get_msg(STREAM, subject=self.subject, direct=True)
        except NotFoundError:
            return None


async def run_as_leader(
    lease: Lease,
    work: Callable[[], Coroutine[Any, Any, None]],
    *,
    stop: asyncio.Event,
    poll_s: float | None = None,
) -> None:
    """Wait for the lease, run ``work`` while holding it, cancel it the moment the lease is lost.

    Loops until ``stop`` is set: a replica that lost the lease goes back to waiting (warm standby).
    """
    poll = poll_s if poll_s is not None else max(0.2, lease.ttl_s / 4)
    while not stop.is_set():
        try:
            acquired = await lease.try_acquire()
        except Exception as e:
            log.warning("lease attempt failed: %s", e, extra={"lease": lease.name})
            acquired = False
        if not acquired:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), poll)
            continue
        log.info("lease acquired", extra={"lease": lease.name, "holder": lease.holder})
        task = asyncio.create_task(work(), name=f"leader:{lease.name}")
        measuring.LEADER.labels(lease.name).set(1)
        try:
            await _hold(lease, task, stop, renew_every=lease.ttl_s / 3)
        finally:
            measuring.LEADER.labels(lease.name).set(0)
            await cancel_and_wait([task])
        if stop.is_set():
            await lease.release()


async def _hold(lease: Lease, task: asyncio.Task[None], stop: asyncio.Event, renew_every: float) -> None:
    deadline = time.monotonic() + lease.ttl_s
    while not stop.is_set() and not task.done():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), renew_every)
        if stop.is_set():
            return
        try:
            if await lease.renew():
                deadline = time.monotonic() + lease.ttl_s
                continue
            log.warning("lease lost", extra={"lease": lease.name})
            return
        except Exception as e:
            # Cannot reach the server: keep working only while our last renewal is surely still valid.
            if time.monotonic() >= deadline - renew_every:
                log.warning("lease renewal failing (%s); stepping down", e, extra={"lease": lease.name})
                return


def _is_marker(msg: Any) -> bool:
    h = msg.headers or {}
    return bool(h.get("KV-Operation") or h.get("Nats-Marker-Reason"))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
