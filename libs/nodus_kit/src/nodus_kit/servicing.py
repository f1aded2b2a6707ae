"""The service base: settings from the environment, structured logs, a health endpoint, tracing,
and a run loop that shuts down gracefully on SIGTERM/SIGINT.

A service is a :class:`Service` with ``start`` (declare endpoints, consumers, controllers) and ``stop``.
``main(ServiceClass)`` is all a ``__main__`` needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nats.aio.client import Client as NATS

from nodus_kit import declaring, measuring, permitting, tracing
from nodus_kit.connecting import connect

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    """Read once from ``NODUS_*`` variables; every field has a default that works on one machine."""

    service: str
    nats_url: str = "nats://127.0.0.1:4222"
    health_host: str = "127.0.0.1"
    health_port: int = 0  # 0: pick a free port (written to the log)
    log_level: str = "INFO"
    log_format: str = "json"
    replica: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    replicas: int | None = None  # stream replicas when declaring; None: 3 on a cluster of 3+, else 1
    env: dict[str, str] = field(default_factory=dict)
    nats_nkey_seed: str | None = None  # the process's nkey seed file (deploy/nats/, ADR-0026)
    nats_anonymous: bool = False
    """Connect without a credential (NODUS_NATS_ANONYMOUS=true): only where asked for explicitly, e.g. a
    test of the start-up path itself. Without it a service with no seed refuses to start."""

    @classmethod
    def from_env(cls, service: str, environ: dict[str, str] | None = None) -> Settings:
        e = dict(os.environ if environ is None else environ)
        return cls(
            service=service,
            nats_url=e.get("NODUS_NATS_URL", cls.nats_url),
            health_host=e.get("NODUS_HEALTH_HOST", cls.health_host),
            health_port=int(e.get("NODUS_HEALTH_PORT", "0")),
            log_level=e.get("NODUS_LOG_LEVEL", cls.log_level).upper(),
            log_format=e.get("NODUS_LOG_FORMAT", cls.log_format),
            replica=e.get("NODUS_REPLICA", f"{socket.gethostname()}-{os.getpid()}"),
            replicas=int(e["NODUS_STREAM_REPLICAS"]) if e.get("NODUS_STREAM_REPLICAS") else None,
            env={k: v for k, v in e.items() if k.startswith("NODUS_")},
            nats_nkey_seed=e.get("NODUS_NATS_NKEY_SEED") or None,
            nats_anonymous=e.get("NODUS_NATS_ANONYMOUS", "").lower() in ("1", "true", "yes"),
        )


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the request id and any ``extra`` fields."""

    _skip: ClassVar[set[str]] = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = tracing.current_request_id()
        if rid:
            out["requestId"] = rid
        out.update({k: v for k, v in vars(record).items() if k not in self._skip})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(settings.service))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {settings.service} %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)


Check = Callable[[], Awaitable[bool]]


class HealthServer:
    """``GET /healthz`` (alive), ``GET /readyz`` (every check passes) and ``GET /metrics`` (Prometheus,
    nodus_kit.measuring): a tiny HTTP server on asyncio,
    so no web framework is needed in services that have no HTTP API of their own."""

    def __init__(self, host: str, port: int, checks: dict[str, Check], replica: str = "") -> None:
        """``replica`` is named in every answer, so a supervisor that chose the port can tell this process
        from another that happens to hold it (a leftover of an earlier run, or a port handed out twice)."""
        self.host, self.port, self.checks, self.replica = host, port, checks, replica
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await asyncio.wait_for(reader.readline(), 5)).decode(errors="replace")
            path = line.split(" ")[1] if line.count(" ") >= 2 else "/"
            if path.split("?")[0] == "/metrics":
                # Read the request's headers first: closing a socket with unread input resets it, which
                # can cut a body this size short on the scraper's side.
                while (await asyncio.wait_for(reader.readline(), 5)).strip():
                    pass
                await _reply(writer, "200 OK", measuring.CONTENT_TYPE, measuring.exposition())
                return
            results = {}
            if path.startswith("/readyz"):
                for name, check in self.checks.items():
                    try:
                        results[name] = bool(await asyncio.wait_for(check(), 2))
                    except Exception:
                        results[name] = False
            ok = all(results.values()) and path.split("?")[0] in ("/healthz", "/readyz")
            body = json.dumps(
                {"status": "ok" if ok else "fail", "checks": results, "replica": self.replica}
            ).encode()
            status = (
                "200 OK"
                if ok
                else (
                    "404 Not Found"
                    if path.split("?")[0] not in ("/healthz", "/readyz")
                    else "503 Service Unavailable"
                )
            )
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except Exception:
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server:
            self._server.close()
            await self._server.wait_closed()


async def _reply(writer: asyncio.StreamWriter, status: str, content_type: str, body: bytes) -> None:
    writer.write(
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


class Service:
    """Base of every Nodus service process. Subclasses set ``name`` and override ``start``/``stop``."""

    name: ClassVar[str] = "service"
    stop_timeout_s: float = 7.0
    """How long ``stop`` may take before the process exits anyway (the node agent allows its programs'
    stop grace on top)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.nc: NATS | None = None
        self.stopping = asyncio.Event()
        self.health: HealthServer | None = None

    @property
    def bus(self) -> NATS:
        assert self.nc is not None, "the service is not connected yet"
        return self.nc

    async def start(self) -> None:
        """Declare endpoints, consumers and controllers. Called once connected and declared."""

    async def stop(self) -> None:
        """Stop consumers and controllers; in-flight work finishes."""

    def checks(self) -> dict[str, Check]:
        async def bus_ok() -> bool:
            return self.nc is not None and self.nc.is_connected

        return {"nats": bus_ok}

    async def run(self) -> None:
        seed = self.settings.nats_nkey_seed
        if seed is None and not self.settings.nats_anonymous:
            raise SystemExit(
                f"{self.name}: no bus credential. Set NODUS_NATS_NKEY_SEED to this process's nkey seed file "
                "(`python -m nodus_kit.permitting generate`, deploy/nats/README.md); every process of Nodus "
                "authenticates (ADR-0026). NODUS_NATS_ANONYMOUS=true connects without one, for a test only."
            )
        name = f"{self.name}:{self.settings.replica}"
        self.nc = await connect(self.settings.nats_url, name, nkey_seed=seed)
        measuring.track_bus(self.name, self.nc)
        if seed is None:
            # Unset, the count comes from the cluster the server reports, and never lowers a stream's.
            configured = self.settings.replicas
            replicas = declaring.replicas_for(getattr(self.nc, "_server_info", {}), configured)
            await declaring.ensure(self.nc.jetstream(), replicas=replicas, lower=configured is not None)
        else:  # a credential may not declare: the admin bootstrap did (permitting.py, ADR-0026)
            await permitting.await_declared(self.nc.jetstream(), self.name)
        self.health = HealthServer(
            self.settings.health_host, self.settings.health_port, self.checks(), self.settings.replica
        )
        port = await self.health.start()
        await self.start()
        tune_gc()
        log.info("service ready", extra={"health": f"http://{self.settings.health_host}:{port}/readyz"})
        try:
            await self.stopping.wait()
        finally:
            log.info("service stopping")
            try:
                await asyncio.wait_for(self.stop(), self.stop_timeout_s)
            except TimeoutError:
                # A stop that hangs must not keep the process alive past its orchestrator's grace; what
                # was still running is safe to kill (every controller is), and its stacks say why.
                log.error(
                    "stop took longer than %ss; exiting anyway: %s", self.stop_timeout_s, _task_stacks()
                )
            await self.health.stop()
            # Drain flushes what was published and lets subscriptions finish what they hold; bounded, so
            # a subscription nobody reads any more (a cancelled watch) cannot hold the exit up.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), DRAIN_TIMEOUT_S)
            with contextlib.suppress(Exception):
                await self.nc.close()
            measuring.untrack_bus(self.nc)


DRAIN_TIMEOUT_S = 3.0


def _task_stacks() -> str:
    """Where every other task of the loop waits: for the log line of a stop that hung."""
    out = []
    for task in asyncio.all_tasks():
        if task is asyncio.current_task():
            continue
        frames = task.get_stack(limit=3)
        where = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames))
        out.append(f"{task.get_name()}: {where}")
    return "; ".join(out[:40])


GC_THRESHOLDS = (10_000, 50, 100)
"""Python's defaults (2,000 / 10 / 10 in 3.11) run a young collection every 2,000 allocations; a service
that builds a few hundred objects per request (an HTTP request, a decoded spec, a NATS message) then
spends a good part of its CPU in the collector, and its requests stall behind full collections of
everything it imported (in the gateway's benchmark: ~20% less CPU per create and half the p99 without
them, docs/benchmarks.md)."""


def tune_gc() -> None:
    """Once a service has started: move what it built so far (modules, routes, schemas) out of the
    collector's sight, where it will stay for the life of the process, and collect less often. Reference
    cycles are still collected; a full collection then walks only what requests created."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def main(cls: type[Service]) -> None:
    """Entry point of a service's ``python -m`` and console script."""
    settings = Settings.from_env(cls.name)
    setup_logging(settings)
    tracing.setup(cls.name)

    async def _run() -> None:
        service = cls(settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stopping.set)
        await service.run()

    try:
        asyncio.run(_run())
    finally:
        tracing.shutdown()  # the spans of the stop itself leave too, within a bounded time
