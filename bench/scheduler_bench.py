"""The scheduler end to end: 10,000 pending single-GPU indexes against 1,000 simulated nodes (issue #5).

Three processes beside this one, as they run in production: nats-server, the scheduler service
(``python -m nodus_scheduler``) and a simulated fleet of 1,000 single-GPU nodes
(``python -m nodus_agent.simulating``, docs/simulation.md). Ten Jobs of 1,000 indexes each are created at
once (parallelism 1,000 each): 10,000 indexes wait for 1,000 nodes. Each run lasts ~50 ms on its node.

Measured, from the scheduler's own Attempts (a watch on the attempts bucket):
* **fill**: placements per second until every node is busy (the first 1,000): the binder alone, with
  capacity for everything it chooses;
* **sustained**: placements per second over all 10,000, which also includes the runs' reports flowing
  back (started, finished), the nodes freeing up and the Jobs' status writes;
* the scheduler's peak memory (VmHWM), and the CPU per placement of the scheduler, nats-server and the
  fleet;
* every message the bus stored (and synced: ``sync_interval: always``) during the loop, by bucket and
  stream, per placement, against raw ``kv.put`` with 64 in flight: at the issue's 1,000 placements/s the
  bus must store that many times 1,000 messages a second.

Baselines, in the same run: the issue's floor (1,000 placements/s over the whole loop, issue #23;
kube-scheduler does 680-810 pods/s at 5,000 nodes), a raw ``ObjectStore.create`` of 10,000 Attempts
with 64 in flight (the one write a placement cannot avoid), and raw ``kv.put`` with 64 in flight.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Final

from bench.running import Result, bus_auth, cpu_seconds, credential, spawn, stored_messages
from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import Attempt, AttemptSpec
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import EnvVar, Job, JobSpec, Placement, Resources
from nodus_schema.meta import ObjectMeta
from nodus_schema.nodes import Node
from nodus_testing.natsserver import NatsServer
from nodus_testing.processes import stop

NODES: Final = 1_000
JOBS: Final = 10
INDEXES: Final = 1_000  # per Job: 10,000 in all
RUN_S: Final = "0.05"
FLOOR: Final = 1_000.0  # placements per second, the target


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _job(i: int) -> Job:
    spec = JobSpec(
        image="busybox",
        command=["true"],
        completions=INDEXES,
        parallelism=INDEXES,
        resources=Resources(gpu="L4:1"),
        env=[EnvVar(name="NODUS_SIM_SECONDS", value=RUN_S), EnvVar(name="NODUS_SIM_SIGMA", value="0")],
        placement=Placement(profile="Cost"),
    )
    return default_job(Job(metadata=ObjectMeta(name=f"bench-{i}", namespace="bench"), spec=spec))


async def _raw_creates(nc: Any, n: int) -> float:
    """Attempts per second written by ObjectStore.create, 64 in flight."""
    store = ObjectStore(nc, "attempts", Attempt)
    sem = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        a = Attempt(
            metadata=ObjectMeta(name=f"raw-{i}", namespace="raw"),
            spec=AttemptSpec(
                job="raw",
                index=i,
                attempt=1,
                node=f"n{i}",
                offering="l4-x1-us",
                region_class="us",
                rate_micros_per_hour=1,
                pricebook_version="x",
            ),
        )
        async with sem:
            await store.create(a)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - start)


async def run(n: int) -> list[Result]:
    del n  # the sizes are the issue's, not the command line's
    with (
        NatsServer(auth=bus_auth()) as server,
        tempfile.TemporaryDirectory(prefix="nodus-bench-") as tmp_dir,
    ):
        tmp = Path(tmp_dir)
        nc = await connect(server.url, "bench", nkey_seed=server.harness_seed)
        await declaring.ensure(nc.jetstream())
        env = {"NODUS_NATS_URL": server.url, "NODUS_LOG_LEVEL": "WARNING", "NODUS_REPLICA": "bench"}
        fleet = spawn(
            [
                "-m",
                "nodus_agent.simulating",
                "--fleet",
                "b",
                "--nodes",
                str(NODES),
                "--offerings",
                "l4-x1-us",
                "--progress-s",
                "0",
                "--workdir",
                str(tmp / "fleet"),
            ],
            {**env, **credential(server, "fleet")},
            tmp / "fleet.log",
        )
        # Placement speed without billing's holds (the billing bench measures those).
        scheduler = spawn(
            ["-m", "nodus_scheduler"],
            {**env, **credential(server, "scheduler"), "NODUS_FUNDING": "off"},
            tmp / "scheduler.log",
            profiled=True,  # with NODUS_BENCH_PROFILE=<dir> (bench/running.py)
        )
        try:
            nodes = ObjectStore(nc, "nodes", Node)
            deadline = time.monotonic() + 60
            while len((await nodes.list()).items) < NODES:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the fleet did not register:\n{(tmp / 'fleet.log').read_text()[-3000:]}"
                    )
                await asyncio.sleep(0.2)  # polling a count against a deadline, not synchronisation
            assert server.proc is not None, "the nats-server is started"
            pids = {"scheduler": scheduler.pid, "nats-server": server.proc.pid, "fleet": fleet.pid}
            fill, sustained, cpu_us, rss, stored = await _measure(nc, pids, tmp)
            raw = await _raw_creates(nc, 10_000)
            raw_puts = await _raw_puts(nc, 10_000)
        finally:
            stop(scheduler, grace_s=10)
            stop(fleet, grace_s=10)
            await nc.close()
    total = JOBS * INDEXES
    cpu = ", ".join(f"{name} {us:,.0f}" for name, us in cpu_us.items())
    per = sum(stored.values()) / total
    by = ", ".join(f"{name} {n / total:.2f}" for name, n in stored.most_common())
    print(
        f"scheduler: {total:,} indexes on {NODES:,} nodes; fill {fill:,.0f}/s, sustained {sustained:,.0f}/s; "
        f"CPU µs per placement: {cpu}; peak RSS {rss:.0f} MiB; raw ObjectStore.create {raw:,.0f}/s, raw "
        f"kv.put {raw_puts:,.0f}/s (64 in flight)\n  stored per placement: {per:.2f} ({by})"
    )
    return [
        # Issue #23's measure: the whole loop, each run's reports and the nodes' turnover included (one
        # node runs one index at a time, so past the first 1,000 a placement waits for a run to end).
        Result(
            f"placements, all {total:,}, with each run's reports and node turnover (runs of {RUN_S}s; "
            f"scheduler {cpu_us['scheduler']:,.0f} µs CPU each; peak RSS {rss:.0f} MiB)",
            "required 1,000/s",
            sustained,
            FLOOR,
            target=1.0,
        ),
        Result(f"placements, first {NODES:,} (fill)", "required 1,000/s", fill, FLOOR),
        Result(f"placements, first {NODES:,} (fill)", "raw ObjectStore.create, 64 in flight", fill, raw),
        Result(
            f"messages the bus stored and synced during the whole loop ({per:.1f} per placement)/s",
            "raw kv.put, 64 in flight",
            sum(stored.values()) / (total / sustained),
            raw_puts,
        ),
    ]


async def _raw_puts(nc: Any, n: int) -> float:
    """nats-py ``kv.put`` of an Attempt-sized value, 64 in flight: what the bus stores and syncs per second
    from one client doing nothing else."""
    kv = await nc.jetstream().create_key_value(bucket="rawput", history=1)
    value, sem = b"x" * 1200, asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with sem:
            await kv.put(f"k.{i}", value)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - start)


async def _measure(
    nc: Any, pids: dict[str, int], tmp: Path
) -> tuple[float, float, dict[str, float], float, Counter[str]]:
    attempts = ObjectStore(nc, "attempts", Attempt)
    jobs = ObjectStore(nc, "jobs", Job)
    total = JOBS * INDEXES
    seen: set[str] = set()
    times: list[float] = []
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    seq0 = await stored_messages(nc)
    async with attempts.watch("bench") as w:
        start = time.perf_counter()
        await asyncio.gather(*(jobs.create(_job(i)) for i in range(JOBS)))
        deadline = time.monotonic() + 600
        while len(seen) < total:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(seen)} placements in 600 s:\n{(tmp / 'scheduler.log').read_text()[-3000:]}"
                )
            event = await w.next(timeout=60)
            name = event.object.metadata.name or ""
            if event.type == "ADDED" and name not in seen:
                seen.add(name)
                times.append(time.perf_counter() - start)
    cpu = {name: (cpu_seconds(pid) - cpu0[name]) * 1e6 / total for name, pid in pids.items()}
    seq1 = await stored_messages(nc)
    fill = NODES / times[NODES - 1]
    sustained = total / times[-1]
    return (
        fill,
        sustained,
        cpu,
        _peak_rss_mib(pids["scheduler"]),
        Counter({k: seq1[k] - seq0[k] for k in seq1}),
    )


if __name__ == "__main__":
    for r in asyncio.run(run(0)):
        print(r)
