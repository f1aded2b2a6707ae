"""The money simulator (issue #18, ``nodus_billing.simulating``): seeds of random workloads over billing's
real core, every invariant checked after every operation, in steps (operations applied and checked) per
second.

``-n`` is the number of seeds of :data:`STEPS` operations each (``make bench``: 2,000 seeds), and a
hundredth as many seeds of :data:`LONG_STEPS` (books of hundreds of runs, where every check reads more).
The baseline is ``holding.apply`` alone on the very operations the simulator applied, on fresh books: no
workload to decide, no checks. The ratio is what deciding and checking every operation costs.
"""

from __future__ import annotations

import time
from typing import Final

from bench.running import Result
from nodus_billing.holding import Op, apply
from nodus_billing.simulating import simulate
from nodus_billing.standing import State

STEPS: Final = 200
LONG_STEPS: Final = 2_000


async def run(n: int) -> list[Result]:
    return [_measure(range(n), STEPS), _measure(range(10_000, 10_000 + max(1, n // 100)), LONG_STEPS)]


def _measure(seeds: range, steps: int) -> Result:
    ops: list[list[tuple[str, Op]]] = []
    start = time.perf_counter()
    for seed in seeds:
        ops.append(simulate(seed, steps, keep_ops=True).ops)
    simulated = time.perf_counter() - start
    start = time.perf_counter()
    for run_ops in ops:
        books: dict[str, State] = {}
        for project, op in run_ops:
            books[project], _, _ = apply(books.get(project) or State(), op)
    applied = time.perf_counter() - start
    total = sum(len(o) for o in ops)
    return Result(
        f"money simulator, {len(seeds):,} seeds of {steps:,} steps (steps/s)",
        "holding.apply alone, the same operations",
        total / simulated,
        total / applied,
    )
