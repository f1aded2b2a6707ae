"""Measuring and reporting: rates of an operation and of its baseline, and their ratio."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    name: str
    baseline: str
    rate: float  # operations per second
    baseline_rate: float
    target: float | None = None  # the ratio an issue asks for

    @property
    def ratio(self) -> float:
        return self.rate / self.baseline_rate

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        return "meets" if self.ratio >= self.target else "BELOW"


async def rate(op: Callable[[int], Awaitable[object]], n: int) -> float:
    """Operations per second of ``op(i)`` for i in 0..n-1, one after another."""
    start = time.perf_counter()
    for i in range(n):
        await op(i)
    return n / (time.perf_counter() - start)


async def best_of(runs: int, measure: Callable[[], Awaitable[float]]) -> float:
    """The best of a few runs: the least disturbed by whatever else the machine was doing."""
    return max([await measure() for _ in range(runs)])


def render(results: list[Result]) -> str:
    rows = [
        "| measure | ops/s | baseline | baseline ops/s | ratio | target |",
        "|---|---:|---|---:|---:|---|",
    ]
    for r in results:
        target = f"≥ {r.target:.0%} ({r.verdict})" if r.target is not None else ""
        rows.append(
            f"| {r.name} | {r.rate:,.0f} | {r.baseline} | {r.baseline_rate:,.0f} | {r.ratio:.0%} | {target} |"
        )
    return "\n".join(rows)
