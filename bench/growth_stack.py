"""The growth benchmark's stack: nats-server, the four control-plane processes, and N seeded Jobs.

The services run as they do in production (``python -m nodus_gateway`` and the rest), each on its own nkey
credential (bench/running.py ``credential``); the gateway serves plain HTTP. The Jobs are written straight
into the store with the kit's ``ObjectStore.create`` (256 in flight: group commit, ADR-0034), as the
gateway would write them and with the status the scheduler and billing write for a Suspended Job: a
template Job is created first, the running controllers write its status, and every seeded Job is a copy
of it under its own name. So nothing runs, and at their start the controllers find every Job settled but
for billing's one look at each (its rest rule, ``nodus_billing.metering``).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Final

import msgspec

from bench.running import cpu_seconds, credential, spawn
from nodus_kit.storing import ObjectStore
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Job, JobSpec, Resources
from nodus_schema.meta import ObjectMeta
from nodus_testing.natsserver import NatsServer
from nodus_testing.processes import free_port, stop

SERVICES: Final = (
    ("gateway", "nodus_gateway"),
    ("scheduler", "nodus_scheduler"),
    ("sweeps", "nodus_sweeps"),
    ("billing", "nodus_billing"),
)
CONTROLLERS: Final = ("scheduler", "sweeps", "billing")
TOKEN: Final = "growth-bench-admin-token-0123456789abcdef"
IN_FLIGHT: Final = 256
IDLE_CPU: Final = 0.08
"""A stack is idle when its processes together used less than this share of one core over a window."""
IDLE_WINDOW_S: Final = 2.0


@dataclass(frozen=True)
class Layout:
    """Where the Jobs live: one namespace, or spread evenly over ``namespaces``."""

    name: str
    namespaces: int

    def namespace(self, i: int) -> str:
        return "g" if self.namespaces == 1 else f"g{i % self.namespaces:02d}"

    @property
    def first(self) -> str:
        """The namespace the per-namespace measures read (each holds N / namespaces Jobs)."""
        return self.namespace(0)


def job_name(i: int) -> str:
    return f"j{i:06d}"


def template_job() -> Job:
    spec = JobSpec(
        image="busybox", command=["sleep", "3600"], resources=Resources(gpu="L4:1"), state="Suspended"
    )
    return default_job(Job(metadata=ObjectMeta(name="template", namespace="tpl"), spec=spec))


@dataclass
class Services:
    """The four processes of one start: their pids, the gateway's URL and health ports."""

    procs: dict[str, Popen[bytes]] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=dict)
    gateway_url: str = ""

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.procs.values())

    def rss(self, name: str) -> int:
        """Resident bytes of one process now (VmRSS)."""
        for line in Path(f"/proc/{self.pid(name)}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0


def start_services(server: NatsServer, tmp: Path, label: str) -> Services:
    out = Services()
    port = free_port()
    out.gateway_url = f"http://127.0.0.1:{port}"
    base = {"NODUS_NATS_URL": server.url, "NODUS_LOG_LEVEL": "WARNING", "NODUS_ADMIN_TOKEN": TOKEN}
    for short, module in SERVICES:
        health = free_port()
        env = {**base, **credential(server, short), "NODUS_HEALTH_PORT": str(health), "NODUS_REPLICA": short}
        if short == "gateway":
            env["NODUS_GATEWAY_PORT"] = str(port)
        out.procs[short] = spawn(["-m", module], env, tmp / f"{short}-{label}.log", profiled=True)
        out.health[short] = health
    _wait_ready(out, tmp, label)
    return out


def _wait_ready(services: Services, tmp: Path, label: str, deadline_s: float = 120.0) -> None:
    end = time.monotonic() + deadline_s
    waiting = dict(services.health)
    while waiting:
        for name, port in list(waiting.items()):
            if _ready(port, name):
                del waiting[name]
            elif services.procs[name].poll() is not None:
                log = (tmp / f"{name}-{label}.log").read_text()[-3000:]
                raise RuntimeError(f"{name} exited at start:\n{log}")
        if time.monotonic() > end:
            raise TimeoutError(f"not ready in {deadline_s:.0f} s: {', '.join(waiting)} (logs in {tmp})")
        time.sleep(0.1)  # polling readiness against a deadline, not synchronisation


def _ready(port: int, replica: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return bool(r.status == 200 and json.loads(r.read() or b"{}").get("replica") == replica)
    except (OSError, ValueError):
        return False


def stop_services(services: Services) -> None:
    for proc in services.procs.values():
        stop(proc, grace_s=10)


async def wait_idle(services: Services, deadline_s: float = 900.0) -> float:
    """Seconds until the processes are idle (see IDLE_CPU): the controllers have listed the store and
    looked at whatever their start queued. Polls CPU against a deadline; it is the measure itself."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        before = services.cpu()
        await asyncio.sleep(IDLE_WINDOW_S)
        if (services.cpu() - before) / IDLE_WINDOW_S < IDLE_CPU:
            return time.monotonic() - start - IDLE_WINDOW_S
    raise TimeoutError(f"the stack was not idle after {deadline_s:.0f} s")


async def settled_template(jobs: ObjectStore[Job], deadline_s: float = 60.0) -> Job:
    """The template Job once the scheduler wrote its Suspended phase and billing its cost."""
    await jobs.create(template_job())
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        job = await jobs.get("tpl", "template")
        if job.status.phase == "Suspended" and job.status.cost is not None:
            return job
        await asyncio.sleep(0.1)  # polling the controllers' writes against a deadline
    raise TimeoutError("the controllers did not write the template Job's status")


async def seed(jobs: ObjectStore[Job], template: Job, layout: Layout, start: int, end: int) -> float:
    """Jobs ``start`` .. ``end - 1`` of the layout, as copies of the template; seconds it took."""
    gate = asyncio.Semaphore(IN_FLIGHT)
    meta = template.metadata

    async def one(i: int) -> None:
        copy = msgspec.structs.replace(
            meta,
            name=job_name(i),
            namespace=layout.namespace(i),
            uid=None,
            creation_timestamp=None,
            resource_version=None,
        )
        async with gate:
            await jobs.create(msgspec.structs.replace(template, metadata=copy))

    began = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(start, end)))
    return time.perf_counter() - began


def headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def jobs_path(namespace: str | None) -> str:
    if namespace is None:
        return "/apis/nodus.dev/v1/jobs"
    return f"/apis/nodus.dev/v1/namespaces/{namespace}/jobs"


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text()[-chars:] if path.exists() else ""
