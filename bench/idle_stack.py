"""The idle cost of a stack that holds many finished Jobs (issue #19): CPU of every process over 30 s.

Run against a stack from ``make up`` (it reads ``.nodus/local.env`` and ``.nodus/stack.json``):
``python -m bench.idle_stack 3000`` creates that many Jobs suspended, cancels them, waits until billing has
written every final cost, lets the stack settle for 45 s, then prints each process's share of one core
over the next 30 s. ``python -m bench.idle_stack 3000 suspended`` leaves them Suspended instead (and waits
until the scheduler has written each one's Suspended phase and billing its cost). Not part of
``make bench``: it needs a stack of its own (``localstack up --fresh``).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from nodus_testing.waiting import eventually

BASE = "/apis/nodus.dev/v1/namespaces/idle/jobs"
SETTLE_S = 45
WINDOW_S = 30


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _job(i: int) -> dict[str, Any]:
    spec = {
        "image": "busybox",
        "command": ["sleep", "3600"],
        "resources": {"gpu": "L4:1"},
        "state": "Suspended",
    }
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": f"j{i}"}, "spec": spec}


def _final(job: dict[str, Any]) -> bool:
    return bool((job.get("status", {}).get("cost") or {}).get("final"))


def _suspended(job: dict[str, Any]) -> bool:
    """Held Suspended by the scheduler, and its cost (nothing held) written by billing."""
    status = job.get("status", {})
    return status.get("phase") == "Suspended" and status.get("cost") is not None


async def _count(http: httpx.AsyncClient, done: Any) -> int:
    n, cont = 0, None
    while True:
        page = (await http.get(BASE, params={"limit": 500, **({"continue": cont} if cont else {})})).json()
        n += sum(1 for j in page["items"] if done(j))
        cont = page["metadata"].get("continue")
        if not cont:
            return n


def _stack() -> tuple[dict[str, str], dict[str, int]]:
    """The local stack's variables and the pid of every process (services, agents, nats-server)."""
    text = Path(".nodus/local.env").read_text()
    env = dict(line.strip().split("=", 1) for line in text.splitlines() if "=" in line)
    state = json.loads(Path(".nodus/stack.json").read_text())
    pids = {p["name"]: p["pid"] for p in state["procs"]} | {"nats": state["nats"]["pid"]}
    return env, pids


async def main(n: int, suspended: bool) -> None:
    env, pids = _stack()
    headers = {"Authorization": f"Bearer {env['NODUS_TOKEN']}"}
    verify = ssl.create_default_context(cafile=env["NODUS_CA"])
    async with httpx.AsyncClient(
        base_url=env["NODUS_URL"], verify=verify, timeout=60, headers=headers
    ) as http:
        gate = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with gate:
                assert (await http.post(BASE, json=_job(i))).status_code in (201, 409)
                if suspended:
                    return
                cancel = {"spec": {"state": "Cancelled"}}
                merge = {"Content-Type": "application/merge-patch+json"}
                assert (await http.patch(f"{BASE}/j{i}", json=cancel, headers=merge)).status_code == 200

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        what = "created" if suspended else "created and cancelled"
        print(f"{what} {n} Jobs in {time.perf_counter() - start:.0f} s", flush=True)
        done = _suspended if suspended else _final

        async def all_done() -> bool:
            return await _count(http, done) >= n

        await eventually(all_done, deadline_s=600, interval_s=2, message="every Job's status written")
    # Both waits are the measurement itself: the stack left alone, then its CPU over a window.
    await asyncio.sleep(SETTLE_S)
    before = {k: _cpu_s(p) for k, p in pids.items()}
    await asyncio.sleep(WINDOW_S)
    used = {k: (_cpu_s(p) - before[k]) / WINDOW_S * 100 for k, p in pids.items()}
    print(
        ", ".join(f"{k} {v:.0f}%" for k, v in used.items()), f"(total {sum(used.values()):.0f}% of one core)"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, "suspended" in sys.argv[2:]))
