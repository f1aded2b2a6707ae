"""The service base, run as production runs it: a separate process, health endpoints, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nodus_kit import messaging, tracing
from nodus_kit.servicing import JsonFormatter, Settings
from nodus_testing.processes import free_port
from nodus_testing.waiting import eventually


def test_settings_from_environment() -> None:
    s = Settings.from_env(
        "nodus-x", {"NODUS_NATS_URL": "nats://h:1", "NODUS_HEALTH_PORT": "8081", "NODUS_LOG_LEVEL": "debug"}
    )
    assert (s.nats_url, s.health_port, s.log_level) == ("nats://h:1", 8081, "DEBUG")


def test_json_logs_carry_request_id_and_extras() -> None:
    token = tracing.set_request_id("rid-1")
    try:
        record = logging.makeLogRecord({"msg": "placed %s", "args": ("j",), "levelname": "INFO", "job": "j"})
        out = json.loads(JsonFormatter("nodus-x").format(record))
    finally:
        tracing._request_id.reset(token)
    assert out["msg"] == "placed j" and out["requestId"] == "rid-1" and out["job"] == "j"


async def _http_get(port: int, path: str) -> tuple[int, dict[str, object]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.slow
@pytest.mark.parametrize(
    "module", ["nodus_gateway", "nodus_sweeps", "nodus_scheduler", "nodus_billing", "nodus_agent"]
)
async def test_each_service_starts_reports_ready_and_stops_on_sigterm(
    nats_url: str, nats_seed: Path, nc: NATS, module: str, tmp_path: Path
) -> None:
    # nc: the session's connection declared the streams, which a service with a credential only awaits.
    port = free_port()
    env = {
        **os.environ,
        "NODUS_NATS_URL": nats_url,
        "NODUS_NATS_NKEY_SEED": str(nats_seed),
        "NODUS_HEALTH_PORT": str(port),
        "NODUS_ADMIN_TOKEN": "test-token",
        "NODUS_GATEWAY_PORT": str(free_port()),
        "NODUS_AGENT_WORKDIR": str(tmp_path / "agent"),
        "NODUS_REPLICA": f"{module}-under-test",
    }
    # A real process, as production runs it; Popen returns at once (it does not wait). Its logs go to a
    # file, not a pipe: on the session's busy server a service logs more than a pipe holds, and a
    # process blocked writing to a full pipe cannot exit.
    log_path = tmp_path / "stderr.log"
    log = log_path.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", module], env=env, stderr=log)  # noqa: ASYNC220
    try:

        async def ready() -> bool:
            try:
                status, body = await _http_get(port, "/readyz")
            except OSError:
                return False
            # The answer names the replica, so a supervisor can tell its process from one that holds a
            # port handed out twice.
            return (
                status == 200
                and body["status"] == "ok"
                and body["checks"]["nats"] is True
                and body["replica"] == f"{module}-under-test"
            )

        await eventually(ready, deadline_s=20, message=f"{module} never became ready")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        stderr = log_path.read_text()
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(line["msg"] == "service ready" for line in lines), stderr
    assert any(line["msg"] == "service stopping" for line in lines), stderr


async def test_trace_and_request_id_continue_across_the_bus(nc, unique: str) -> None:  # type: ignore[no-untyped-def]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    seen_rid: list[str | None] = []

    class Ping(dict[str, str]):
        pass

    async def handler(p: dict[str, str]) -> dict[str, str]:
        seen_rid.append(tracing.current_request_id())
        with tracer.start_as_current_span("server-side"):
            return {"ok": "1"}

    sub = await messaging.serve(nc, f"nodus.rpc.{unique}", dict, handler)
    token = tracing.set_request_id("rid-42")
    try:
        with tracer.start_as_current_span("client-side") as parent:
            await messaging.request(nc, f"nodus.rpc.{unique}", {"a": "b"}, dict)
            trace_id = parent.get_span_context().trace_id
    finally:
        tracing._request_id.reset(token)
        await sub.unsubscribe()
    server_span = next(s for s in exporter.get_finished_spans() if s.name == "server-side")
    assert server_span.context.trace_id == trace_id
    assert seen_rid == ["rid-42"]
