"""Nodus on a three-server NATS cluster with two replicas of every service, losing a server and every
controller's active replica along the way (issue #9).

Everything is a real process: three clustered nats-servers (R3 streams and buckets, ``sync_interval:
always``), two gateways, two sweep controllers, two schedulers, two billing replicas and two simulated
fleets of twelve L4 nodes each. A Sweep of 100 cells (``maxParallel`` 20, runs of about a second) goes
in through the first gateway. After 25 cells have finished, one NATS server is killed (SIGKILL); after
50, the replica holding each controller's lease is killed (SIGKILL), so the standby must take over within
a lease period (``NODUS_LEASE_TTL_S`` 3 here). The Sweep is then read through the second gateway.

Exactly once, exact costs, nothing lost, as seen from the outside:
* every cell Job was created once (a watch records every uid of every cell; none deleted), and has one
  Attempt, Succeeded, of its own uid: no cell ran twice;
* each cell's cost is its one run's charge worked out here from the Attempt's times (whole seconds,
  one at least, at the offering's rate), the Sweep's total is their sum to the micro-dollar, and the
  project's books fold to their balances with every hold captured;
* both report consumers (scheduler, billing) acknowledged every report and nothing was dead-lettered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS

from nodus_billing.accounting import fold
from nodus_billing.archiving import Archive
from nodus_billing.books import Books
from nodus_billing.standing import Hold, State
from nodus_kit import permitting
from nodus_kit.connecting import connect
from nodus_kit.leasing import Lease
from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import JOB_UID_LABEL, Attempt
from nodus_schema.jobs import Job
from nodus_schema.ledger import charge_micros
from nodus_schema.quantities import usd_to_micros
from nodus_schema.sweeps import SWEEP_LABEL
from nodus_testing.natscluster import NatsCluster
from nodus_testing.processes import free_port
from nodus_testing.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

NS = "rep"
SWEEP = "ha"
CELLS = 100
TOKEN = "replicas-admin-token-0123456789"
CONTROLLERS = (
    ("sweeps", "nodus_sweeps", "sweep-controller"),
    ("scheduler", "nodus_scheduler", "scheduler"),
    ("billing", "nodus_billing", "billing"),
)
LEASE_TTL_S = 3


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    health: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **self.env, "NODUS_HEALTH_PORT": str(self.health), "NODUS_REPLICA": self.name}
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def ready(self) -> bool:
        assert self.popen is not None
        if self.popen.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/readyz", timeout=1) as r:
                # Ours, not another process that holds a port handed out twice.
                return bool(r.status == 200 and json.loads(r.read()).get("replica") == self.name)
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@dataclass
class Creations:
    """Every uid each cell name was seen with (a cell created twice shows a second uid)."""

    uids: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    deleted: list[str] = field(default_factory=list)
    succeeded: set[str] = field(default_factory=set)

    async def follow(self, nc: NATS) -> None:
        """Watch for ever; a watch cut by the killed server is started again (it lists what it missed)."""
        jobs = ObjectStore(nc, "jobs", Job)
        while True:
            try:
                async with jobs.watch(NS) as w:
                    async for event in w:
                        meta = event.object.metadata
                        if meta.labels.get(SWEEP_LABEL) != SWEEP:
                            continue
                        if (meta.uid or "") not in self.uids[meta.name or ""]:
                            self.uids[meta.name or ""].append(meta.uid or "")
                        if event.type == "DELETED":
                            self.deleted.append(meta.name or "")
                        elif event.object.status.phase == "Succeeded":
                            self.succeeded.add(meta.name or "")
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
                await eventually(lambda: nc.is_connected, deadline_s=60, message="the observer lost the bus")


def _stack(cluster: NatsCluster, logs: Path, creds: permitting.Generated) -> tuple[list[Proc], list[int]]:
    base = {
        "NODUS_NATS_URL": cluster.url,
        "NODUS_STREAM_REPLICAS": "3",
        "NODUS_LEASE_TTL_S": str(LEASE_TTL_S),
        "NODUS_RESYNC_S": "5",
        "NODUS_ADMIN_TOKEN": TOKEN,
        "PYTHONUNBUFFERED": "1",
    }
    billing = {"NODUS_STARTING_CREDITS_USD": "100", "NODUS_METER_TICK_S": "1"}
    procs: list[Proc] = []
    for short, module, _ in CONTROLLERS:
        for r in ("a", "b"):
            env = {**base, **(billing if short == "billing" else {}), **_seed(creds, short)}
            procs.append(Proc(f"{short}-{r}", [sys.executable, "-m", module], env, logs / f"{short}-{r}.log"))
    ports = [free_port(), free_port()]
    for r, port in zip(("a", "b"), ports, strict=True):
        env = {**base, "NODUS_GATEWAY_PORT": str(port), **_seed(creds, "gateway")}
        procs.append(
            Proc(f"gateway-{r}", [sys.executable, "-m", "nodus_gateway"], env, logs / f"gateway-{r}.log")
        )
    for f in ("fa", "fb"):
        argv = [
            sys.executable,
            "-m",
            "nodus_agent.simulating",
            "--fleet",
            f,
            "--nodes",
            "12",
            "--offerings",
            "l4-x1-us",
            "--progress-s",
            "0",
            "--heartbeat-s",
            "2",
            "--workdir",
            str(logs / f"fleet-{f}"),
        ]
        procs.append(Proc(f"fleet-{f}", argv, {**base, **_seed(creds, "fleet")}, logs / f"fleet-{f}.log"))
    return procs, ports


def _seed(creds: permitting.Generated, user: str) -> dict[str, str]:
    """Each process on its own credential, as in production (deploy/nats/, ADR-0026)."""
    return {"NODUS_NATS_NKEY_SEED": str(creds.seed(user))}


SWEEP_BODY: dict[str, Any] = {
    "apiVersion": "nodus.dev/v1",
    "kind": "Sweep",
    "metadata": {"name": SWEEP},
    "spec": {
        "maxParallel": 20,
        "matrix": {"params": {"A": [str(i) for i in range(10)], "B": [str(i) for i in range(10)]}},
        "template": {
            "spec": {
                "image": "busybox",
                "command": ["true"],
                "resources": {"gpu": "L4:1"},
                "env": [
                    {"name": "NODUS_SIM_SECONDS", "value": "1"},
                    {"name": "NODUS_SIM_SIGMA", "value": "0.3"},
                ],
            }
        },
    },
}


@contextlib.contextmanager
def _running(procs: list[Proc]) -> Iterator[None]:
    try:
        for p in procs:
            p.start()
        yield
    finally:
        for p in procs:
            p.stop()


def _expected_micros(a: Attempt) -> int:
    """A run's charge, worked out here from its times (docs/billing.md, Segments): from the node's start to
    its stop in milliseconds, rounded up to whole seconds once, one at least."""
    st = a.status
    assert st.billing_start_ms is not None and st.billing_stop_ms is not None, "the node reports its times"
    seconds = max(1, -(-(st.billing_stop_ms - st.billing_start_ms) // 1000))
    return charge_micros(a.spec.rate_micros_per_hour, seconds * 1000)


async def _holder(nc: NATS, lease: str) -> str:
    async def held() -> str | None:
        try:
            return await Lease(nc, lease, "observer").current_holder()
        except (nats.errors.Error, nats.js.errors.Error) as e:
            raise AssertionError(f"not yet: {e!r}") from e

    holder = await eventually(held, deadline_s=30, message=f"nobody holds the {lease} lease")
    assert holder is not None
    return holder


async def test_a_100_cell_sweep_survives_a_lost_server_and_every_active_controller(tmp_path: Path) -> None:
    creds = permitting.generate(tmp_path / "credentials")
    with NatsCluster(3, tmp_path / "nats", extra_config=creds.accounts.read_text()) as cluster:
        # The admin declares every stream and bucket at R3 first; the services only wait for them.
        await permitting.declare(cluster.url, creds.seed("admin"), replicas=3)
        logs = tmp_path / "logs"
        logs.mkdir()
        procs, (port_a, port_b) = _stack(cluster, logs, creds)
        by_name = {p.name: p for p in procs}
        with _running(procs):
            try:
                await _run(cluster, by_name, port_a, port_b, creds)
            except BaseException:
                for p in procs:
                    print(f"--- {p.name}\n{p.tail()}")
                    # Billing's word on a cell it made final at $0 (metering._warn_free), wherever it is.
                    text = p.log.read_text(errors="replace") if p.log.exists() else ""
                    print("".join(line for line in text.splitlines(True) if "final cost of a Job" in line))
                raise
        refused = [
            p.name for p in procs if "permissions violation" in p.log.read_text(errors="replace").lower()
        ]
        assert refused == [], f"a credential lacked a right it used: see the logs of {refused}"


async def _run(
    cluster: NatsCluster, procs: dict[str, Proc], port_a: int, port_b: int, creds: permitting.Generated
) -> None:
    await eventually(
        lambda: all(p.ready() for p in procs.values()),
        deadline_s=90,
        interval_s=0.2,
        message="not every replica became ready",
    )
    # The test looks on as an operator would (`nodus tail`'s credential: reads everything, writes nothing).
    nc = await connect(cluster.url, "replicas-test", nkey_seed=str(creds.seed("operator")))
    creations = Creations()
    watching = asyncio.create_task(creations.follow(nc))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    base = f"/apis/nodus.dev/v1/namespaces/{NS}"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port_a}", headers=headers, timeout=10) as a:
            created = await a.post(f"{base}/sweeps", json=SWEEP_BODY)
            assert created.status_code == 201, created.text

        await eventually(lambda: len(creations.succeeded) >= 25, deadline_s=90, message="25 cells")
        # A server every client may be connected to dies; its streams' leaders move to the other two.
        cluster.kill(cluster.members[0])

        await eventually(lambda: len(creations.succeeded) >= 50, deadline_s=120, message="50 cells")
        killed = []
        for short, _, lease in CONTROLLERS:
            holder = await _holder(nc, lease)
            assert holder in procs and holder.startswith(short), f"{lease} held by {holder}"
            procs[holder].kill()
            killed.append(holder)
        killed_at = asyncio.get_running_loop().time()
        # The standbys take over within a lease period: the dead leader's lease expires a TTL after its
        # last renewal (at most a third of a TTL before the kill), and a standby looks every quarter of
        # a TTL; the rest of the bound is the server's one-second TTL granularity and a loaded machine.
        for (_, _, lease), dead in zip(CONTROLLERS, killed, strict=True):

            async def taken(lease: str = lease, dead: str = dead) -> str:
                holder = await _holder(nc, lease)
                assert holder != dead, f"{lease} still held by the killed {dead}"
                return holder

            await eventually(
                taken, deadline_s=LEASE_TTL_S * 3, interval_s=0.05, message=f"{lease} not taken over"
            )
            took = asyncio.get_running_loop().time() - killed_at
            print(f"{lease}: the standby leads {took:.1f} s after the leader was killed")
            assert took <= LEASE_TTL_S + 2, f"{lease} failed over in {took:.1f} s, more than a lease period"

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port_b}", headers=headers, timeout=10) as b:

            async def finished() -> dict[str, Any]:
                resp = await b.get(f"{base}/sweeps/{SWEEP}")
                assert resp.status_code == 200, resp.text
                st = resp.json().get("status", {})
                assert st.get("phase") == "Succeeded", (st.get("phase"), st.get("message"))
                assert (st.get("cost") or {}).get("final"), "the cells' costs are not all final yet"
                return dict(st)

            status = await eventually(
                finished, deadline_s=180, interval_s=0.5, message="the Sweep never finished"
            )

        # The standbys still lead: nobody handed a lease back to a dead replica.
        for (_, _, lease), dead in zip(CONTROLLERS, killed, strict=True):
            assert await _holder(nc, lease) != dead, f"{lease} still names the killed {dead}"
        await _exactly_once(nc, creations, status)
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        await nc.close()


async def _exactly_once(nc: NATS, creations: Creations, status: dict[str, Any]) -> None:
    assert creations.deleted == []
    assert {n: u for n, u in creations.uids.items() if len(u) != 1} == {}, "a cell created more than once"
    assert sorted(creations.uids) == sorted(f"{SWEEP}-{i}" for i in range(CELLS))
    jobs = {j.metadata.name: j for j in (await ObjectStore(nc, "jobs", Job).list(NS)).items}
    attempts = (await ObjectStore(nc, "attempts", Attempt).list(NS)).items
    assert Counter(a.spec.job for a in attempts) == Counter({f"{SWEEP}-{i}": 1 for i in range(CELLS)}), (
        "a cell ran more (or less) than once"
    )
    state = await Books(nc).read(NS)
    runs = await Archive(nc).runs(NS, state)  # filed out of the book once final (issue #23)
    total = 0
    for a in attempts:
        job = jobs[a.spec.job]
        assert a.status.phase == "Succeeded" and a.metadata.labels.get(JOB_UID_LABEL) == job.metadata.uid
        assert job.status.cost is not None and job.status.cost.final
        charged = usd_to_micros(job.status.cost.total_usd or "0")
        assert charged == _expected_micros(a), (
            f"{a.spec.job} charged {charged}, ran {_expected_micros(a)}: {_book_of(state, runs, a)}"
        )
        total += charged
    assert usd_to_micros(status["cost"]["totalUSD"]) == total
    assert [c["index"] for c in status["cells"]] == list(range(CELLS))
    assert all(c["phase"] == "Succeeded" for c in status["cells"])

    assert fold(state.ledger.values()) == state.balances and sum(state.balances.values()) == 0
    assert len(runs) == CELLS and all(h.status == "Captured" for h in runs.values())

    js = nc.jetstream()
    last = (await js.stream_info("NODUS_REPORTS")).state.last_seq
    for durable in ("scheduler", "billing"):
        # Reports a killed replica had fetched and not acknowledged come back to the standby after the
        # consumer's ack wait (30 s); then every report is acknowledged.
        async def acknowledged(durable: str = durable) -> bool:
            info = await js.consumer_info("NODUS_REPORTS", durable)
            assert info.ack_floor.stream_seq == last, (
                f"{durable} acknowledged up to {info.ack_floor}, not {last}"
            )
            return True

        await eventually(
            acknowledged, deadline_s=60, interval_s=0.5, message=f"{durable} left reports behind"
        )
    assert (await js.stream_info("NODUS_DEAD")).state.messages == 0, "something was dead-lettered"
    # What the redelivered reports did changed nothing: the costs are still the runs' charges.
    again = await Books(nc).read(NS)
    assert again.balances == state.balances, "a redelivered report moved money"


def _book_of(state: State, runs: dict[str, Hold], a: Attempt) -> str:
    """What the book and the history say of a run: for a failure's message (a cell charged $0 in 2 of 48
    local runs of this test, 2026-12-04/05)."""
    hold = a.metadata.name or ""
    ops = sorted(k for k in state.results if hold in k)
    entries = sorted(k for k in state.ledger if hold in k)
    return f"in the book {state.holds.get(hold)}; filed {runs.get(hold)}; operations {ops}; entries {entries}"
