"""The async SDK: estimate a small Sweep (the dry run), create it bound to that estimate, and follow it
and its cell Jobs at once with two watches, until the Sweep finishes.

Against the local stack (`make up`):

    .venv/bin/python examples/sdk_async.py

It creates `sdk-async-<random>` in the default project (NODUS_PROJECT sets another) and deletes it, with
its cells, at the end.
"""

from __future__ import annotations

import asyncio
import secrets
import sys

from nodus_schema import SWEEP_LABEL, Sweep
from nodus_sdk import AsyncClient, NodusError, finished, load_objects

SWEEP = """\
apiVersion: nodus.dev/v1
kind: Sweep
metadata:
  name: {name}
spec:
  maxParallel: 2
  matrix:
    gpu: ["L4:1", "A100:1"]
    params:
      BLOCK_KB: ["64"]
      TOTAL_MB: ["64"]
  template:
    kind: Job
    spec:
      image: python:3.11-slim
      command: ["python3", "examples/workload.py"]
      expectedDuration: 1m
      backoffLimit: 0
      timeout: 5m
"""


async def follow_cells(nodus: AsyncClient, sweep: str) -> None:
    """Every cell Job's phase changes, as they happen (the cells carry the nodus.dev/sweep label)."""
    async with nodus.jobs.watch(label_selector=f"{SWEEP_LABEL}={sweep}", timeout=600) as events:
        async for event in events:
            job = event.object
            print(f"  job {job.metadata.name}: {event.type.lower()} {job.status.phase or ''}", flush=True)


async def main() -> int:
    name = f"sdk-async-{secrets.token_hex(3)}"
    (sweep,) = load_objects(SWEEP.format(name=name))
    assert isinstance(sweep, Sweep)
    async with AsyncClient() as nodus:
        estimated = await nodus.sweeps.estimate(sweep)
        estimate = estimated.object.status.estimate
        if estimate is not None:
            cost = estimate.cost_usd
            print(f"estimate: rate ${estimate.rate_usd_per_hour}/h, cost p50 ${cost.p50 if cost else '?'}")
            for blocking in estimate.blocking_reasons:
                print(f"blocked: {blocking.code}: {blocking.message}\nfix: {blocking.fix}")
                return 1
        await nodus.sweeps.create(sweep, if_match=estimated.etag)  # 412 if the prices moved meanwhile
        print(f"created sweep {name}")
        cells = asyncio.create_task(follow_cells(nodus, name))
        try:
            done = await nodus.sweeps.wait_for(name, finished, timeout=600)
            results = await nodus.results(done)
            print(f"sweep {name}: {done.status.phase}, total ${results.total_usd}, best {results.best}")
            return 0 if done.status.phase == "Succeeded" else 1
        finally:
            cells.cancel()
            await nodus.sweeps.delete(name, propagation_policy="Foreground")


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except NodusError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
