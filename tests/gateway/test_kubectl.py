"""The real kubectl (the one on the PATH) against a real gateway: discovery, Tables, OpenAPI and the verbs.

client-go sends a kubeconfig's bearer token only over TLS (an ``http://`` server gets no credentials at
all), so the gateway is served as the local stack serves it: HTTPS with a certificate of the stack's own
CA (:mod:`nodus_testing.certs`), and kubectl gets nothing but the kubeconfig that ``make up`` writes
(:func:`nodus_testing.localstack.kubeconfig`, the CA inside it). The last test starts the local stack
itself and uses the very file it wrote.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_kit.storing import ObjectStore
from nodus_schema import ObjectMeta
from nodus_schema.nodes import Node, NodeSpec
from nodus_testing import certs
from nodus_testing.localstack import Stack, kubeconfig

# The machine's kubectl is the real client these tests drive; without it (or openssl, for the local CA)
# they fail loudly rather than skip: CI must exercise them.
pytestmark = pytest.mark.slow
assert shutil.which("kubectl"), "kubectl is not on the PATH: install it (Debian/Google package kubectl)"
assert shutil.which("openssl"), "openssl is not on the PATH: apt-get install openssl"

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
    cache: Path
    workdir: Path

    def argv(self, *args: str) -> list[str]:
        # Only the kubeconfig: no --certificate-authority, --token or --insecure-skip-tls-verify. The
        # discovery cache goes to the test's own directory, not ~/.kube.
        return ["kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache), *args]

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


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> certs.Certs:
    """The local stack's CA and gateway certificate, made as ``make up`` makes them."""
    return certs.ensure(tmp_path_factory.mktemp("certs"))


@pytest_asyncio.fixture
async def gateway(nc: NATS, tls: certs.Certs) -> AsyncIterator[ApiServer]:
    """The gateway's own HTTP server with the local stack's TLS settings."""
    app = build_app(stores_for(nc), admin_token=TOKEN)
    server = ApiServer(app, "127.0.0.1", 0, ssl_certfile=str(tls.cert), ssl_keyfile=str(tls.key))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def kubectl(gateway: ApiServer, tls: certs.Certs, tmp_path: Path) -> Kubectl:
    assert gateway.url.startswith("https://127.0.0.1:")
    config_path = tmp_path / "kubeconfig"
    config_path.write_text(kubeconfig(gateway.url, TOKEN, tls.ca.read_bytes()))
    return Kubectl(config_path, tmp_path / "cache", tmp_path)


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


async def test_the_admin_deletes_a_node(kubectl: Kubectl, nc: NATS, unique: str) -> None:
    # A cluster-scoped kind, and the one write its row allows (the record of an agent gone for good).
    node = Node(metadata=ObjectMeta(name=unique), spec=NodeSpec(offering="l4-x1-us", region_class="us"))
    await ObjectStore(nc, "nodes", Node).create(node)
    deleted = await kubectl("delete", f"node.nodus.dev/{unique}")
    assert deleted.stdout.strip() == f'node.nodus.dev "{unique}" deleted'
    missing = await kubectl("get", f"node.nodus.dev/{unique}", ok=False)
    assert f'nodes.nodus.dev "{unique}" not found' in missing.stderr


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


async def test_the_kubeconfig_carries_the_trust_and_the_token(
    kubectl: Kubectl, gateway: ApiServer, tmp_path: Path
) -> None:
    # Without the CA data kubectl refuses the certificate, and over plain http it would send no token:
    # the kubeconfig's certificate-authority-data is what makes the file work on its own.
    untrusted = tmp_path / "untrusted"
    untrusted.write_text(kubeconfig(gateway.url, TOKEN))
    refused = await Kubectl(untrusted, tmp_path / "cache2", tmp_path)("get", "sweeps", ok=False)
    assert refused.returncode == 1 and "certificate signed by unknown authority" in refused.stderr
    wrong = tmp_path / "wrong-token"
    wrong.write_text(kubectl.kubeconfig.read_text().replace(TOKEN, "not-the-token"))
    denied = await Kubectl(wrong, tmp_path / "cache3", tmp_path)("get", "sweeps", ok=False)
    assert denied.returncode == 1 and "You must be logged in to the server" in denied.stderr


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    # As `make up` lays it out: the stack's root is .nodus in the working directory.
    s = Stack(tmp_path / ".nodus")
    try:
        yield s
    finally:
        s.stop()


async def test_the_kubeconfig_that_make_up_writes_works(stack: Stack, tmp_path: Path) -> None:
    values = await asyncio.to_thread(stack.start, deadline_s=90)
    assert values["NODUS_URL"].startswith("https://127.0.0.1:")
    assert values["NODUS_CA"] == str(stack.root / "ca.crt")
    local_env = (stack.root / "local.env").read_text()
    assert (
        f"NODUS_CA={values['NODUS_CA']}\n" in local_env
        and f"NODUS_TOKEN={values['NODUS_TOKEN']}" in local_env
    )
    for private in ("kubeconfig", "local.env", "ca.key", "gateway.key"):
        assert (stack.root / private).stat().st_mode & 0o077 == 0, private

    kubectl = Kubectl(stack.kubeconfig, tmp_path / "cache", tmp_path)
    listed = await kubectl("get", "sweeps")
    assert "No resources found in default namespace." in listed.stderr
    applied = await kubectl("apply", "-f", kubectl.manifest("lr"))
    assert applied.stdout.strip() == "sweep.nodus.dev/lr created"
    table = (await kubectl("get", "sweeps")).stdout.splitlines()
    assert table[1].split()[0] == "lr"
    assert (await kubectl("delete", "sweep", "lr")).returncode == 0
