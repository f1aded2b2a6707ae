"""A Sweep for the browser tests: created through the API, its status written into the ``sweeps`` bucket as
the sweep controller writes it, so the page has cells, costs and best cells without running the stack."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import msgspec
from nats.aio.client import Client as NATS

from nodus_kit.storing import ObjectStore
from nodus_schema import Sweep
from nodus_schema.costs import Cost
from nodus_schema.sweeps import SweepBest, SweepCell, SweepStatus

V1 = "/apis/nodus.dev/v1"
CAP_USD = "2.00"


def sweep_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name},
        "spec": {
            "maxCostUSD": CAP_USD,
            "matrix": {"gpu": ["H100:1", "A100:1"], "params": {"LR": ["0.1", "0.01"]}},
            "template": {"spec": {"image": "busybox", "command": ["true"], "resources": {"gpu": "H100:1"}}},
        },
    }


def cell(name: str, index: int, gpu: str, lr: str, phase: str, **measured: Any) -> SweepCell:
    return SweepCell(
        index=index,
        repetition=0,
        gpu=gpu,
        params={"LR": lr},
        object=f"{name}-{index}",
        phase=phase,
        **measured,
    )


def running(name: str) -> SweepStatus:
    """Mid-run: cell 2 is the cheapest so far, cell 0 the fastest, cell 1 failed, cell 3 still runs."""
    started = datetime.now(UTC) - timedelta(minutes=7)
    return SweepStatus(
        phase="Running",
        start_time=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        best=SweepBest(by_cost=2, by_throughput=0),
        cost=Cost(total_usd="0.76"),
        cells=[
            cell(
                name,
                0,
                "H100:1",
                "0.1",
                "Succeeded",
                wall_seconds=60,
                units_per_second="812.5",
                cost_usd="0.42",
            ),
            cell(name, 1, "H100:1", "0.01", "Failed", wall_seconds=5, cost_usd="0.03"),
            cell(
                name,
                2,
                "A100:1",
                "0.1",
                "Succeeded",
                wall_seconds=120,
                units_per_second="300",
                cost_usd="0.31",
            ),
            cell(name, 3, "A100:1", "0.01", "Running"),
        ],
    )


def finished(name: str) -> SweepStatus:
    """Cell 3 succeeded, the cheapest of all: it is now the best by cost; the spend is near the cap."""
    before = running(name)
    cells = [
        *before.cells[:3],
        cell(
            name,
            3,
            "A100:1",
            "0.01",
            "Succeeded",
            wall_seconds=3725,
            units_per_second="500",
            cost_usd="0.000177",
        ),
    ]
    return msgspec.structs.replace(
        before,
        phase="Failed",
        reason="CellsFailed",
        message="1 of 4 cells failed",
        best=SweepBest(by_cost=3, by_throughput=0),
        cost=Cost(total_usd="1.900177"),
        cells=cells,
    )


def create_sweep(api: httpx.Client, namespace: str, name: str) -> None:
    resp = api.post(f"{V1}/namespaces/{namespace}/sweeps", json=sweep_body(name))
    assert resp.status_code == 201, resp.text


def write_status(
    namespace: str, name: str, status: SweepStatus
) -> Callable[[NATS], Coroutine[Any, Any, None]]:
    """A coroutine factory for :meth:`Gateway.run`: the status written as the controller writes it."""

    async def write(nc: NATS) -> None:
        store = ObjectStore(nc, "sweeps", Sweep)
        await store.mutate(namespace, name, lambda s: msgspec.structs.replace(s, status=status))

    return write
