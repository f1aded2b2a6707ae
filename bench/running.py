"""Measuring and reporting: rates of an operation and of its baseline, and their ratio."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nodus_testing.natsserver import NatsServer


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


ROOT = Path(__file__).resolve().parent.parent


def spawn(
    args: list[str], env: dict[str, str], log: Path, *, profiled: bool = False
) -> subprocess.Popen[bytes]:
    """``python ARGS`` from the repository root, its output appended to ``log``, ``env`` over ours.

    ``profiled`` with ``NODUS_BENCH_PROFILE=<dir>`` runs it under cProfile, leaving ``<dir>/<log stem>.prof``
    when it stops (SIGTERM is a clean exit), for ``python -m pstats``; the rates printed are then not the
    bench's."""
    profile = os.environ.get("NODUS_BENCH_PROFILE")
    if profile and profiled:
        # Timed by CPU (bench/profiling.py): the processes share the cores, wall time would blame waits.
        args = ["-m", "bench.profiling", str(Path(profile).resolve() / f"{log.stem}.prof"), *args]
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )


AUTH_ENV = "NODUS_BENCH_AUTH"
"""``off`` runs a benchmark's bus without authentication (``python -m bench --no-auth``): only to
measure what authentication costs against the same run with it (docs/benchmarks.md); never the default."""


def bus_auth() -> bool:
    return os.environ.get(AUTH_ENV, "on") != "off"


def credential(server: NatsServer, user: str) -> dict[str, str]:
    """The environment that gives a service process ``user``'s own credential on the bench's server
    (``gateway``, ``scheduler``, ``fleet``, ...): the bus refuses anonymous clients (ADR-0026)."""
    if server.credentials is None:  # --no-auth: the comparison run
        return {"NODUS_NATS_ANONYMOUS": "true"}
    return {"NODUS_NATS_NKEY_SEED": str(server.credentials.seed(user))}


def cpu_seconds(pid: int | None) -> float:
    """User+system CPU time of a process so far, from /proc (Linux, as the benchmarks run on); 0 for None."""
    if pid is None:
        return 0.0
    # Fields after the ")" that ends the command name: utime and stime are the 12th and 13th.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def stored_messages(nc: Any) -> dict[str, int]:
    """Each bucket's and stream's last sequence: the messages it stored (and synced), compare-and-set
    writes the stream refused not counted. Two readings apart say what a measurement cost the bus."""
    from nodus_kit import declaring

    js = nc.jetstream()
    names = {b.name: f"KV_{b.name}" for b in declaring.BUCKETS} | {s.name: s.name for s in declaring.STREAMS}
    return {name: int((await js.stream_info(stream)).state.last_seq) for name, stream in names.items()}
