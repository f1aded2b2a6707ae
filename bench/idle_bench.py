"""What an idle stack costs (issue #23): CPU of every process while nothing runs, then with 1,000 idle nodes.

The stack is ``make up``'s (:class:`nodus_testing.localstack.Stack` with its four default agents) in a
temporary root: nats-server, SeaweedFS, the four control-plane services and four node agents, each its own
process on its own credential. Once every process is ready and the start's own work has settled, the
CPU time of each (user + system, from /proc) is read over a window of 60 s. Then a simulated fleet of
1,000 nodes (``nodus-sim-fleet``, docs/simulation.md) joins, and once every one of its nodes is Ready and
the registrations have settled, the control plane's CPU (every process of the stack, the fleet's own
excluded) is read over another window. Last, the floor under those nodes: their beats, as often, heard by
a bare nats-py subscription through a bare nats-server (bench/beat_floor.py), over a third window; the
last row sets what the nodes add to the control plane (the second window less the first) against it.

Ratios are the budget over the measure: 100% is exactly the budget, above it is better. Budgets: the stack
idle under 1% of one core in total (nats-server, the services and the agents; SeaweedFS, the agents'
object store, is shown apart), the control plane with 1,000 idle nodes under 5%. ``-n`` is ignored;
``NODUS_BENCH_IDLE_S`` shortens the windows for a quick look (the recorded rows use 60 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.running import Result, cpu_seconds, spawn
from nodus_agent.fleet import MIN_TICK_S
from nodus_testing.localstack import Stack, default_agents
from nodus_testing.natsserver import NatsServer
from nodus_testing.waiting import eventually

WINDOW_S = float(os.environ.get("NODUS_BENCH_IDLE_S", "60"))
SETTLE_S = 20.0
"""After the start (informers listing, first resyncs, registrations) and before a window opens."""
FLEET_NODES = 1000
FLEET_HEARTBEAT_S = 5.0  # the fleet's default, said here so that the floor below beats as often
STACK_BUDGET = 0.01
FLEET_BUDGET = 0.05
OBJECT_STORE = "s3"  # SeaweedFS: shown, but not one of the processes the budget counts


def _pids(stack: Stack) -> dict[str, int]:
    """Every process of the stack by name: nats, s3, the services and the agents."""
    state = json.loads(stack.state_file.read_text())
    pids = {"nats": int(state["nats"]["pid"])}
    if state["s3"]:
        pids[OBJECT_STORE] = int(state["s3"]["pid"])
    return pids | {p["name"]: int(p["pid"]) for p in state["procs"]}


async def _shares(pids: dict[str, int]) -> dict[str, float]:
    """Each process's share of one core over the window."""
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    start = time.monotonic()
    await asyncio.sleep(WINDOW_S)  # the window itself: the stack is left alone while it runs
    elapsed = time.monotonic() - start
    return {k: (cpu_seconds(p) - before[k]) / elapsed for k, p in pids.items()}


def _text(shares: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]))


def _result(what: str, shares: dict[str, float], budget: float) -> Result:
    counted = {k: v for k, v in shares.items() if k != OBJECT_STORE}
    total = sum(counted.values())
    print(f"{what}: {total:.2%} of one core ({_text(shares)})", flush=True)
    return Result(
        f"{what}: {total:.2%} of one core ({_text(counted)}), as 1/share",
        f"budget {budget:.0%} of one core, as 1/share",
        1 / max(total, 1e-6),
        1 / budget,
        target=1.0,
    )


async def _all_ready(values: dict[str, str], fleet: str) -> None:
    headers = {"Authorization": f"Bearer {values['NODUS_TOKEN']}"}
    verify = ssl.create_default_context(cafile=values["NODUS_CA"])
    async with httpx.AsyncClient(base_url=values["NODUS_URL"], verify=verify, headers=headers) as http:

        async def ready() -> bool:
            params = {"labelSelector": f"nodus.dev/simulated={fleet}"}
            items = (await http.get("/apis/nodus.dev/v1/nodes", params=params)).json().get("items", [])
            return sum(1 for n in items if n["status"].get("phase") == "Ready") >= FLEET_NODES

        await eventually(ready, deadline_s=120, interval_s=2, message=f"{FLEET_NODES} nodes Ready")


def _fleet(stack: Stack, values: dict[str, str], tmp: Path) -> subprocess.Popen[bytes]:
    seed = stack.root / "nats-credentials" / "fleet.nk"
    env = {
        "NODUS_NATS_URL": values["NODUS_NATS_URL"],
        "NODUS_NATS_NKEY_SEED": str(seed),
        "NODUS_LOG_LEVEL": "WARNING",
        "NODUS_REPLICA": "idle-fleet",
    }
    argv = ["-m", "nodus_agent.simulating", "--fleet", "idle", "--nodes", str(FLEET_NODES)]
    argv += ["--offerings", "l4-x1-us,h100-sxm-80g-x1-us", "--workdir", str(tmp / "fleet")]
    argv += ["--heartbeat-s", str(FLEET_HEARTBEAT_S)]
    return spawn(argv, env, tmp / "fleet.log")


async def run(n: int) -> list[Result]:
    del n  # the windows are the issue's, not the command line's
    with tempfile.TemporaryDirectory(prefix="nodus-idle-") as tmp_dir:
        tmp = Path(tmp_dir)
        stack = Stack(tmp / "stack", agents=default_agents())
        try:
            values = await asyncio.to_thread(stack.start)
            pids = _pids(stack)
            await asyncio.sleep(SETTLE_S)
            results = [_result("idle stack, 4 agents", await _shares(pids), STACK_BUDGET)]
            fleet = _fleet(stack, values, tmp)
            try:
                await _all_ready(values, "idle")
                await asyncio.sleep(SETTLE_S)
                shares = await _shares(pids | {"fleet": fleet.pid})
                print(f"the fleet's own process: {shares.pop('fleet'):.2%} of one core (not counted)")
                results.append(_result(f"control plane, {FLEET_NODES:,} idle nodes", shares, FLEET_BUDGET))
            finally:
                fleet.send_signal(signal.SIGTERM)
                await asyncio.to_thread(fleet.wait, 30)
        finally:
            await asyncio.to_thread(stack.stop)
        floor = await _beats_floor(tmp)
    return [*results, _floor_result(results, floor)]


async def _beats_floor(tmp: Path) -> dict[str, float]:
    """The same nodes' beats heard by a bare nats-py subscription through a bare nats-server (no account,
    no stream; bench/beat_floor.py), over the same window: each one's share of one core."""
    server = NatsServer(auth=False).start()
    assert server.proc is not None
    try:
        hear = spawn(["-m", "bench.beat_floor", "hear", server.url], {}, tmp / "floor-hear.log")
        argv = ["-m", "bench.beat_floor", "publish", server.url, str(FLEET_NODES), str(FLEET_HEARTBEAT_S)]
        argv.append(str(MIN_TICK_S))  # the fleet's schedule: what it sends together, sent together
        nodes = spawn(argv, {}, tmp / "floor-publish.log")
        try:
            await asyncio.sleep(SETTLE_S)  # every node has beaten at least once; the subscriber is warm
            shares = await _shares({"nats": server.proc.pid, "subscriber": hear.pid})
        finally:
            for proc in (nodes, hear):
                proc.kill()
                await asyncio.to_thread(proc.wait, 30)
    finally:
        server.close()
    print(f"the same beats, bare: {sum(shares.values()):.2%} of one core ({_text(shares)})", flush=True)
    return shares


def _floor_result(results: list[Result], floor: dict[str, float]) -> Result:
    """What the nodes cost the control plane (with them, less idle) against what their beats cost bare."""
    idle, nodes = (1 / r.rate for r in results)
    added, bare = nodes - idle, sum(floor.values())
    return Result(
        f"what {FLEET_NODES:,} idle nodes add to the control plane: {added:.2%} of one core, as 1/share",
        f"their beats alone, bare: {bare:.2%} ({_text(floor)}), as 1/share",
        1 / max(added, 1e-6),
        1 / max(bare, 1e-6),
    )
