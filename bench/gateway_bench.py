"""The gateway's create (POST a Sweep, 201) against a bare FastAPI route, over HTTP at 50 concurrent clients.

Both servers run the same way: each is its own uvicorn process (``python -m bench.gateway_bench serve``)
with identical settings, so neither shares an event loop with the load generator or with the other. The
gateway is the real app (``build_app`` over the real stores, bearer auth and request-context middleware
included) against a real nats-server; the bare route is one FastAPI POST that reads and parses the JSON
body and answers 201 with the bytes the gateway answered for the same Sweep. The difference is what the
gateway adds: middleware, admission (decode, default, validate), the JetStream KV create round trip
and encoding the stored object.

The load is a closed loop: 50 clients, each on its own keep-alive HTTP/1.1 connection (a minimal asyncio
client, see _Connection), each sending its next create as soon as its last one is answered. Runs
alternate (bare, gateway, bare, gateway, ...) and the best rate of each is kept, with the latencies of
that run: alternation spreads drift in machine load over both, and the best run is the one least
disturbed by the rest of the machine.
"""

from __future__ import annotations

import asyncio
import math
import os
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import uvicorn
import yaml
from fastapi import FastAPI, Request
from starlette.responses import Response

from bench.running import Result, bus_auth, cpu_seconds
from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.servicing import tune_gc
from nodus_testing.natsserver import NatsServer
from nodus_testing.processes import free_port, stop, wait_for_port

CLIENTS: Final = 50
WARMUP: Final = 200
ROUNDS: Final = 3  # bare, gateway, three times
P99_BUDGET_MS: Final = 50.0
TOKEN: Final = "bench-admin-token-0123456789abcdef"
NAMESPACE: Final = "bench"
COLLECTION: Final = "/apis/nodus.dev/v1/namespaces/{namespace}/sweeps"
EXAMPLE: Final = Path(__file__).resolve().parent.parent / "examples" / "sweep.yaml"
# What the parent hands a server process (argv would do, but env is how the gateway is configured).
NATS_URL_ENV: Final = "BENCH_NATS_URL"
NATS_SEED_ENV: Final = "BENCH_NATS_SEED"
"""The seed file of the gateway's own credential: the bus refuses anonymous clients (ADR-0026)."""
BODY_FILE_ENV: Final = "BENCH_BARE_BODY_FILE"
BARE_PATH_ENV: Final = "BENCH_BARE_PATH"
"""The bare route's path (default: the Sweeps collection); bench/usercreate_bench.py posts Jobs."""
TLS_CERT_ENV: Final = "BENCH_TLS_CERT"
TLS_KEY_ENV: Final = "BENCH_TLS_KEY"
"""With both set, a server of this module serves HTTPS with that certificate (bench/usercreate_bench.py)."""


# ---------------------------------------------------------------------------------------------------------
# The servers (run in their own processes)
# ---------------------------------------------------------------------------------------------------------


def _uvicorn_config(app: FastAPI, port: int) -> uvicorn.Config:
    """The one set of uvicorn settings both servers run with (as the gateway's ApiServer sets it, plus the
    event loop and HTTP parser pinned so that neither side gets uvloop or httptools and the other not)."""
    return uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="asyncio",
        http="h11",
        lifespan="off",
        access_log=False,
        log_level="warning",
        server_header=False,
        backlog=2048,
        ssl_certfile=os.environ.get(TLS_CERT_ENV),
        ssl_keyfile=os.environ.get(TLS_KEY_ENV),
    )


def _bare_app(answer: bytes, path: str = COLLECTION) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.post(path, status_code=201)
    async def create(namespace: str, request: Request) -> Response:
        # Read and parse the body as any create must; the answer is the gateway's, encoded once.
        msgspec.json.decode(await request.body())
        return Response(answer, status_code=201, media_type="application/json")

    return app


async def _serve(which: str, port: int) -> None:
    if which == "gateway":
        # Imported here, in the server process only: the load generator stays free of the gateway's
        # import cost and memory, and `python -m bench store` runs even while the gateway is mid-edit.
        from nodus_gateway.app import build_app
        from nodus_gateway.resources import stores_for

        nc = await connect(os.environ[NATS_URL_ENV], "bench-gateway", nkey_seed=os.environ.get(NATS_SEED_ENV))
        app = build_app(stores_for(nc), admin_token=TOKEN, ready=lambda: nc.is_connected)
    elif which == "bare":
        answer = Path(os.environ[BODY_FILE_ENV]).read_bytes()  # noqa: ASYNC240 (before serving)
        app = _bare_app(answer, os.environ.get(BARE_PATH_ENV, COLLECTION))
    else:
        raise SystemExit(f"serve: no server {which!r} (gateway or bare)")
    tune_gc()  # as every service does once started (servicing.tune_gc), for both servers alike
    # serve() rather than uvicorn.run(): the gateway's NATS connection must live in the loop that serves
    # (as in the service's ApiServer). Both servers go through this one line, so their settings cannot
    # drift apart; uvicorn still handles SIGTERM, which is how the benchmark stops them.
    await uvicorn.Server(_uvicorn_config(app, port)).serve()


# ---------------------------------------------------------------------------------------------------------
# The load generator (this process)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    server: str
    rate: float  # requests per second
    latencies_ms: list[float]  # sorted
    server_cpu_us: float  # CPU of the HTTP server process per request, µs
    bus_cpu_us: float  # CPU of nats-server per request, µs (0 for the bare route, which does not use it)
    client_cpu_us: float  # CPU of this process (the load generator) per request, µs

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile: the smallest latency that at least p% of requests did not exceed."""
        return self.latencies_ms[max(0, math.ceil(p / 100 * len(self.latencies_ms)) - 1)]

    def line(self) -> str:
        return (
            f"  {self.server:8} {self.rate:7,.0f} req/s   p50 {self.percentile(50):6.1f} ms   "
            f"p99 {self.percentile(99):6.1f} ms   server CPU {self.server_cpu_us:5.0f} µs/req   "
            f"nats-server CPU {self.bus_cpu_us:4.0f} µs/req   "
            f"generator CPU {self.client_cpu_us:6.0f} µs/req"
        )


def _sweep_body(name: str, template: dict[str, Any]) -> bytes:
    return msgspec.json.encode({**template, "metadata": {**template["metadata"], "name": name}})


class _Connection:
    """One keep-alive HTTP/1.1 connection that POSTs and reads whole answers, and nothing more.

    Not httpx: on this machine httpx spends ~2 ms of CPU per request at one connection and ~3.6 ms at
    50 (its pool is scanned per request), against ~0.35 ms for the bare server, so with it the benchmark
    measured httpx (the bare route topped out near 250 requests/s). This client costs ~0.1 ms a request.
    It relies on what both servers (uvicorn with h11) always do: answer with a Content-Length.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        self.reader, self.writer, self.head = reader, writer, head

    @classmethod
    async def open(cls, port: int, path: str, tls: ssl.SSLContext | None = None) -> _Connection:
        """``tls``: over HTTPS with that context (bench/usercreate_bench.py), one handshake per connection."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        return cls(reader, writer, head)

    async def post(self, body: bytes) -> tuple[int, bytes]:
        self.writer.write(b"%s%d\r\n\r\n%s" % (self.head, len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *headers = head[:-4].split(b"\r\n")
        length = None
        for header in headers:
            name, _, value = header.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            raise RuntimeError(f"an answer without Content-Length: {head!r}")
        return int(status_line.split()[1]), await self.reader.readexactly(length)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def drive(
    connections: list[_Connection], bodies: list[bytes], seen: Callable[[bytes], None] | None = None
) -> list[float]:
    """Send every body, one request in flight per connection; each request's latency in ms, in no order.
    ``seen`` is handed each 201's body (the usercreate bench counts answers without an estimate)."""
    latencies: list[float] = []
    queue = iter(bodies)  # shared: each client takes the next body when its last request is answered

    async def client_loop(conn: _Connection) -> None:
        for body in queue:
            start = time.perf_counter()
            status, answer = await conn.post(body)
            latencies.append((time.perf_counter() - start) * 1000)
            if status != 201:
                raise RuntimeError(f"POST: {status} {answer[:500]!r}")
            if seen is not None:
                seen(answer)

    await asyncio.gather(*(client_loop(c) for c in connections))
    return latencies


async def _measure(
    server: str, port: int, pid: int, bus_pid: int | None, n: int, tag: str, template: dict[str, Any]
) -> Run:
    path = COLLECTION.format(namespace=NAMESPACE)
    # Bodies are encoded before the clock starts: the generator's own work should be HTTP only.
    warm = [_sweep_body(f"{tag}-w{i}", template) for i in range(WARMUP)]
    bodies = [_sweep_body(f"{tag}-{i}", template) for i in range(n)]
    connections = [await _Connection.open(port, path) for _ in range(CLIENTS)]
    try:
        # Warm-up uses every connection and lets both servers reach their steady state.
        await drive(connections, warm)
        server_cpu, bus_cpu, client_cpu = cpu_seconds(pid), cpu_seconds(bus_pid), time.process_time()
        start = time.perf_counter()
        latencies = await drive(connections, bodies)
        elapsed = time.perf_counter() - start
        server_cpu = cpu_seconds(pid) - server_cpu
        bus_cpu = cpu_seconds(bus_pid) - bus_cpu
        client_cpu = time.process_time() - client_cpu
    finally:
        for c in connections:
            await c.close()
    per_request = 1e6 / n
    return Run(
        server,
        n / elapsed,
        sorted(latencies),
        server_cpu * per_request,
        bus_cpu * per_request,
        client_cpu * per_request,
    )


class _Server:
    """One uvicorn server process of this module, its output in a log file in ``tmp``."""

    def __init__(self, which: str, tmp: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log = tmp / f"{which}.log"
        cmd = [sys.executable, "-m", "bench.gateway_bench", "serve", which, str(self.port)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                cwd=Path(__file__).resolve().parent.parent,
            )
        try:
            wait_for_port(self.port, self.proc, deadline_s=30)
        except Exception:
            stop(self.proc)
            raise RuntimeError(f"{which} server did not start:\n{self.log.read_text()[-4000:]}") from None

    def close(self) -> None:
        stop(self.proc, grace_s=10)


def _bus_env(nats_server: NatsServer) -> dict[str, str]:
    """The gateway server's bus: the URL and the gateway's own credential, as the stack runs it."""
    if nats_server.credentials is None:  # --no-auth: the comparison run
        return {NATS_URL_ENV: nats_server.url}
    return {NATS_URL_ENV: nats_server.url, NATS_SEED_ENV: str(nats_server.credentials.seed("gateway"))}


async def run(n: int) -> list[Result]:
    template: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    with (
        NatsServer(auth=bus_auth()) as nats_server,
        tempfile.TemporaryDirectory(prefix="nodus-bench-") as tmp_dir,
    ):
        tmp = Path(tmp_dir)
        nc = await connect(nats_server.url, "bench", nkey_seed=nats_server.harness_seed)
        await declaring.ensure(nc.jetstream())  # the buckets, as the stack's declare step makes them
        await nc.close()
        assert nats_server.proc is not None
        gateway = _Server("gateway", tmp, _bus_env(nats_server))
        bare: _Server | None = None
        try:
            # The bare route answers with exactly what the gateway answers for this Sweep.
            conn = await _Connection.open(gateway.port, COLLECTION.format(namespace=NAMESPACE))
            status, answer = await conn.post(_sweep_body("template", template))
            await conn.close()
            if status != 201:
                raise RuntimeError(f"the gateway refused the example Sweep: {status} {answer!r}")
            (tmp / "answer.json").write_bytes(answer)
            bare = _Server("bare", tmp, {BODY_FILE_ENV: str(tmp / "answer.json")})

            runs: list[Run] = []
            for round_no in range(ROUNDS):
                bus = nats_server.proc.pid
                runs.append(
                    await _measure("bare", bare.port, bare.proc.pid, None, n, f"b{round_no}", template)
                )
                runs.append(
                    await _measure(
                        "gateway", gateway.port, gateway.proc.pid, bus, n, f"g{round_no}", template
                    )
                )
        finally:
            gateway.close()
            if bare is not None:
                bare.close()

    lazy = await _without_per_write_fsync(n, template)
    best_bare = max((r for r in runs if r.server == "bare"), key=lambda r: r.rate)
    best_gw = max((r for r in runs if r.server == "gateway"), key=lambda r: r.rate)
    _print_notes([*runs, lazy], n)
    return [
        *_results(best_gw, best_bare),
        Result(
            f"gateway create (201), {CLIENTS} clients, nats-server fsync at its default cadence "
            f"(context: p99 {lazy.percentile(99):.1f} ms)",
            "bare FastAPI route",
            lazy.rate,
            best_bare.rate,
        ),
    ]


async def _without_per_write_fsync(n: int, template: dict[str, Any]) -> Run:
    """The gateway once more, against a nats-server that leaves fsync to its default cadence (not what
    the stack runs: it shows how much of the gap to the bare route is the disk's, not the gateway's)."""
    with (
        NatsServer(sync_always=False, auth=bus_auth()) as nats_server,
        tempfile.TemporaryDirectory(prefix="nodus-bench-") as d,
    ):
        nc = await connect(nats_server.url, "bench", nkey_seed=nats_server.harness_seed)
        await declaring.ensure(nc.jetstream())
        await nc.close()
        assert nats_server.proc is not None
        gateway = _Server("gateway", Path(d), _bus_env(nats_server))
        try:
            runs = [
                await _measure(
                    "gw-lazy", gateway.port, gateway.proc.pid, nats_server.proc.pid, n, f"l{i}", template
                )
                for i in range(2)
            ]
        finally:
            gateway.close()
    return max(runs, key=lambda r: r.rate)


def _results(gw: Run, bare: Run) -> list[Result]:
    # running.Result compares rates (higher is better). Latencies are written as 1000/ms, "requests per
    # second at that latency", so the ratio column stays higher-is-better: bare latency / gateway latency.
    # The absolute budget (p99 < 50 ms) becomes a row against a 50 ms "baseline" with target 100%.
    g50, g99, b50, b99 = gw.percentile(50), gw.percentile(99), bare.percentile(50), bare.percentile(99)
    gw_cpu = gw.server_cpu_us + gw.bus_cpu_us
    return [
        Result(f"gateway create (201), {CLIENTS} clients", "bare FastAPI route", gw.rate, bare.rate, 0.50),
        Result(
            f"gateway p99 latency {g99:.1f} ms, as 1000/ms",
            f"p99 budget {P99_BUDGET_MS:.0f} ms, as 1000/ms",
            1000 / g99,
            1000 / P99_BUDGET_MS,
            target=1.0,
        ),
        Result(
            f"gateway p50 latency {g50:.1f} ms, as 1000/ms", f"bare p50 {b50:.1f} ms", 1000 / g50, 1000 / b50
        ),
        Result(
            f"gateway p99 latency {g99:.1f} ms, as 1000/ms", f"bare p99 {b99:.1f} ms", 1000 / g99, 1000 / b99
        ),
        Result(
            f"gateway CPU {gw_cpu:.0f} µs/req (gateway {gw.server_cpu_us:.0f} + nats-server "
            f"{gw.bus_cpu_us:.0f}), as 1e6/µs",
            f"bare server CPU {bare.server_cpu_us:.0f} µs/req",
            1e6 / gw_cpu,
            1e6 / bare.server_cpu_us,
        ),
    ]


def _print_notes(runs: list[Run], n: int) -> None:
    cores = len(os.sched_getaffinity(0))
    print(
        f"gateway: {n} creates per run after {WARMUP} warm-up, {CLIENTS} concurrent clients, runs in order:"
    )
    for r in runs:
        print(r.line())
    notes = (
        f"The load generator (this process) shares the machine's {cores} cores with both servers and "
        "nats-server. It is a minimal asyncio HTTP/1.1 client: httpx cost more CPU per request than the "
        "bare server itself. CPU per request is the measure the shared cores skew least (it is read from "
        "/proc at 10 ms clock ticks). With a fixed 50 clients, mean latency is 50 / rate (Little's law), "
        "so the p99 budget is a throughput floor too. nats-server syncs every write to disk "
        "(sync_interval: always), as the stack runs it; creates that reach the store together are written "
        "as one atomic batch with one sync (ADR-0034). The gateway logs at Python's default level "
        "(WARNING): the service's JSON access line per request (INFO) is not in these numbers; gw-lazy is "
        "the gateway against a nats-server that fsyncs at its default cadence instead, for context. No "
        "scheduler or billing runs here, so the first create's estimate request (ADR-031) gets NATS's "
        "immediate no-responders answer, and for a second after each such answer creates do not ask again "
        "(gateway estimating.py): the Sweeps are admitted without an estimate, with a Warning header."
    )
    print("\n".join(textwrap.wrap(notes, 110)) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        # NODUS_BENCH_PROFILE=<dir>: the gateway server runs under cProfile and leaves <dir>/gateway.prof
        # when it stops (uvicorn ends serve() on SIGTERM); the rates printed are then not the bench's.
        profile = os.environ.get("NODUS_BENCH_PROFILE")
        if profile and sys.argv[2] == "gateway":
            import cProfile
            import signal

            profiler = cProfile.Profile()

            def _dump(*_: object) -> None:
                # uvicorn restores this handler and raises SIGTERM again once it has stopped serving.
                profiler.disable()
                profiler.dump_stats(str(Path(profile) / "gateway.prof"))
                raise SystemExit(0)

            signal.signal(signal.SIGTERM, _dump)
            profiler.enable()
        asyncio.run(_serve(sys.argv[2], int(sys.argv[3])))
    else:
        raise SystemExit("usage: python -m bench.gateway_bench serve {gateway|bare} PORT")
