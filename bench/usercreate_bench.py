"""The create a user gets (issue #23): Jobs POSTed over HTTPS to the gateway, estimated by the scheduler and
billing on the way, against a bare FastAPI route served the same way, at 50 concurrent clients.

Six processes beside this one, as ``make up`` runs them (nodus_testing.localstack), each on its own bus
credential: nats-server (every write synced), the scheduler (``python -m nodus_scheduler``), billing
(``python -m nodus_billing``), a simulated fleet of :data:`NODES` single-L4 nodes
(``python -m nodus_agent.simulating``, docs/simulation.md: the capacity and prices the estimate looks
at), and two uvicorn servers of bench/gateway_bench.py with identical settings, both over TLS with the
stack's kind of certificate (nodus_testing.certs, a local CA): the real gateway app, and the bare route.
The bare route answers every POST with the bytes the gateway answered for the same Job.

Every create is a Job as a user writes it: one L4, a cap (``maxCostUSD``) for billing to size holds
under, a declared duration. The gateway asks the scheduler for its estimate, then billing for the quote
(ADR-0031), and stores the Job with ``status.estimate``; the bench checks that the first answer carries
one. The Jobs are created Suspended (``spec.state``): what is measured is the create, not the runs that
follow it (the placement loop has its own benchmarks, scheduler and sweeps). Each Suspended Job still
costs the scheduler one reconcile (its phase written) and billing one meter reconcile, which run on the
same two cores while the clients create: they are in the CPU rows below, as a stack pays them.

The load is gateway_bench's: a closed loop of 50 clients, each on its own keep-alive connection (here
HTTPS, one handshake per connection before the clock starts), alternating bare and gateway runs, the best
rate of each kept. The CPU rows are each process's CPU seconds (/proc) over the gateway's best run,
per create. For context, after the measured rounds the scheduler and billing are stopped and the gateway
is measured again the same way: every create then gets NATS's no-responders answer at once (or skips
asking for a second after one) and is admitted without an estimate, with a Warning header: the path the
``gateway`` benchmark measures, a path no user takes.
"""

from __future__ import annotations

import asyncio
import math
import os
import ssl
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec

from bench.gateway_bench import (
    BARE_PATH_ENV,
    BODY_FILE_ENV,
    CLIENTS,
    NATS_SEED_ENV,
    NATS_URL_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    WARMUP,
    _Connection,
    _Server,
    drive,
)
from bench.running import Result, bus_auth, cpu_seconds, credential, spawn, stored_messages
from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.leasing import Lease
from nodus_kit.storing import ObjectStore
from nodus_schema.nodes import Node
from nodus_testing import certs
from nodus_testing.natsserver import NatsServer
from nodus_testing.processes import stop

NODES: Final = 50
ROUNDS: Final = 3
RATIO_TARGET: Final = 0.20
P99_BUDGET_MS: Final = 100.0
NAMESPACE: Final = "bench"
ROUTE: Final = "/apis/nodus.dev/v1/namespaces/{namespace}/jobs"
COLLECTION: Final = ROUTE.format(namespace=NAMESPACE)
JOB_STATE: Final = os.environ.get("NODUS_BENCH_JOB_STATE", "Suspended")
"""``spec.state`` of the created Jobs; ``NODUS_BENCH_JOB_STATE=Running`` lets the scheduler place them on the
fleet (runs of a minute), to see what placement costs next to the creates (not the recorded rows)."""
SERVICES: Final = ("scheduler", "billing")
ESTIMATED: Final = b'"rateUSDPerHour"'
"""In every created Job's answer that carries status.estimate (the bench's Jobs always match a price)."""


def _job(name: str) -> bytes:
    spec: dict[str, Any] = {
        "image": "busybox",
        "command": ["true"],
        "resources": {"gpu": "L4:1"},
        "maxCostUSD": "5",
        "expectedDuration": "10m",
        "env": [{"name": "NODUS_SIM_SECONDS", "value": "60"}],
    }
    if JOB_STATE != "Running":
        spec["state"] = JOB_STATE
    body = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}
    return msgspec.json.encode(body)


@dataclass(frozen=True)
class Run:
    server: str
    rate: float  # creates per second
    latencies_ms: list[float]  # sorted
    cpu_us: dict[str, float] = field(default_factory=dict)  # process -> CPU µs per create
    unestimated: int = 0  # answers without status.estimate (the services did not answer in time)
    stored: dict[str, float] = field(default_factory=dict)  # bucket or stream -> messages stored per create

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile: the smallest latency that at least p% of requests did not exceed."""
        return self.latencies_ms[max(0, math.ceil(p / 100 * len(self.latencies_ms)) - 1)]

    def line(self) -> str:
        cpu = ", ".join(f"{k} {v:,.0f}" for k, v in self.cpu_us.items())
        stored = ", ".join(f"{k} {v:.2f}" for k, v in sorted(self.stored.items(), key=lambda kv: -kv[1]) if v)
        return (
            f"  {self.server:9} {self.rate:7,.0f} req/s   p50 {self.percentile(50):6.1f} ms   "
            f"p99 {self.percentile(99):6.1f} ms   without estimate {self.unestimated}   CPU µs/req: {cpu}"
            + (f"\n            stored per request: {stored}" if stored else "")
        )


async def _drive(connections: list[_Connection], bodies: list[bytes]) -> tuple[list[float], int]:
    """Every body sent, one request in flight per connection; each request's latency in ms, and how many
    answers carried no estimate (the bare route's all do: it answers the gateway's bytes)."""
    unestimated = 0

    def seen(answer: bytes) -> None:
        nonlocal unestimated
        unestimated += ESTIMATED not in answer

    return await drive(connections, bodies, seen), unestimated


async def _measure(
    server: str,
    port: int,
    tls: ssl.SSLContext,
    pids: dict[str, int],
    n: int,
    tag: str,
    path: str = COLLECTION,
    nc: Any = None,
) -> Run:
    """``nc``: a bus connection to read, before and after, what the bus stored (and synced) per request:
    the Job, its status's writes by the scheduler and billing (and their compare-and-set retries' reads
    are not stored), the events."""
    warm = [_job(f"{tag}-w{i}") for i in range(WARMUP)]
    bodies = [_job(f"{tag}-{i}") for i in range(n)]
    connections = [await _Connection.open(port, path, tls) for _ in range(CLIENTS)]
    try:
        await _drive(connections, warm)
        cpu0 = {k: cpu_seconds(pid) for k, pid in pids.items()}
        seq0 = await stored_messages(nc) if nc is not None else {}
        own0 = time.process_time()
        start = time.perf_counter()
        latencies, unestimated = await _drive(connections, bodies)
        elapsed = time.perf_counter() - start
        cpu = {k: (cpu_seconds(pid) - cpu0[k]) * 1e6 / n for k, pid in pids.items()}
        cpu["generator"] = (time.process_time() - own0) * 1e6 / n
    finally:
        for c in connections:
            await c.close()
    stored = {}
    if nc is not None:  # read once the controllers' writes for the last creates have landed
        seq1 = await _quiet(nc)
        stored = {k: (seq1[k] - seq0[k]) / n for k in seq1}
    return Run(server, n / elapsed, sorted(latencies), cpu, unestimated, stored)


async def _quiet(nc: Any) -> dict[str, int]:
    """What the bus has stored, once nothing was stored for 0.5 s (within 10 s)."""
    last = await stored_messages(nc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # the quiet being measured, not synchronisation
        now = await stored_messages(nc)
        if now == last:
            break
        last = now
    return last


async def _ready(nc: Any, logs: Path) -> None:
    """Every node registered and both controllers leading (polled against a deadline)."""
    nodes = ObjectStore(nc, "nodes", Node)
    leases = [Lease(nc, name, "probe") for name in SERVICES]
    deadline = time.monotonic() + 60
    while True:
        holders = [await lease.current_holder() for lease in leases]
        if len((await nodes.list()).items) >= NODES and all(h is not None for h in holders):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the fleet, the scheduler or billing did not start:\n{_tails(logs)}")
        await asyncio.sleep(0.2)  # polling against a deadline, not synchronisation


def _tails(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logs.glob("*.log")))


def _estimated(answer: bytes) -> bool:
    """Whether a created Job carries status.estimate with a rate (the scheduler and billing answered)."""
    status = msgspec.json.decode(answer).get("status") or {}
    return bool((status.get("estimate") or {}).get("rateUSDPerHour"))


async def run(n: int) -> list[Result]:
    with (
        NatsServer(auth=bus_auth()) as server,
        tempfile.TemporaryDirectory(prefix="nodus-bench-") as tmp_dir,
    ):
        tmp = Path(tmp_dir)
        tls_files = certs.ensure(tmp / "tls")
        tls = ssl.create_default_context(cafile=str(tls_files.ca))
        nc = await connect(server.url, "bench", nkey_seed=server.harness_seed)
        await declaring.ensure(nc.jetstream())
        env = {NATS_URL_ENV: server.url, "NODUS_NATS_URL": server.url, "NODUS_LOG_LEVEL": "WARNING"}
        fleet = ["--fleet", "u", "--nodes", str(NODES), "--offerings", "l4-x1-us", "--progress-s", "0"]
        procs = {
            "fleet": spawn(
                ["-m", "nodus_agent.simulating", *fleet, "--workdir", str(tmp / "fleet")],
                {**env, **credential(server, "fleet")},
                tmp / "fleet.log",
            ),
            "scheduler": spawn(
                ["-m", "nodus_scheduler"],
                {**env, **credential(server, "scheduler")},
                tmp / "scheduler.log",
                profiled=True,
            ),
            "billing": spawn(
                ["-m", "nodus_billing"],
                {**env, **credential(server, "billing"), "NODUS_STARTING_CREDITS_USD": "1000000"},
                tmp / "billing.log",
                profiled=True,
            ),
        }
        tls_env = {TLS_CERT_ENV: str(tls_files.cert), TLS_KEY_ENV: str(tls_files.key)}
        seed = {} if server.credentials is None else {NATS_SEED_ENV: str(server.credentials.seed("gateway"))}
        gateway: _Server | None = None
        bare: _Server | None = None
        try:
            await _ready(nc, tmp)
            gateway = _Server("gateway", tmp, {**env, **seed, **tls_env})
            conn = await _Connection.open(gateway.port, COLLECTION, tls)
            status, answer = await conn.post(_job("template"))
            await conn.close()
            if status != 201 or not _estimated(answer):
                raise RuntimeError(f"the example Job got no estimate: {status} {answer!r}\n{_tails(tmp)}")
            (tmp / "answer.json").write_bytes(answer)
            bare_env = {BODY_FILE_ENV: str(tmp / "answer.json"), BARE_PATH_ENV: ROUTE, **tls_env}
            bare = _Server("bare", tmp, bare_env)
            assert server.proc is not None
            pids = {name: p.pid for name, p in procs.items()}
            pids |= {"gateway": gateway.proc.pid, "nats-server": server.proc.pid}
            runs: list[Run] = []
            for r in range(ROUNDS):
                runs.append(await _measure("bare", bare.port, tls, {"bare": bare.proc.pid}, n, f"b{r}"))
                runs.append(await _measure("gateway", gateway.port, tls, pids, n, f"g{r}", nc=nc))
            # The estimate alone: dry runs ask the scheduler and billing and store nothing.
            dry = await _measure("dry-run", gateway.port, tls, pids, n, "d", f"{COLLECTION}?dryRun=All")
            for name in SERVICES:  # the context row: nobody answers the estimate
                stop(procs[name], grace_s=10)
                pids.pop(name)
            bare_runs = [await _measure("no-est", gateway.port, tls, pids, n, f"x{r}") for r in range(2)]
        finally:
            for s in (gateway, bare):
                if s is not None:
                    s.close()
            for p in procs.values():
                stop(p, grace_s=10)
            await nc.close()
    return _report(runs, dry, max(bare_runs, key=lambda r: r.rate), n)


def _report(runs: list[Run], dry: Run, unestimated: Run, n: int) -> list[Result]:
    best_bare = max((r for r in runs if r.server == "bare"), key=lambda r: r.rate)
    gw = max((r for r in runs if r.server == "gateway"), key=lambda r: r.rate)
    _print_notes([*runs, dry, unestimated], n)
    alone = dry.cpu_us["scheduler"] + dry.cpu_us["billing"]
    g99 = gw.percentile(99)
    cpu = gw.cpu_us
    services = cpu["scheduler"] + cpu["billing"]
    whole = sum(v for k, v in cpu.items() if k != "generator")
    return [
        Result(
            f"Job create with estimate (201), {CLIENTS} clients, https",
            "bare FastAPI route, https",
            gw.rate,
            best_bare.rate,
            RATIO_TARGET,
        ),
        Result(
            f"Job create p99 latency {g99:.1f} ms, as 1000/ms",
            f"p99 budget {P99_BUDGET_MS:.0f} ms, as 1000/ms",
            1000 / g99,
            1000 / P99_BUDGET_MS,
            target=1.0,
        ),
        Result(
            f"Job create p50 latency {gw.percentile(50):.1f} ms, as 1000/ms",
            f"bare p50 {best_bare.percentile(50):.1f} ms",
            1000 / gw.percentile(50),
            1000 / best_bare.percentile(50),
        ),
        Result(
            f"gateway CPU {cpu['gateway']:,.0f} µs/create, as 1e6/µs",
            f"bare server CPU {best_bare.cpu_us['bare']:,.0f} µs/req",
            1e6 / cpu["gateway"],
            1e6 / best_bare.cpu_us["bare"],
        ),
        Result(
            f"scheduler + billing CPU {services:,.0f} µs/create (scheduler {cpu['scheduler']:,.0f}, billing "
            f"{cpu['billing']:,.0f}: the estimate, the quote, one reconcile each), as 1e6/µs",
            f"bare server CPU {best_bare.cpu_us['bare']:,.0f} µs/req",
            1e6 / max(services, 1.0),
            1e6 / best_bare.cpu_us["bare"],
        ),
        Result(
            f"the estimate alone (dryRun=All, nothing stored): scheduler {dry.cpu_us['scheduler']:,.0f} + "
            f"billing {dry.cpu_us['billing']:,.0f} µs CPU per estimate, as 1e6/µs",
            f"bare server CPU {best_bare.cpu_us['bare']:,.0f} µs/req",
            1e6 / max(alone, 1.0),
            1e6 / best_bare.cpu_us["bare"],
        ),
        Result(
            f"whole stack CPU {whole:,.0f} µs/create (gateway, scheduler, billing, nats-server "
            f"{cpu['nats-server']:,.0f}, fleet {cpu['fleet']:,.0f}), as 1e6/µs",
            f"bare server CPU {best_bare.cpu_us['bare']:,.0f} µs/req",
            1e6 / whole,
            1e6 / best_bare.cpu_us["bare"],
        ),
        Result(
            f"context: Job create without scheduler and billing (no estimate, a Warning; p99 "
            f"{unestimated.percentile(99):.1f} ms)",
            "bare FastAPI route, https",
            unestimated.rate,
            best_bare.rate,
        ),
    ]


def _print_notes(runs: list[Run], n: int) -> None:
    cores = len(os.sched_getaffinity(0))
    print(f"usercreate: {n} Job creates per run after {WARMUP} warm-up, {CLIENTS} clients, https, in order:")
    for r in runs:
        print(r.line())
    notes = (
        f"All processes share the machine's {cores} cores. CPU per create is read from /proc (10 ms ticks) "
        f"over each run. Jobs are created with spec.state {JOB_STATE}; dry-run is the same POST with "
        "?dryRun=All (the estimate, nothing stored); the last runs (no-est) are the gateway with the "
        "scheduler and billing stopped."
    )
    print("\n".join(textwrap.wrap(notes, 110)) + "\n")


if __name__ == "__main__":
    for result in asyncio.run(run(2000)):
        print(result)
