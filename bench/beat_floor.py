"""The floor under 1,000 idle nodes' liveness (issue #23, bench/idle_bench.py): the same beats, bare.

Each node beats once per period on ``nodus.beat.<node>`` (ADR-0042), at its own point of the period, on
the simulated fleet's schedule (the beats due within one of its ticks go out together) or, with a tick of
0, each alone, as from agents on their own hosts. Here nothing but a bare nats-server
(no account, no stream) and one bare nats-py subscription hear them: what is left once everything Nodus
does with a beat is taken away. ``publish`` plays the nodes (its CPU is not counted, as the fleet's is
not); ``hear`` is the subscriber.

    python -m bench.beat_floor publish URL NODES PERIOD_S TICK_S
    python -m bench.beat_floor hear URL
"""

from __future__ import annotations

import asyncio
import sys
import time

import msgspec
import nats

from nodus_agent.fleet import trickle
from nodus_schema.messages import NodeBeat, beat_subject


async def publish(url: str, nodes: int, period_s: float, tick_s: float) -> None:
    """Beat ``nodes`` nodes every ``period_s``, node ``i`` at ``i/N`` of it, until killed: the beats due
    within ``tick_s`` of each other go out together, as the simulated fleet sends them (its
    ``MIN_TICK_S``); 0 sends each alone, as agents on their own hosts do."""
    nc = await nats.connect(url)
    names = [f"floor-{i}" for i in range(nodes)]
    loop = asyncio.get_running_loop()
    cycle = loop.time()
    while True:
        async for due in trickle(nodes, cycle, period_s, tick_s):  # the fleet's own schedule
            for name in names[due]:
                body = msgspec.json.encode(NodeBeat(time_ms=int(time.time() * 1000), phase="Ready"))
                await nc.publish(beat_subject(name), body)
        cycle = max(cycle + period_s, loop.time())
        await asyncio.sleep(max(cycle - loop.time(), 0.0))


async def hear(url: str) -> None:
    """Hear every beat, and do nothing with it, until killed."""
    nc = await nats.connect(url)
    heard = 0

    async def count(_msg: object) -> None:
        nonlocal heard
        heard += 1

    await nc.subscribe(beat_subject("*"), cb=count)
    await asyncio.Event().wait()


if __name__ == "__main__":
    role, url = sys.argv[1], sys.argv[2]
    if role == "publish":
        asyncio.run(publish(url, int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])))
    elif role == "hear":
        asyncio.run(hear(url))
    else:
        raise SystemExit(__doc__)
