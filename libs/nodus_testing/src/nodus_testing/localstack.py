"""The local stack: nats-server, SeaweedFS and every Nodus service as its own process, as production runs.

``python -m nodus_testing.localstack up|down|status`` (the Makefile's ``make up`` and ``make down``;
``make run`` starts its own stack in ``.nodus/run`` and drives it with the ``nodus`` CLI). State lives
in ``.nodus/``: the servers' data, one log per process, ``stack.json`` (pids and ports, so ``down``
works from another shell), ``local.env`` (URLs, an admin token and the CA) and ``kubeconfig``.
End-to-end tests start the same :class:`Stack` in a temporary directory.

The gateway serves HTTPS with a certificate from a local CA (:mod:`nodus_testing.certs`, ``ca.crt`` in the
root): kubectl sends a kubeconfig's token only over TLS. ``NODUS_CA`` in local.env and the kubeconfig's
``certificate-authority-data`` are that CA. The services' health ports stay plain HTTP.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from nodus_kit import permitting
from nodus_testing import certs
from nodus_testing.natsserver import NatsServer
from nodus_testing.processes import free_port
from nodus_testing.seaweed import SeaweedS3

AGENT_BUCKET = "nodus-local"  # checkpoints and outputs of the stack's agents

SERVICES = (
    ("gateway", "nodus_gateway"),
    ("sweeps", "nodus_sweeps"),
    ("scheduler", "nodus_scheduler"),
    ("billing", "nodus_billing"),
)


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    health_port: int
    pid: int | None = None


@dataclass
class Stack:
    root: Path
    agents: list[dict[str, str]] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    credentials: bool = True
    """Each process with its own nkey credential, the streams declared by the admin (ADR-0026). Always,
    as in production; False is only for a test that asks explicitly for a bus without authentication."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables for every process of the stack, over this process's (e.g. an OTLP endpoint)."""
    s3: bool = True
    """Start SeaweedFS for the agents' checkpoints and outputs. Without it the agents have no store (a GPU
    host without the ``weed`` binary): Jobs run, no checkpoint is kept, and a Job that declares outputs
    fails its run, since they cannot be committed."""

    @property
    def state_file(self) -> Path:
        return self.root / "stack.json"

    def start(self, *, deadline_s: float = 60.0) -> dict[str, str]:
        """Start everything in the background (own sessions: they outlive this process) and wait until
        every service answers /readyz. Returns the variables written to local.env."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        tls = certs.ensure(self.root)
        creds = None
        if self.credentials:
            nodes = [a.get("NODUS_AGENT_NODE", f"agent-{i}") for i, a in enumerate(self.agents)]
            creds = permitting.generate(self._dir("nats-credentials"), nodes)
        accounts = creds.accounts.read_text() if creds else ""
        nats = NatsServer(store_dir=self._dir("nats"), extra_config=accounts, auth=creds is not None)
        nats.start()
        if creds is not None:  # services with a credential declare nothing: the bootstrap does, first
            admin = ["--url", nats.url, "--seed", str(creds.seed("admin"))]
            subprocess.run([sys.executable, "-m", "nodus_kit.permitting", "declare", *admin], check=True)
        s3 = SeaweedS3(data_dir=self._dir("s3")) if self.s3 else None
        if s3 is not None:
            s3.start()
        token = secrets.token_urlsafe(24)
        gateway_port = free_port()
        base = {
            **os.environ,
            **self.env,
            "NODUS_NATS_URL": nats.url,
            "NODUS_ADMIN_TOKEN": token,
            "NODUS_GATEWAY_PORT": str(gateway_port),
            "PYTHONUNBUFFERED": "1",
        }
        if s3 is not None:
            base.update(
                NODUS_S3_ENDPOINT=s3.endpoint_url,
                NODUS_S3_ACCESS_KEY=s3.access_key,
                NODUS_S3_SECRET_KEY=s3.secret_key,
            )
        for short, module in SERVICES:
            env = dict(base)
            if short == "gateway":
                env["NODUS_GATEWAY_TLS_CERT"] = str(tls.cert)
                env["NODUS_GATEWAY_TLS_KEY"] = str(tls.key)
                # Runs with a ServiceAccount reach the API on the URL the gateway serves on (127.0.0.1:
                # the local processes' host) and trust the local CA (ADR-0037).
                env.setdefault("NODUS_PUBLIC_CA", str(tls.ca))
                if s3 is not None:
                    # Blobs and Workspace files go into the agents' bucket, under _nodus/ (ADR-0036).
                    env["NODUS_STORE_BUCKET"] = AGENT_BUCKET
            if short == "billing":
                # Every local project starts with credits, as a trial account would (0 in production).
                env.setdefault("NODUS_STARTING_CREDITS_USD", "1000")
                env.setdefault("NODUS_METER_TICK_S", "5")
            if creds is not None:
                env["NODUS_NATS_NKEY_SEED"] = str(creds.seed(short))
            self.procs.append(Proc(short, [sys.executable, "-m", module], env, free_port()))
        store = self._agent_store(s3) if s3 is not None else {}
        for i, extra in enumerate(self.agents):
            name = extra.get("NODUS_AGENT_NODE", f"agent-{i}")
            env = {
                "NODUS_AGENT_WORKDIR": str(self._dir(f"agents/{name}")),
                "NODUS_AGENT_CWD": os.getcwd(),
                **store,
                **base,
                **extra,
            }
            if creds is not None:
                env["NODUS_NATS_NKEY_SEED"] = str(creds.seed(f"agent-{name}"))
            self.procs.append(Proc(name, [sys.executable, "-m", "nodus_agent"], env, free_port()))
        for p in self.procs:
            self._spawn(p)
        self._save(nats, s3)
        self._wait_ready(deadline_s)
        values = {
            "NODUS_URL": f"https://127.0.0.1:{gateway_port}",
            "NODUS_TOKEN": token,
            "NODUS_CA": str(tls.ca),
            "NODUS_NATS_URL": nats.url,
        }
        if creds is not None:
            # `nodus tail` and operators: read-only, everything but Secrets and tokens (docs/bus.md).
            values["NODUS_NATS_OPERATOR_SEED"] = str(creds.seed("operator"))
        if s3 is not None:
            values["NODUS_S3_ENDPOINT"] = s3.endpoint_url
        # Both hold the admin token: readable by their owner only.
        _write_private(self.root / "local.env", "".join(f"{k}={v}\n" for k, v in values.items()))
        _write_private(self.kubeconfig, kubeconfig(values["NODUS_URL"], token, tls.ca.read_bytes()))
        return values

    def _agent_store(self, s3: SeaweedS3) -> dict[str, str]:
        """The agents' checkpoint and output store: a bucket on the stack's SeaweedFS, its keys in an
        AWS-style credentials file (the agent's own configuration, as on a real host)."""
        import botocore.session

        client = botocore.session.get_session().create_client("s3", **s3.client_kwargs())
        try:
            client.create_bucket(Bucket=AGENT_BUCKET)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        except client.exceptions.BucketAlreadyExists:
            pass
        credentials = self.root / "s3-credentials"
        _write_private(
            credentials,
            f"[default]\naws_access_key_id = {s3.access_key}\naws_secret_access_key = {s3.secret_key}\n",
        )
        return {
            "NODUS_AGENT_S3_ENDPOINT": s3.endpoint_url,
            "NODUS_AGENT_S3_REGION": s3.region,
            "NODUS_AGENT_S3_BUCKET": AGENT_BUCKET,
            "NODUS_AGENT_S3_CREDENTIALS_FILE": str(credentials),
        }

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def _dir(self, name: str) -> Path:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _spawn(self, p: Proc) -> None:
        log = (self.root / "logs" / f"{p.name}.log").open("ab")
        env = {**p.env, "NODUS_HEALTH_PORT": str(p.health_port), "NODUS_REPLICA": p.name}
        proc = subprocess.Popen(p.argv, env=env, stdout=log, stderr=log, start_new_session=True)
        p.pid = proc.pid

    def _save(self, nats: NatsServer, s3: SeaweedS3 | None) -> None:
        assert nats.proc and (s3 is None or s3.proc)
        state = {
            "nats": {"pid": nats.proc.pid, "url": nats.url},
            "s3": None if s3 is None else {"pid": s3.proc.pid, "url": s3.endpoint_url},  # type: ignore[union-attr]
            "procs": [{"name": p.name, "pid": p.pid, "health": p.health_port} for p in self.procs],
        }
        self.state_file.write_text(json.dumps(state, indent=2))

    def _wait_ready(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        waiting = {p.name: p for p in self.procs}
        while waiting and time.monotonic() < end:
            for name, p in list(waiting.items()):
                if _ready(p.health_port, p.name):
                    del waiting[name]
                elif p.pid is not None and not _alive(p.pid):
                    raise RuntimeError(f"{name} exited at start; see {self.root / 'logs' / (name + '.log')}")
            time.sleep(0.1)
        if waiting:
            raise TimeoutError(
                f"not ready within {deadline_s}s: {', '.join(waiting)} (logs in {self.root}/logs)"
            )

    def stop(self, grace_s: float = 10.0) -> list[str]:
        """Stop what stack.json lists: services first (graceful SIGTERM), then the servers."""
        if not self.state_file.exists():
            return []
        state = json.loads(self.state_file.read_text())
        stopped = []
        # SeaweedFS never exits on SIGTERM (its filer and S3 keep running), so the servers get a short
        # grace: by then NATS has flushed (it syncs every write anyway) and the services are gone.
        groups = (
            ([p["pid"] for p in state["procs"]], grace_s),
            ([*([state["s3"]["pid"]] if state["s3"] else []), state["nats"]["pid"]], 1.5),
        )
        for group, grace in groups:
            for pid in group:
                _signal(pid, signal.SIGTERM)
            end = time.monotonic() + grace
            while any(_alive(pid) for pid in group) and time.monotonic() < end:
                time.sleep(0.05)
            for pid in group:
                if _alive(pid):
                    _signal(pid, signal.SIGKILL)
                stopped.append(str(pid))
        self.state_file.unlink()
        return stopped

    def status(self) -> list[tuple[str, str, str]]:
        if not self.state_file.exists():
            return []
        state = json.loads(self.state_file.read_text())
        rows = [("nats", str(state["nats"]["pid"]), "up" if _alive(state["nats"]["pid"]) else "DOWN")]
        if state["s3"]:
            rows.append(("s3", str(state["s3"]["pid"]), "up" if _alive(state["s3"]["pid"]) else "DOWN"))
        for p in state["procs"]:
            rows.append(
                (p["name"], str(p["pid"]), "ready" if _ready(p["health"], p["name"]) else "NOT READY")
            )
        return rows


def kubeconfig(url: str, token: str, ca_pem: bytes | None = None) -> str:
    """A kubeconfig for the gateway at ``url`` as ``admin``. kubectl sends the token only to an https
    ``url``; ``ca_pem`` is the CA it trusts for it (else the system's)."""
    # JSON strings are YAML strings: quoted, so that no token or URL is ever read as another YAML type.
    ca = f"    certificate-authority-data: {base64.b64encode(ca_pem).decode()}\n" if ca_pem else ""
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: nodus-local\n"
        f"clusters:\n- name: nodus-local\n  cluster:\n    server: {json.dumps(url)}\n{ca}"
        f"users:\n- name: admin\n  user:\n    token: {json.dumps(token)}\n"
        "contexts:\n- name: nodus-local\n  context:\n    cluster: nodus-local\n    user: admin\n"
        "    namespace: default\n"
    )


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _shell_path(path: Path) -> str:
    """``$PWD/...`` for a path under the current directory (as people paste it), else the path."""
    try:
        return f"$PWD/{path.resolve().relative_to(Path.cwd().resolve())}"
    except ValueError:
        return str(path)


def _ready(port: int, replica: str | None = None) -> bool:
    """The process on ``port`` is ready, and (given ``replica``) it is the one we started under that name:
    a port handed out twice, or held by a leftover of an earlier stack, must not pass for ours."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            if r.status != 200:
                return False
            if replica is None:
                return True
            return bool(json.loads(r.read() or b"{}").get("replica") == replica)
    except (OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by us) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def default_agents() -> list[dict[str, str]]:
    """The local capacity of ``make run``: H100 nodes in ``us``, an A100 in ``eu`` and an L4, each a node
    agent with a fake-GPU inventory running real processes."""
    return [
        agent("h100-us-1", "h100-sxm-80g-x1-us", "us", "H100-SXM-80G", "80Gi"),
        agent("h100-us-2", "h100-sxm-80g-x1-us", "us", "H100-SXM-80G", "80Gi"),
        agent("a100-eu-1", "a100-sxm-80g-x1-eu", "eu", "A100-SXM-80G", "80Gi"),
        agent("l4-us-1", "l4-x1-us", "us", "L4", "24Gi"),
    ]


def agent(node: str, offering: str, region: str, variant: str, memory: str, gpus: int = 1) -> dict[str, str]:
    return {
        "NODUS_AGENT_NODE": node,
        "NODUS_AGENT_OFFERING": offering,
        "NODUS_AGENT_REGION": region,
        "NODUS_AGENT_VARIANT": variant,
        "NODUS_AGENT_GPU_MEMORY": memory,
        "NODUS_AGENT_GPUS": str(gpus),
        # Always the fake inventory: on a GPU host every local agent would otherwise report the same devices.
        "NODUS_AGENT_FAKE_GPUS": "1",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localstack", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--root", default=".nodus", type=Path)
    parser.add_argument("--fresh", action="store_true", help="start from empty state (wipe the root first)")
    args = parser.parse_args(argv)
    stack = Stack(args.root.resolve(), agents=default_agents())
    if args.command == "down":
        stopped = stack.stop()
        print(f"stopped {len(stopped)} processes" if stopped else "no local stack is running")
        return 0
    if args.command == "status":
        rows = stack.status()
        print("\n".join(f"{n:<12} {pid:>8}  {s}" for n, pid, s in rows) or "no local stack is running")
        return 0
    if stack.state_file.exists():
        print(f"a local stack is already running ({stack.state_file}); `make down` first", file=sys.stderr)
        return 1
    if args.fresh and stack.root.exists():
        import shutil

        shutil.rmtree(stack.root)
    values = stack.start()
    print(f"local stack up: logs in {stack.root}/logs, settings in {stack.root}/local.env")
    for k, v in values.items():
        print(f"  {k}={v}" + ("  (the admin token)" if k == "NODUS_TOKEN" else ""))
    if stack.root.name == ".nodus":
        print("the nodus CLI reads local.env from here or any directory below; for kubectl:")
    else:  # the CLI looks for .nodus/local.env only
        print(f"for the nodus CLI: set -a; . {_shell_path(stack.root / 'local.env')}; set +a; for kubectl:")
    print(f"  export KUBECONFIG={_shell_path(stack.kubeconfig)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
