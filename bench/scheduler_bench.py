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
* the scheduler's peak memory (VmHWM) and its CPU per placement.

Baselines, in the same run: the issue's floor (1,000 placements/s; kube-scheduler does 680-810 pods/s at
5,000 nodes), and a raw ``ObjectStore.create`` of 10,000 Attempts with 64 in flight (the one write a
placement cannot avoid).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench.running import Result, bus_auth, cpu_seconds, credential, spawn
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
            fill, sustained, cpu_us, rss = await _measure(nc, scheduler.pid, tmp)
            raw = await _raw_creates(nc, 10_000)
        finally:
            stop(scheduler, grace_s=10)
            stop(fleet, grace_s=10)
            await nc.close()
    total = JOBS * INDEXES
    print(
        f"scheduler: {total:,} indexes on {NODES:,} nodes; fill {fill:,.0f}/s, sustained {sustained:,.0f}/s, "
        f"{cpu_us:,.0f} µs CPU per placement, peak RSS {rss:.0f} MiB; raw ObjectStore.create {raw:,.0f}/s"
    )
    return [
        Result(f"placements, first {NODES:,} (fill)", "required 1,000/s", fill, FLOOR, target=1.0),
        # Context, not the measure: past the first 1,000 a placement waits for a run to end and
        # its reports to come back (one node runs one index at a time).
        Result(
            f"placements, all {total:,}, with each run's reports and node turnover (runs of {RUN_S}s; "
            f"peak RSS {rss:.0f} MiB)",
            "required 1,000/s",
            sustained,
            FLOOR,
        ),
        Result(f"placements, first {NODES:,} (fill)", "raw ObjectStore.create, 64 in flight", fill, raw),
    ]


async def _measure(nc: Any, pid: int, tmp: Path) -> tuple[float, float, float, float]:
    attempts = ObjectStore(nc, "attempts", Attempt)
    jobs = ObjectStore(nc, "jobs", Job)
    total = JOBS * INDEXES
    seen: set[str] = set()
    times: list[float] = []
    cpu0 = cpu_seconds(pid)
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
    cpu = cpu_seconds(pid) - cpu0
    fill = NODES / times[NODES - 1]
    sustained = total / times[-1]
    return fill, sustained, cpu * 1e6 / total, _peak_rss_mib(pid)


if __name__ == "__main__":
    for r in asyncio.run(run(0)):
        print(r)
