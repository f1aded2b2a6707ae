"""``spec.completeByTime`` through the API (issue #21): admitted (a hint, never refused, even in the past),
and the estimate of a dry run or a create warns DeadlineAtRisk or DeadlinePassed. The scheduler's and
billing's endpoints are served in-process on the real subjects, over the session's real NATS."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_schema.meta import format_time

API = "/apis/nodus.dev/v1"
DRY = {"dryRun": "All"}


@pytest_asyncio.fixture
async def endpoints(nc: NATS) -> AsyncIterator[None]:
    subs = [await serve_estimates(nc, load_catalog()), await serve_quotes(nc)]
    yield
    for sub in subs:
        await sub.unsubscribe()


def spec(deadline: str, **kw: Any) -> dict[str, Any]:
    return {
        "image": "ghcr.io/acme/train:1.0",
        "expectedDuration": "2h",
        "resources": {"gpu": {"type": ["H100-SXM-80G"], "exact": True, "count": 1}},
        "placement": {"regions": ["us"]},
        "completeByTime": deadline,
        **kw,
    }


def warnings(obj: dict[str, Any]) -> dict[str, str]:
    return {w["code"]: w["message"] for w in obj["status"]["estimate"].get("warnings", [])}


async def test_a_dry_run_warns_of_a_deadline_the_p90_finish_misses(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    deadline = format_time(datetime.now(UTC) + timedelta(hours=1))
    body = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": spec(deadline)}
    resp = await api.post(f"{API}/namespaces/{unique}/jobs", json=body, params=DRY)
    assert resp.status_code == 201, resp.text
    obj = resp.json()
    assert obj["spec"]["completeByTime"] == deadline
    assert "blockingReasons" not in obj["status"]["estimate"]
    message = warnings(obj)["DeadlineAtRisk"]
    # 2h expected (p90 3h) plus the cold start's p90: about 2 hours late.
    assert f"after spec.completeByTime {deadline}" in message and "To finish in time:" in message


async def test_a_past_deadline_is_admitted_with_a_warning(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    body = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": "late"},
        "spec": spec("1970-01-01T00:00:00Z"),
    }
    resp = await api.post(f"{API}/namespaces/{unique}/jobs", json=body)
    assert resp.status_code == 201, resp.text
    assert "DeadlinePassed" in warnings(resp.json())
    stored = (await api.get(f"{API}/namespaces/{unique}/jobs/late")).json()
    assert stored["spec"]["completeByTime"] == "1970-01-01T00:00:00Z"


async def test_a_sweeps_deadline_counts_its_cells_rounds(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    deadline = format_time(datetime.now(UTC) + timedelta(hours=4))
    body = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": "s"},
        "spec": {
            "maxParallel": 1,
            "matrix": {"gpu": ["L4:1"], "regions": ["us"], "params": {"LR": ["0.1", "0.01"]}},
            "template": {
                "kind": "Job",
                "spec": {"image": "x", "expectedDuration": "2h", "completeByTime": deadline},
            },
        },
    }
    resp = await api.post(f"{API}/namespaces/{unique}/sweeps", json=body, params=DRY)
    assert resp.status_code == 201, resp.text
    message = warnings(resp.json())["DeadlineAtRisk"]
    # Two cells one at a time, each 3h (p90) plus its start: the last ends over 6h from now.
    assert "the p90 finish of the last cell" in message and "2 cells, 1 at a time" in message
    assert "raise spec.maxParallel (now 1: 2 cells run in 2 rounds)" in message
    assert f"after spec.template.spec.completeByTime {deadline}" in message
