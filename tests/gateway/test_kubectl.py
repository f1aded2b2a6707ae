"""The real kubectl (the one on the PATH) against a real gateway: discovery, Tables, OpenAPI and the verbs.

The gateway is served over HTTPS with a throwaway self-signed certificate: client-go sends a kubeconfig's
bearer token only over TLS (an ``http://`` server gets no credentials at all), so kubectl needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import uvicorn
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.resources import stores_for
from nodus_gateway.server import bind
from nodus_testing.localstack import kubeconfig
from nodus_testing.waiting import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on the PATH"),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not on the PATH"),
]

TOKEN = "kubectl-test-token-0123456789"
SWEEP = """\
apiVersion: nodus.dev/v1
kind: Sweep
metadata:
  name: {name}
spec:
  maxParallel: {parallel}
  matrix:
    params:
      LR: ["0.1", "0.01"]
  template:
    spec:
      image: busybox
      command: ["true"]
      resources:
        gpu: "H100:1"
"""


@dataclass
class Kubectl:
    kubeconfig: Path
    ca: Path
    cache: Path
    workdir: Path

    def argv(self, *args: str) -> list[str]:
        # The discovery cache goes to the test's own directory, not ~/.kube.
        base = ["kubectl", "--kubeconfig", str(self.kubeconfig), "--certificate-authority", str(self.ca)]
        return [*base, "--cache-dir", str(self.cache), *args]

    async def __call__(
        self, *args: str, ok: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        done = await asyncio.to_thread(
            subprocess.run, self.argv(*args), capture_output=True, text=True, timeout=timeout
        )
        if ok:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
            assert "Unhandled Error" not in done.stderr, done.stderr  # discovery or OpenAPI trouble
        return done

    def manifest(self, name: str, parallel: int = 4) -> str:
        path = self.workdir / f"{name}-{parallel}.yaml"
        path.write_text(SWEEP.format(name=name, parallel=parallel))
        return str(path)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the test's loop owns the signals


async def _certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    argv += ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
    argv += ["-addext", "subjectAltName=IP:127.0.0.1"]
    await asyncio.to_thread(subprocess.run, argv, check=True, capture_output=True, timeout=60)
    return cert, key


@pytest_asyncio.fixture
async def kubectl(nc: NATS, tmp_path: Path) -> AsyncIterator[Kubectl]:
    app = build_app(stores_for(nc), admin_token=TOKEN)
    cert, key = await _certificate(tmp_path)
    sock = bind("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app, lifespan="off", log_config=None, access_log=False, ssl_certfile=str(cert), ssl_keyfile=str(key)
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(lambda: server.started, deadline_s=10, message="the gateway did not start")
        config_path = tmp_path / "kubeconfig"
        config_path.write_text(kubeconfig(f"https://127.0.0.1:{port}", TOKEN))
        yield Kubectl(config_path, cert, tmp_path / "cache", tmp_path)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


async def test_version_and_api_resources(kubectl: Kubectl) -> None:
    version = json.loads((await kubectl("version", "-o", "json")).stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v")
    listed = (await kubectl("api-resources", "--api-group=nodus.dev", "-o", "wide")).stdout.splitlines()
    sweeps = next(line.split() for line in listed if line.startswith("sweeps "))
    assert sweeps[:5] == ["sweeps", "sw", "nodus.dev/v1", "true", "Sweep"]
    assert "list" in sweeps[5] and "create" in sweeps[5]
    assert sweeps[-1] == "all,nodus"


async def test_create_get_describe_delete(kubectl: Kubectl, unique: str) -> None:
    ns = ["-n", unique]
    created = await kubectl("create", "-f", kubectl.manifest("lr"), *ns)
    assert created.stdout.strip() == "sweep.nodus.dev/lr created"

    table = (await kubectl("get", "sweeps", *ns)).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "CELLS", "SPENT", "BEST-COST", "BEST-THROUGHPUT", "AGE"]
    assert table[1].split()[:4] == ["lr", "Pending", "0/2", "-"]
    wide = (await kubectl("get", "sw", "lr", "-o", "wide", *ns)).stdout.splitlines()
    assert wide[0].split()[-1] == "REASON"
    assert "lr" in (await kubectl("get", "all", *ns)).stdout

    obj = json.loads((await kubectl("get", "sw", "lr", "-o", "json", *ns)).stdout)
    assert (obj["kind"], obj["metadata"]["name"], obj["spec"]["maxParallel"]) == ("Sweep", "lr", 4)

    described = (await kubectl("describe", "sweep", "lr", *ns)).stdout
    assert "Name:         lr" in described
    assert "Kind:         Sweep" in described
    assert "Max Parallel:  4" in described

    missing = await kubectl("get", "sw", "nope", *ns, ok=False)
    assert missing.returncode == 1
    assert 'Error from server (NotFound): sweeps.nodus.dev "nope" not found' in missing.stderr

    deleted = await kubectl("delete", "sweep", "lr", *ns)
    assert deleted.stdout.strip() == 'sweep.nodus.dev "lr" deleted'
    empty = await kubectl("get", "sweeps", *ns)
    assert f"No resources found in {unique} namespace." in empty.stderr


async def test_explain_reads_the_openapi_v3_schema(kubectl: Kubectl) -> None:
    explained = (await kubectl("explain", "sweeps.spec.maxParallel")).stdout
    assert "KIND:       Sweep" in explained
    assert "FIELD: maxParallel <integer>" in explained
    assert "1 to 256" in explained
    fields = (await kubectl("explain", "sweep.status.best")).stdout
    assert "byCost\t<integer>" in fields


async def test_apply_creates_then_patches(kubectl: Kubectl, unique: str) -> None:
    ns = ["-n", unique]
    first = await kubectl("apply", "-f", kubectl.manifest("lr", parallel=4), *ns)
    assert first.stdout.strip() == "sweep.nodus.dev/lr created"
    again = await kubectl("apply", "-f", kubectl.manifest("lr", parallel=2), *ns)
    assert again.stdout.strip() == "sweep.nodus.dev/lr configured"
    obj = json.loads((await kubectl("get", "sw", "lr", "-o", "json", *ns)).stdout)
    assert obj["spec"]["maxParallel"] == 2
    assert "kubectl.kubernetes.io/last-applied-configuration" in obj["metadata"]["annotations"]


async def test_patch_merges(kubectl: Kubectl, unique: str) -> None:
    ns = ["-n", unique]
    await kubectl("create", "-f", kubectl.manifest("lr"), *ns)
    patched = await kubectl("patch", "sweep", "lr", "--type=merge", "-p", '{"spec":{"maxParallel":2}}', *ns)
    assert patched.stdout.strip() == "sweep.nodus.dev/lr patched"
    got = await kubectl("get", "sw", "lr", "-o", "jsonpath={.spec.maxParallel}", *ns)
    assert got.stdout == "2"
    refused = await kubectl(
        "patch", "sweep", "lr", "--type=merge", "-p", '{"spec":{"repetitions":3}}', *ns, ok=False
    )
    assert refused.returncode == 1 and "Sweep" in refused.stderr and "invalid" in refused.stderr


async def test_get_watch_prints_rows_as_objects_change(kubectl: Kubectl, unique: str) -> None:
    ns = ["-n", unique]
    await kubectl("create", "-f", kubectl.manifest("lr"), *ns)
    proc = await asyncio.create_subprocess_exec(
        *kubectl.argv("get", "sweeps", "-w", *ns),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:

        async def line() -> list[str]:
            assert proc.stdout is not None
            return (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().split()

        assert (await line())[:3] == ["NAME", "PHASE", "CELLS"]
        assert (await line())[:3] == ["lr", "Pending", "0/2"]
        await kubectl("create", "-f", kubectl.manifest("lr2"), *ns)
        assert (await line())[:3] == ["lr2", "Pending", "0/2"]
        await kubectl("delete", "sweep", "lr", *ns)
        assert (await line())[0] == "lr"
    finally:
        proc.terminate()
        await proc.wait()
