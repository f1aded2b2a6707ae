"""A 1,000-cell Sweep of no-op cells end to end, against raw KV writes in the same run (issue #8).

Four processes beside this one, as they run in production: nats-server, the sweep controller
(``python -m nodus_sweeps``), the scheduler (``python -m nodus_scheduler``, ``NODUS_FUNDING=off``: no
billing, whose holds the billing bench measures) and a simulated fleet of 200 single-L4 nodes
(``python -m nodus_agent.simulating``, docs/simulation.md). A Sweep of 1,000 cells (a 100 × 10 matrix of
params, ``maxParallel`` 200) whose runs take no time (``NODUS_SIM_SECONDS=0``) is written into the
``sweeps`` bucket as the gateway stores it, once the fleet is registered and both controllers lead.
Three rounds, each a new Sweep, the one before deleted with its cells first; the best round counts (the
machine is shared, see bench/running.py's ``best_of``).

Measured, each round:
* **cells/s**: 1,000 over the time from the Sweep's creation until its status reads Succeeded with 1,000
  rows (a watch on the Sweep);
* **KV writes per cell**: every message published on ``$KV.>`` during that time, over 1,000, by bucket
  (a core subscription sees every publish, so a compare-and-set the stream refused counts too, as the
  work it was); and, from each bucket's stream sequence, how many of them were stored;
* where the time goes: the median time from a cell Job's creation to its Succeeded (scheduler and
  fleet), from a cell's Succeeded to the creation of the cell that takes its slot (sweep controller), and
  the CPU each process spent, this one (the observer) included.

Then the same rounds with billing in the loop, on a nats-server of their own: the scheduler funds every
run (``NODUS_FUNDING=on``) and billing (``python -m nodus_billing``, starting credits of a million
dollars) holds, meters, captures and writes each cell's ``status.cost``, every round's Sweep in the one
project ``billed``, on a nats-server with the default ``max_payload`` (1 MiB). Before issue #23's filing a
1,000-cell Sweep filled its project's book to within a few hundred bytes of that and the next one was not
funded; now a finished Job's runs are filed out of the book and a deleted Job's record is forgotten, so
the three rounds' 3,000 runs share one book, whose size after each round is in the row. Its row is
context, against the rate without billing: the path a user with billing takes.

Then the same rounds on an R3 cluster of three nats-servers (every bucket at three replicas, each server
``sync_interval: always``), against the single server's best rate of the same run (issue #23: at least
60%). Each process's CPU per cell is a row of its own: 500 cells/s on 2 cores leaves 4 ms for all of them.

Baselines, in the same run: the issue's floor (500 cells/s), and raw nats-py ``kv.put`` of a value the
size of a finished cell Job, one after another and 64 in flight (writes/s). The ratio of the pipeline's
KV write rate (writes per cell × cells/s) to the raw rate says how much of what the bus can take the
Sweep uses: near 100% the bus is the limit; far below it the time goes elsewhere.

``NODUS_BENCH_PROFILE=<dir>`` runs the scheduler and the sweep controller under cProfile (see ``_spawn``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from bench.running import Result, bus_auth, cpu_seconds, credential, spawn, stored_messages
from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.leasing import Lease
from nodus_kit.selecting import Selector
from nodus_kit.storing import ObjectStore
from nodus_schema.defaulting import default_sweep
from nodus_schema.jobs import Job
from nodus_schema.meta import ObjectMeta
from nodus_schema.nodes import Node
from nodus_schema.sweeps import SWEEP_LABEL, Sweep, SweepSpec
from nodus_testing.natscluster import NatsCluster
from nodus_testing.natsserver import NatsServer, harness_accounts
from nodus_testing.processes import stop

NODES: Final = 200
A_VALUES: Final = 100
B_VALUES: Final = 10
CELLS: Final = A_VALUES * B_VALUES
MAX_PARALLEL: Final = 200
FLOOR: Final = 500.0  # cells per second on 2 cores, issue #23's target (issue #8's was 200)
R3_TARGET: Final = 0.6  # the R3 cluster's rate against the single server's, issue #23
NS: Final = "bench"
BILLED: Final = "billed"
"""The billed rounds' namespace (project): every round's Sweep, one after another, in one billing book."""
ROUNDS: Final = 3
DEADLINE_S: Final = 240.0
IN_FLIGHT: Final = 64


def _sweep(name: str, ns: str = NS) -> Sweep:
    body = {
        "maxParallel": MAX_PARALLEL,
        "matrix": {
            "params": {"A": [str(i) for i in range(A_VALUES)], "B": [str(i) for i in range(B_VALUES)]}
        },
        "template": {
            "spec": {
                "image": "busybox",
                "command": ["true"],
                "resources": {"gpu": "L4:1"},
                "env": [
                    {"name": "NODUS_SIM_SECONDS", "value": "0"},
                    {"name": "NODUS_SIM_SIGMA", "value": "0"},
                ],
            }
        },
    }
    sweep = Sweep(
        metadata=ObjectMeta(name=name, namespace=ns, generation=1), spec=msgspec.convert(body, SweepSpec)
    )
    return default_sweep(sweep)


class _Phase(msgspec.Struct):
    phase: str | None = None


class _JobPhase(msgspec.Struct):
    """Only what the tap reads of a Job: msgspec skips the rest without building it."""

    status: _Phase = msgspec.field(default_factory=_Phase)


@dataclass
class Tap:
    """Every message on ``$KV.>`` while counting (a core subscription sees every publish, one a
    compare-and-set then refuses included): messages and bytes by bucket, and when each cell Job was first
    seen and first read Succeeded. Lighter than a typed watch, so the observer takes little CPU from the
    processes it measures."""

    prefix: str
    counting: bool = False
    writes: Counter[str] = field(default_factory=Counter)
    sizes: Counter[str] = field(default_factory=Counter)
    created: dict[str, float] = field(default_factory=dict)
    succeeded: dict[str, float] = field(default_factory=dict)
    decoder: msgspec.json.Decoder[_JobPhase] = field(default_factory=lambda: msgspec.json.Decoder(_JobPhase))

    async def on_msg(self, msg: Msg) -> None:
        if not self.counting:
            return
        bucket = msg.subject.split(".", 3)[1]
        self.writes[bucket] += 1
        self.sizes[bucket] += len(msg.data)
        if msg.subject.startswith(self.prefix) and msg.data:
            now = time.perf_counter()
            self.created.setdefault(msg.subject, now)
            if self.decoder.decode(msg.data).status.phase == "Succeeded":
                self.succeeded.setdefault(msg.subject, now)

    @property
    def total(self) -> int:
        return sum(self.writes.values())


@dataclass
class Run:
    seconds: float  # Sweep created -> its status Succeeded with every row
    last_created_s: float  # Sweep created -> the last cell Job first seen
    last_succeeded_s: float  # Sweep created -> the last cell Job Succeeded
    tap: Tap
    stored: Counter[str]  # writes each bucket's stream took (its last sequence moved by)
    cpu: dict[str, float]  # process -> CPU seconds during the run
    job_bytes: int  # a finished cell Job as stored
    sweep_bytes: int  # the finished Sweep as stored
    book_bytes: int = 0  # the billed project's billing book as stored, once the round's Sweep ended


async def _measure(nc: NATS, name: str, pids: dict[str, int], logs: Path, ns: str = NS) -> Run:
    sweeps = ObjectStore(nc, "sweeps", Sweep)
    tap = Tap(prefix=f"$KV.jobs.{ns}.{name}-")
    sub = await nc.subscribe("$KV.>", cb=tap.on_msg, pending_msgs_limit=1_000_000)
    seq0 = await stored_messages(nc)
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    own0 = time.process_time()
    try:
        async with sweeps.watch(ns, name=name) as w:
            tap.counting = True
            start = time.perf_counter()
            await sweeps.create(_sweep(name, ns))
            while True:
                left = DEADLINE_S - (time.perf_counter() - start)
                if left <= 0:
                    raise RuntimeError(
                        f"the Sweep did not succeed in {DEADLINE_S:.0f} s ({len(tap.created)} cells created, "
                        f"{len(tap.succeeded)} succeeded):\n{_tails(logs)}"
                    )
                sweep = (await w.next(timeout=left)).object
                if sweep.status.phase == "Succeeded" and len(sweep.status.cells) == CELLS:
                    break
            end = time.perf_counter()
            tap.counting = False
        await nc.flush()
    finally:
        await sub.unsubscribe()
    cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    cpu["bench (observer)"] = time.process_time() - own0
    seq1 = await stored_messages(nc)
    job = await ObjectStore(nc, "jobs", Job).get(ns, f"{name}-0")
    return Run(
        seconds=end - start,
        last_created_s=max(tap.created.values()) - start,
        last_succeeded_s=max(tap.succeeded.values()) - start,
        tap=tap,
        stored=Counter({b: seq1[b] - seq0[b] for b in seq1 if seq1[b] > seq0[b]}),
        cpu=cpu,
        job_bytes=len(msgspec.json.encode(job)),
        sweep_bytes=len(msgspec.json.encode(sweep)),
    )


async def _ready(nc: NATS, logs: Path, leaders: tuple[str, ...]) -> None:
    """Every node registered and every controller leading: the clock must not time their start-up."""
    nodes = ObjectStore(nc, "nodes", Node)
    leases = [Lease(nc, name, "probe") for name in leaders]
    deadline = time.monotonic() + 60
    while True:
        holders = [await lease.current_holder() for lease in leases]
        if len((await nodes.list()).items) >= NODES and all(h == "bench" for h in holders):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the fleet or a controller ({', '.join(leaders)}) did not start:\n{_tails(logs)}"
            )
        await asyncio.sleep(0.2)  # polling against a deadline, not synchronisation


def _tails(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logs.glob("*.log")))


async def _raw_puts(nc: NATS, size: int, n: int, in_flight: int, replicas: int = 1) -> float:
    """nats-py ``kv.put`` of ``size`` bytes to n keys of a scratch bucket: writes per second."""
    kv = await nc.jetstream().create_key_value(bucket=f"rawput{in_flight}", history=1, replicas=replicas)
    value = b"x" * size
    sem = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with sem:
            await kv.put(f"k.{i}", value)

    start = time.perf_counter()
    if in_flight == 1:
        for i in range(n):
            await kv.put(f"k.{i}", value)
    else:
        await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - start)


@dataclass
class Bus:
    """Where the rounds run: one nats-server, or the three members of an R3 cluster."""

    url: str
    harness_seed: Path | None  # the bench's own credential (None: a bus without authentication)
    credential: Callable[[str], dict[str, str]]  # a service user's credential, as its environment
    pids: dict[str, int]  # the servers' processes, whose CPU the rounds count
    replicas: int


async def run(n: int) -> list[Result]:
    """``n`` is the number of raw writes per baseline (the Sweep's size is the issue's: 1,000 cells)."""
    runs, baselines = await _single_server_rounds(n)
    assert baselines is not None
    billed, _ = await _single_server_rounds(n, billing=True)
    r3 = await _cluster_rounds(n)
    return _report(runs, *baselines, r3, billed)


async def _single_server_rounds(
    n: int, *, billing: bool = False
) -> tuple[list[Run], tuple[float, float] | None]:
    """The rounds on a nats-server of their own (the baselines with the rounds without billing)."""
    with (
        NatsServer(auth=bus_auth()) as server,
        tempfile.TemporaryDirectory(prefix="nodus-bench-") as tmp_dir,
    ):
        assert server.proc is not None, "the nats-server is started"
        bus = Bus(
            server.url,
            server.harness_seed,
            lambda user: credential(server, user),
            {"nats-server": server.proc.pid},
            1,
        )
        return await _rounds(bus, Path(tmp_dir), n, baselines=not billing, billing=billing)


async def _cluster_rounds(n: int) -> list[Run]:
    """The same rounds on a cluster of three nats-servers (``sync_interval: always`` each), every bucket
    and stream at three replicas: each write is stored and synced on two servers before it is acked."""
    with tempfile.TemporaryDirectory(prefix="nodus-bench-r3-") as tmp_dir:
        tmp = Path(tmp_dir)
        if bus_auth():
            generated, accounts, harness = harness_accounts(tmp / "credentials")
        else:
            accounts, harness = "", None
        with NatsCluster(3, tmp / "nats", extra_config=accounts) as cluster:

            def user(name: str) -> dict[str, str]:
                if harness is None:
                    return {"NODUS_NATS_ANONYMOUS": "true"}
                return {"NODUS_NATS_NKEY_SEED": str(generated.seed(name))}

            pids = {f"nats-server {m.name}": m.proc.pid for m in cluster.members if m.proc is not None}
            runs, _ = await _rounds(Bus(cluster.url, harness, user, pids, 3), tmp, n, baselines=False)
    return runs


async def _rounds(
    bus: Bus, tmp: Path, n: int, *, baselines: bool = True, billing: bool = False
) -> tuple[list[Run], tuple[float, float] | None]:
    """The fleet, the scheduler and the sweep controller on ``bus``, ROUNDS Sweeps one after another, and
    (``baselines``) raw kv.put of a cell Job's size, sequential and IN_FLIGHT at once, on the same bus.
    ``billing``: billing too, funding every run (its holds, meter and cost writes), every round's Sweep in
    the one project :data:`BILLED`."""
    nc = await connect(bus.url, "bench", nkey_seed=bus.harness_seed)
    await declaring.ensure(nc.jetstream(), replicas=bus.replicas)
    env = {"NODUS_NATS_URL": bus.url, "NODUS_LOG_LEVEL": "WARNING", "NODUS_REPLICA": "bench"}
    fleet_args = ["--fleet", "s", "--nodes", str(NODES), "--offerings", "l4-x1-us", "--progress-s", "0"]
    procs = {
        # Not the fleet under cProfile: run as its __main__, its msgspec types cannot resolve their
        # annotations.
        "fleet": spawn(
            ["-m", "nodus_agent.simulating", *fleet_args, "--workdir", str(tmp / "fleet")],
            {**env, **bus.credential("fleet")},
            tmp / "fleet.log",
        ),
        "scheduler": spawn(
            ["-m", "nodus_scheduler"],
            {**env, **bus.credential("scheduler"), "NODUS_FUNDING": "on" if billing else "off"},
            tmp / "scheduler.log",
            profiled=True,
        ),
        "sweeps": spawn(
            ["-m", "nodus_sweeps"],
            {**env, **bus.credential("sweeps")},
            tmp / "sweeps.log",
            profiled=True,
        ),
    }
    if billing:
        credits = {"NODUS_STARTING_CREDITS_USD": "1000000"}
        procs["billing"] = spawn(
            ["-m", "nodus_billing"], {**env, **bus.credential("billing"), **credits}, tmp / "billing.log"
        )
    try:
        await _ready(nc, tmp, ("scheduler", "sweep-controller", *(("billing",) if billing else ())))
        pids = {**{name: p.pid for name, p in procs.items()}, **bus.pids}
        runs = []
        for round_no in range(ROUNDS):
            ns = BILLED if billing else NS
            runs.append(await _measure(nc, f"noop-{round_no}", pids, tmp, ns))
            if billing:
                runs[-1].book_bytes = await _book_bytes(nc, ns)
            await _delete(nc, f"noop-{round_no}", tmp, ns)
        raw = None
        if baselines:
            raw = (
                await _raw_puts(nc, runs[0].job_bytes, n, 1, bus.replicas),
                await _raw_puts(nc, runs[0].job_bytes, n, IN_FLIGHT, bus.replicas),
            )
    finally:
        for p in procs.values():
            stop(p, grace_s=10)
        await nc.close()
    return runs, raw


async def _book_bytes(nc: NATS, project: str) -> int:
    """The size of the project's billing book as stored (one KV message: docs/billing.md)."""
    msg = await nc.jetstream().get_msg("KV_accounts", subject=f"$KV.accounts._.{project}")
    return len(msg.data or b"")


async def _delete(nc: NATS, name: str, logs: Path, ns: str = NS) -> None:
    """Delete the Sweep and wait for the controller to delete its cells, so rounds do not overlap."""
    await ObjectStore(nc, "sweeps", Sweep).delete(ns, name)
    jobs = ObjectStore(nc, "jobs", Job)
    deadline = time.monotonic() + 60
    while await _cells_left(jobs, ns, name):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cells of {name} were not deleted in 60 s:\n{_tails(logs)}")
        await asyncio.sleep(0.2)  # polling against a deadline, not synchronisation


async def _cells_left(jobs: ObjectStore[Job], ns: str, name: str) -> bool:
    """Whether a cell of the Sweep is still stored; a list that timed out (the server busy with the
    deletions and, in the billed rounds, billing's book) says yes: asked again."""
    try:
        return bool((await jobs.list(ns, selector=Selector.equals({SWEEP_LABEL: name}), limit=1)).items)
    except nats.errors.TimeoutError:
        return True


def _latencies(tap: Tap) -> tuple[float, float]:
    """Median ms from a cell's creation to its Succeeded, and from the k-th cell Succeeded to the
    (k + maxParallel)-th cell created: the time the sweep controller takes to refill a freed slot."""
    run = statistics.median(tap.succeeded[k] - tap.created[k] for k in tap.succeeded)
    done, made = sorted(tap.succeeded.values()), sorted(tap.created.values())
    refill = [made[k + MAX_PARALLEL] - done[k] for k in range(len(made) - MAX_PARALLEL)]
    return run * 1000, (statistics.median(refill) * 1000 if refill else 0.0)


def _report(
    runs: list[Run], sequential: float, concurrent: float, r3: list[Run], billed: list[Run]
) -> list[Result]:
    rates = [CELLS / r.seconds for r in runs]
    for r in runs:
        _describe(r)
    print("sweeps, with billing in the loop (one project, every round):")
    for r in billed:
        _describe(r)
    print(f"sweeps, billed: the book after each round {', '.join(f'{r.book_bytes:,}' for r in billed)} bytes")
    print("sweeps, on an R3 cluster of three nats-servers:")
    for r in r3:
        _describe(r)
    m = max(runs, key=lambda r: CELLS / r.seconds)  # the round least disturbed by the rest of the machine
    best_r3 = max(CELLS / r.seconds for r in r3)
    rate, per_cell = CELLS / m.seconds, m.tap.total / CELLS
    kv_rate = m.tap.total / m.seconds
    print(
        f"sweeps: rounds {', '.join(f'{x:,.1f}' for x in rates)} cells/s (best counts); raw kv.put of "
        f"{m.job_bytes:,} bytes: {sequential:,.0f}/s sequential, {concurrent:,.0f}/s {IN_FLIGHT} in flight"
    )
    writes = f"the Sweep's KV writes/s ({per_cell:.1f} per cell)"
    return [
        Result(
            f"Sweep of {CELLS:,} no-op cells, end to end (cells/s), best of {ROUNDS}",
            "required 500 cells/s",
            rate,
            FLOOR,
            1.0,
        ),
        Result(
            f"the same Sweep on an R3 cluster of 3 nats-servers (cells/s), best of {ROUNDS}",
            "the single server's rate above",
            best_r3,
            rate,
            R3_TARGET,
        ),
        *_billed_rows(billed, rate),
        Result(writes, f"raw kv.put of a cell Job ({m.job_bytes:,} B), sequential", kv_rate, sequential),
        Result(writes, f"raw kv.put of a cell Job, {IN_FLIGHT} in flight", kv_rate, concurrent),
        Result(
            f"every message the bus stored and synced (objects, assignments, reports, events: "
            f"{sum(m.stored.values()) / CELLS:.1f} per cell)/s",
            f"raw kv.put of a cell Job, {IN_FLIGHT} in flight",
            sum(m.stored.values()) / m.seconds,
            concurrent,
        ),
        *_cpu_rows(m),
    ]


def _billed_rows(billed: list[Run], rate: float) -> list[Result]:
    """The path a user with billing takes: the same Sweep with every run funded, against the rate without
    billing, and billing's CPU per cell (context: no target of its own)."""
    b = max(billed, key=lambda r: CELLS / r.seconds)
    cpu = ", ".join(f"{k} {v / CELLS * 1000:.2f}" for k, v in sorted(b.cpu.items(), key=lambda kv: -kv[1]))
    books = ", ".join(f"{r.book_bytes / 1000:,.0f} kB" for r in billed)
    return [
        Result(
            f"the same Sweep with billing in the loop (holds, meter, cost; every round in one project, "
            f"its book after each {books}), best of {ROUNDS} (cells/s; CPU ms a cell: {cpu})",
            "the single server's rate above, without billing",
            CELLS / b.seconds,
            rate,
        )
    ]


def _cpu_rows(m: Run) -> list[Result]:
    """Each process's CPU per cell in the best round, as cells per CPU-second against the rate the
    issue asks for (500 cells/s on 2 cores allows 4 ms of CPU per cell for every process together)."""
    rows = []
    for name, seconds in sorted(m.cpu.items(), key=lambda kv: -kv[1]):
        per_cell_ms = seconds / CELLS * 1000
        rows.append(
            Result(
                f"CPU per cell: {name} {per_cell_ms:.2f} ms, as cells per CPU-second",
                "all processes' budget at 500 cells/s on 2 cores, 4 ms, as cells per CPU-second",
                CELLS / seconds if seconds else float("inf"),
                250.0,
            )
        )
    total = sum(m.cpu.values())
    rows.append(
        Result(
            f"CPU per cell: all processes {total / CELLS * 1000:.2f} ms, as cells per CPU-second",
            "the budget, 4 ms, as cells per CPU-second",
            CELLS / total,
            250.0,
        )
    )
    return rows


def _describe(m: Run) -> None:
    """One round, with where its time went."""
    buckets = ", ".join(
        f"{b} {c / CELLS:.2f} ({m.tap.sizes[b] / 1e6:,.1f} MB)" for b, c in m.tap.writes.most_common()
    )
    cpu = ", ".join(f"{name} {s:.1f}" for name, s in sorted(m.cpu.items(), key=lambda kv: -kv[1]))
    kv = Counter({b: c for b, c in m.stored.items() if b in m.tap.writes or b.islower()})
    streams = Counter({b: c for b, c in m.stored.items() if b not in kv})
    stored = sum(kv.values())
    per_bucket = ", ".join(f"{b} {c / CELLS:.2f}" for b, c in kv.most_common())
    per_stream = ", ".join(f"{b} {c / CELLS:.2f}" for b, c in streams.most_common())
    run_ms, refill_ms = _latencies(m.tap)
    cores = len(os.sched_getaffinity(0))
    writes, per_s = m.tap.total, m.tap.total / m.seconds
    print(
        f"sweeps: {CELLS:,} cells on {NODES} nodes, maxParallel {MAX_PARALLEL}: {m.seconds:.1f} s end to end "
        f"= {CELLS / m.seconds:,.1f} cells/s; last cell created at {m.last_created_s:.1f} s, last cell "
        f"Succeeded at {m.last_succeeded_s:.1f} s\n"
        f"  median latency: a cell Job created -> Succeeded {run_ms:,.0f} ms (scheduler, fleet); a cell "
        f"Succeeded -> the cell taking its slot created {refill_ms:,.0f} ms (sweep controller)\n"
        f"  KV writes: {writes:,} = {writes / CELLS:.2f} per cell ({per_s:,.0f}/s); "
        f"per cell by bucket (bytes in all): {buckets}; the finished Sweep is {m.sweep_bytes / 1e3:,.0f} kB\n"
        f"  of them stored: {stored:,} = {stored / CELLS:.2f} per cell ({per_bucket}); the rest are "
        f"compare-and-set writes the stream refused\n"
        f"  and the streams took, per cell: {per_stream or 'nothing'}\n"
        f"  CPU seconds during the run: {cpu} (of {cores * m.seconds:.1f} on {cores} cores)"
    )


if __name__ == "__main__":
    for r in asyncio.run(run(2000)):
        print(r)
