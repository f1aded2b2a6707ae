"""Leader election over a KV lease with per-message TTL, against a real nats-server."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS

from nodus_kit.leasing import Lease, run_as_leader
from nodus_testing.waiting import eventually


async def test_only_one_replica_holds_the_lease(nc: NATS, unique: str) -> None:
    a, b = Lease(nc, unique, "a", ttl_s=2), Lease(nc, unique, "b", ttl_s=2)
    results = await asyncio.gather(a.try_acquire(), b.try_acquire())
    assert sorted(results) == [False, True]
    holder = await a.current_holder()
    assert holder in ("a", "b") and (a.held if holder == "a" else b.held)


async def test_renewal_keeps_it_and_release_hands_it_over(nc: NATS, unique: str) -> None:
    a, b = Lease(nc, unique, "a", ttl_s=5), Lease(nc, unique, "b", ttl_s=5)
    assert await a.try_acquire()
    assert await a.renew()
    assert not await b.try_acquire()
    await a.release()
    assert await b.try_acquire()  # at once, without waiting for the TTL
    assert not await a.renew()  # the old holder's revision is gone: it must step down


async def test_a_dead_holders_lease_expires_by_ttl(nc: NATS, unique: str) -> None:
    a, b = Lease(nc, unique, "a", ttl_s=1), Lease(nc, unique, "b", ttl_s=1)
    assert await a.try_acquire()  # then "a" dies: it never renews
    await eventually(b.try_acquire, deadline_s=8, interval_s=0.1, message="the TTL never freed the lease")
    assert await b.current_holder() == "b"


async def test_run_as_leader_fails_over_to_the_warm_replica(nc: NATS, unique: str) -> None:
    running: list[str] = []

    def worker(name: str):  # type: ignore[no-untyped-def]
        async def work() -> None:
            running.append(name)
            await asyncio.Event().wait()

        return work

    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    la, lb = Lease(nc, unique, "a", ttl_s=1), Lease(nc, unique, "b", ttl_s=1)
    ta = asyncio.create_task(run_as_leader(la, worker("a"), stop=stop_a, poll_s=0.1))
    await eventually(lambda: running == ["a"], message="a never led")
    tb = asyncio.create_task(run_as_leader(lb, worker("b"), stop=stop_b, poll_s=0.1))
    stop_a.set()  # graceful stop: a releases, b takes over
    await ta
    await eventually(lambda: running == ["a", "b"], message=f"no failover: {running}")
    stop_b.set()
    await tb
