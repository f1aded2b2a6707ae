"""``python -m bench.profiling OUT -m MODULE [ARGS...]``: run a module under cProfile timed by CPU, not wall.

The benchmarks' processes share two cores with each other; a wall-clock profile charges a function for
the time the process waited for a core. Timed by ``time.process_time`` the profile shows where this
process's own CPU goes (``NODUS_BENCH_PROFILE=<dir>``, see bench/running.py's ``spawn``).
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    out, flag, module, *rest = sys.argv[1:]
    if flag != "-m":
        raise SystemExit("usage: python -m bench.profiling OUT -m MODULE [ARGS...]")
    sys.argv = [module, *rest]
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profile.disable()
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
