"""The gateway as production runs it: its own process, a real HTTP port, the kit's health port, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client as NATS

from nodus_testing.processes import free_port
from nodus_testing.waiting import eventually


@pytest.mark.slow
async def test_gateway_process_serves_the_api_and_stops_on_sigterm(
    nats_url: str, nats_seed: Path, nc: NATS, unique: str
) -> None:
    # nc: the session's connection declared the streams, which a service with a credential only awaits.
    api_port, health_port = free_port(), free_port()
    env = {
        **os.environ,
        "NODUS_NATS_URL": nats_url,
        "NODUS_NATS_NKEY_SEED": str(nats_seed),
        "NODUS_ADMIN_TOKEN": "process-token",
        "NODUS_GATEWAY_PORT": str(api_port),
        "NODUS_HEALTH_PORT": str(health_port),
    }
    # A real process, as production runs it; Popen returns at once (it does not wait).
    proc = subprocess.Popen([sys.executable, "-m", "nodus_gateway"], env=env, stderr=subprocess.PIPE)  # noqa: ASYNC220
    try:
        async with httpx.AsyncClient(timeout=5) as client:

            async def ready() -> bool:
                try:
                    resp = await client.get(f"http://127.0.0.1:{health_port}/readyz")
                except httpx.TransportError:
                    return False
                return resp.status_code == 200 and resp.json()["checks"] == {"nats": True, "http": True}

            await eventually(ready, deadline_s=20, message="the gateway never became ready")
            base = f"http://127.0.0.1:{api_port}/apis/nodus.dev/v1/namespaces/{unique}/sweeps"
            auth = {"Authorization": "Bearer process-token"}
            sweep = {
                "apiVersion": "nodus.dev/v1",
                "kind": "Sweep",
                "metadata": {"name": "lr"},
                "spec": {
                    "matrix": {"params": {"LR": ["0.1", "0.01"]}},
                    "template": {
                        "spec": {"image": "busybox", "command": ["true"], "resources": {"gpu": "H100:1"}}
                    },
                },
            }
            created = await client.post(base, json=sweep, headers=auth)
            assert created.status_code == 201, created.text
            got = await client.get(f"{base}/lr", headers=auth)
            assert got.json()["metadata"]["uid"] == created.json()["metadata"]["uid"]
            assert (await client.get(base)).status_code == 401
            assert (await client.get(f"http://127.0.0.1:{api_port}/readyz")).text == "ok"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert '"msg": "API listening"' in stderr, stderr
    assert "POST /apis/nodus.dev/v1/namespaces" in stderr  # the access log, one line per request


def test_gateway_refuses_to_start_without_an_admin_token(nats_url: str, nats_seed: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODUS_ADMIN_TOKEN"}
    env["NODUS_NATS_URL"] = nats_url
    env["NODUS_NATS_NKEY_SEED"] = str(nats_seed)
    done = subprocess.run(
        [sys.executable, "-m", "nodus_gateway"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "NODUS_ADMIN_TOKEN is not set" in done.stderr
    assert "Traceback" not in done.stderr
