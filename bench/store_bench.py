"""ObjectStore against raw nats-py KeyValue, in one process against one nats-server.

Each pair writes the same bytes-sized object: the store adds msgspec encoding of a typed Job, the CAS
header, the Nodus-Op header and revision stamping; the baseline is ``kv.put``/``kv.update`` of the
already-encoded bytes. Watch delivery compares the store's ordered-consumer watch (decoding typed
objects) with nats-py's ``kv.watch`` over the same bucket.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Awaitable, Callable

import msgspec

from bench.running import Result, best_of, bus_auth, rate
from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta
from nodus_testing.natsserver import NatsServer

IN_FLIGHT = 64


def _job(ns: str, i: int) -> Job:
    return Job(
        metadata=ObjectMeta(name=f"job-{i}", namespace=ns, labels={"nodus.dev/sweep": "bench"}),
        spec=JobSpec(image="ghcr.io/nodus/bench:1", command=["python", "train.py"], completions=1),
    )


async def run(n: int) -> list[Result]:
    with NatsServer(auth=bus_auth()) as server:
        nc = await connect(server.url, "bench", nkey_seed=server.harness_seed)
        await declaring.ensure(nc.jetstream())
        store = ObjectStore(nc, "jobs", Job)
        kv = await nc.jetstream().key_value("jobs")
        payload = msgspec.json.encode(_job("x", 0))
        results: list[Result] = []
        round_no = 0

        def ns() -> str:
            nonlocal round_no
            round_no += 1
            return f"r{round_no}"

        async def create_rate() -> float:
            space = ns()
            return await rate(lambda i: store.create(_job(space, i)), n)

        async def put_rate() -> float:
            space = ns()
            return await rate(lambda i: kv.put(f"{space}.job-{i}", payload), n)

        # Interleave baseline and subject so drift in machine load hits both alike.
        put = await best_of(3, put_rate)
        create = await best_of(3, create_rate)
        results.append(Result("ObjectStore.create", "kv.put", create, put, target=0.60))

        results.append(await _concurrent(store, kv, payload, n))
        results.append(await _updates(store, kv, payload, n, ns()))
        results.extend(await _watch(store, kv, n, ns()))
        await nc.close()
    return results


async def _concurrent(store: ObjectStore[Job], kv, payload: bytes, n: int) -> Result:  # type: ignore[no-untyped-def]
    async def many(op) -> float:  # type: ignore[no-untyped-def]
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one(i: int) -> None:
            async with sem:
                await op(i)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - start)

    tag = str(time.monotonic_ns())
    put = await many(lambda i: kv.put(f"c{tag}.p{i}", payload))
    create = await many(lambda i: store.create(_job(f"c{tag}", i)))
    return Result(f"ObjectStore.create, {IN_FLIGHT} in flight", f"kv.put, {IN_FLIGHT} in flight", create, put)


async def _updates(store: ObjectStore[Job], kv, payload: bytes, n: int, space: str) -> Result:  # type: ignore[no-untyped-def]
    obj = await store.create(_job(space, 0))
    rev = await kv.put(f"{space}.raw", payload)

    async def raw(i: int) -> None:
        nonlocal rev
        rev = await kv.update(f"{space}.raw", payload, last=rev)

    async def cas(i: int) -> None:
        nonlocal obj
        obj = await store.update(obj)

    base = await rate(raw, n)
    subject = await rate(cas, n)
    return Result("ObjectStore.update (CAS)", "kv.update(last=rev)", subject, base)


async def _watch(store: ObjectStore[Job], kv, n: int, space: str) -> list[Result]:  # type: ignore[no-untyped-def]
    """Delivery of the same n changes, and (context) this process's CPU per event on each side: both
    sides read the same messages from the same nats-server, so the CPU difference is the watch's own."""
    start_rev = await store.last_revision()
    await asyncio.gather(*(store.create(_job(space, i)) for i in range(n)))

    async def store_watch() -> None:
        async with store.watch(space, resource_version=start_rev) as w:
            for _ in range(n):
                await w.next(timeout=10)

    async def kv_watch() -> None:
        watcher = await kv.watch(f"{space}.>", include_history=True)
        got = 0
        async for entry in watcher:
            if entry is None:
                continue  # the "caught up" marker
            got += 1
            if got == n:
                break
        await watcher.stop()

    base, base_cpu = await _rate_and_cpu(2, kv_watch, n)
    subject, subject_cpu = await _rate_and_cpu(2, store_watch, n)
    return [
        Result("ObjectStore watch delivery (typed)", "kv.watch (raw bytes)", subject, base, target=0.70),
        Result(
            f"ObjectStore watch, events per CPU-second of this process ({subject_cpu:.1f} µs/event)",
            f"kv.watch ({base_cpu:.1f} µs/event)",
            1e6 / subject_cpu,
            1e6 / base_cpu,
        ),
    ]


async def _rate_and_cpu(runs: int, watch: Callable[[], Awaitable[None]], n: int) -> tuple[float, float]:
    """The best rate (events/s) of a few runs and the least CPU µs per event of this process among them."""
    rates, cpus = [], []
    for _ in range(runs):
        t, cpu = time.perf_counter(), _cpu_s()
        await watch()
        rates.append(n / (time.perf_counter() - t))
        cpus.append((_cpu_s() - cpu) / n * 1e6)
    return max(rates), min(cpus)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
