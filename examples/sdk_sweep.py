"""The example Sweep through the Python SDK: create it from examples/sweep.yaml, watch it to the end
printing its progress, then print the best cells.

Against the local stack (`make up`, which writes .nodus/local.env; the SDK finds it from here):

    .venv/bin/python examples/sdk_sweep.py            # follows an existing hash-bench instead of failing
    .venv/bin/python examples/sdk_sweep.py --fresh    # deletes it (and its cells) first

Exit status: 0 when the Sweep succeeded, 1 when it failed or was cancelled, 2 on a timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nodus_schema import Sweep
from nodus_schema.results import best_cells
from nodus_sdk import AlreadyExists, Client, NodusError, NotFound, WaitTimeout, finished, load_objects

TIMEOUT_S = 900.0


def progress(sweep: Sweep) -> str:
    cells = sweep.status.cells
    done = sum(1 for c in cells if c.phase in ("Succeeded", "Failed", "Cancelled"))
    cost = sweep.status.cost.total_usd if sweep.status.cost else "0"
    return f"{sweep.status.phase or 'Pending':<10} cells {done}/{len(cells) or '?'} done  spent ${cost}"


def main(argv: list[str]) -> int:
    (sweep,) = load_objects((Path(__file__).parent / "sweep.yaml").read_text())
    name = sweep.metadata.name
    with Client() as nodus:
        print(f"gateway {nodus.server}, project {nodus.project}")
        if "--fresh" in argv:
            try:
                nodus.sweeps.delete(name, propagation_policy="Foreground")
                print(f"deleted the old {name}")
            except NotFound:
                pass
        try:
            created = nodus.sweeps.create(sweep)
            print(f"created sweep {name} ({len(created.spec.matrix.gpu)} GPU types)")
        except AlreadyExists:
            print(f"sweep {name} exists: following it (--fresh starts it again)")

        # The watch starts with the Sweep as it is now, then every change; the last line printed is
        # the final state. wait_for(sweep, finished) would wait the same way without printing.
        last = ""
        final: Sweep | None = None
        with nodus.sweeps.watch(field_selector=f"metadata.name={name}", timeout=TIMEOUT_S) as events:
            for event in events:
                if event.type == "DELETED":
                    print("the Sweep was deleted")
                    return 1
                line = progress(event.object)
                if line != last:
                    print(line, flush=True)
                    last = line
                if finished(event.object):
                    final = event.object
                    break
        if final is None:
            raise WaitTimeout(f"Sweep {name}", TIMEOUT_S, None)

        results = nodus.results(name)
        cheapest, fastest = best_cells(results)
        print(f"\n{name} {results.phase} ({results.reason}), total ${results.total_usd}")
        for c in results.cells:
            params = ",".join(f"{k}={v}" for k, v in c.params.items())
            print(
                f"  #{c.index} {c.gpu or '-':<8} {params:<12} {c.phase:<10} "
                f"{c.units_per_second or '-':>8} units/s  ${c.cost_usd or '-'}"
            )
        if cheapest:
            print(f"best by cost: #{cheapest.index} ({cheapest.object}) ${cheapest.cost_usd}")
        if fastest:
            print(
                f"best by throughput: #{fastest.index} ({fastest.object}) {fastest.units_per_second} units/s"
            )
        return 0 if results.phase == "Succeeded" else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except WaitTimeout as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except NodusError as e:
        # Every error carries the server's Status: its message, the fix, the request id.
        print(f"error: {e.message}\nfix: {e.fix}\nrequest id: {e.request_id}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
