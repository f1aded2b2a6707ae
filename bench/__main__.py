"""``python -m bench [name ...]``: run benchmarks, print their ratios, record them in docs/benchmarks.md."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from pathlib import Path

from bench import (
    billing_bench,
    checkpoint_bench,
    gateway_bench,
    growth_bench,
    idle_bench,
    placing_bench,
    scheduler_bench,
    simulator_bench,
    store_bench,
    sweeps_bench,
    usercreate_bench,
    volume_bench,
)
from bench.running import AUTH_ENV, Result, render

BENCHMARKS = {
    "store": store_bench.run,
    "gateway": gateway_bench.run,
    "usercreate": usercreate_bench.run,
    "placing": placing_bench.run,
    "scheduler": scheduler_bench.run,
    "checkpoint": checkpoint_bench.run,
    "billing": billing_bench.run,
    "sweeps": sweeps_bench.run,
    "simulator": simulator_bench.run,
    "volume": volume_bench.run,
    "growth": growth_bench.run,
    "idle": idle_bench.run,
}
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
MARK = "<!-- results:{name} -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"some of: {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("-n", type=int, default=2000, help="operations per measurement")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="a bus without authentication, to measure what it costs (implies --no-write)",
    )
    args = parser.parse_args()
    if args.no_auth:
        os.environ[AUTH_ENV] = "off"
        args.no_write = True
    for name in args.names or list(BENCHMARKS):
        if name not in BENCHMARKS:
            parser.error(f"no benchmark {name!r}: choose from {', '.join(BENCHMARKS)}")
        results: list[Result] = asyncio.run(BENCHMARKS[name](args.n))
        table = render(results)
        print(table)
        if not args.no_write:
            record(name, table, args.n)


def record(name: str, table: str, n: int) -> None:
    """Replace this benchmark's section in docs/benchmarks.md (other sections stay as they were)."""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = (
        f"{MARK.format(name=name)}\n_Last run {stamp} on {platform.machine()} with {_cores()} cores, "
        f"n={n}; `make bench`._\n\n{table}\n{MARK.format(name=name)}"
    )
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    marker = MARK.format(name=name)
    if marker in text:
        head, _, rest = text.partition(marker)
        _, _, tail = rest.partition(marker)
        text = head + section + tail
    else:
        text = text.rstrip() + f"\n\n## {name}\n\n{section}\n"
    DOC.write_text(text)


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
