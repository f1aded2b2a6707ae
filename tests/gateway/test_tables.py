"""Server-side Tables (meta.k8s.io/v1), as ``kubectl get`` asks for them: columns, cells, rows, watch."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from starlette.types import Message

from nodus_gateway import tabling
from nodus_gateway.resources import RESOURCES

# What kubectl get sends.
TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
    "application/json"
)
NOW = datetime(2026, 11, 30, 5, 0, 0, tzinfo=UTC)


def sweep(name: str, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name, "namespace": "p", "creationTimestamp": "2026-11-30T04:55:00Z"},
        "spec": {"matrix": {"params": {"LR": ["0.1", "0.01", "0.001"]}}},
        "status": status,
    }


def sweep_body(name: str) -> dict[str, Any]:
    job = {"image": "busybox", "command": ["true"], "resources": {"gpu": "H100:1"}}
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name},
        "spec": {"matrix": {"params": {"LR": ["0.1", "0.01"]}}, "template": {"spec": job}},
    }


def columns(table: dict[str, Any]) -> list[str]:
    return [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]


# ---------------------------------------------------------------------------------------------------------
# Negotiation and cells
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "version"),
    [
        (TABLE, "v1"),
        ("application/json;as=Table;g=meta.k8s.io;v=v1", "v1"),
        ("application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json", "v1beta1"),
        ("application/json", None),
        ("", None),
        ("*/*", None),
        # The first acceptable range decides, as in the kube-apiserver.
        ("application/json,application/json;as=Table;v=v1;g=meta.k8s.io", None),
        # A Table of another group is not ours to write; JSON after it is.
        ("application/json;as=Table;v=v1;g=example.com,application/json", None),
    ],
)
def test_table_version_follows_the_accept_header(accept: str, version: str | None) -> None:
    assert tabling.table_version({"accept": accept}) == version


def test_human_duration_is_kubernetes() -> None:
    cases = {
        0: "0s",
        45: "45s",
        119: "119s",
        200: "3m20s",
        600: "10m",
        3 * 3600: "3h",
        5 * 3600 + 600: "5h10m",
    }
    cases |= {30 * 3600: "30h", 3 * 86400: "3d", 3 * 86400 + 3600: "3d1h", 30 * 86400: "30d"}
    for seconds, text in cases.items():
        assert tabling.human_duration(seconds) == text, seconds


def test_sweep_rows_say_phase_cells_spent_best_and_age() -> None:
    done = sweep(
        "lr",
        phase="Running",
        cells=[{"index": 0, "repetition": 0, "phase": "Succeeded"}, {"index": 1, "repetition": 0}],
        cost={"totalUSD": "1.25"},
        best={"byCost": 0, "byThroughput": 0},
    )
    table = tabling.to_table("Sweep", [done, sweep("new")], list_meta={"resourceVersion": "9"}, now=NOW)
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert table["metadata"] == {"resourceVersion": "9"}
    assert columns(table) == ["Name", "Phase", "Cells", "Spent", "Best-Cost", "Best-Throughput", "Age"]
    assert [r["cells"][:7] for r in table["rows"]] == [
        ["lr", "Running", "1/2", "$1.25", 0, 0, "5m"],
        # Before the controller lists cells, the matrix says how many there will be.
        ["new", "Pending", "0/3", "-", None, None, "5m"],
    ]
    meta = table["rows"][0]["object"]
    assert meta["kind"] == "PartialObjectMetadata" and meta["metadata"]["name"] == "lr"


def test_job_rows_say_completions() -> None:
    job = {
        "kind": "Job",
        "metadata": {"name": "train", "creationTimestamp": "2026-11-30T04:00:00Z"},
        "spec": {"completions": 4},
        "status": {"phase": "Running", "succeeded": 3, "cost": {"totalUSD": "0.50"}},
    }
    table = tabling.to_table("Job", [job], now=NOW, include="Object")
    assert columns(table) == ["Name", "Phase", "Completions", "Spent", "Age"]
    assert table["rows"][0]["cells"][:5] == ["train", "Running", "3/4", "$0.50", "60m"]
    assert table["rows"][0]["object"] == job


def test_other_kinds_get_name_and_age_and_include_none_leaves_the_object_out() -> None:
    node = {"kind": "Node", "metadata": {"name": "h100-1", "creationTimestamp": "2026-11-30T04:59:00Z"}}
    table = tabling.to_table("Node", [node], now=NOW, include="None")
    assert columns(table) == ["Name", "Age"]
    assert table["rows"] == [{"cells": ["h100-1", "60s"]}]


def test_watch_events_become_one_row_tables_and_errors_stay_statuses() -> None:
    added = tabling.table_of_event("Sweep", {"type": "ADDED", "object": sweep("lr")})
    assert added["type"] == "ADDED"
    assert added["object"]["kind"] == "Table" and len(added["object"]["rows"]) == 1
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 410}}
    assert tabling.table_of_event("Sweep", error) == error
    bookmark = {"type": "BOOKMARK", "object": {"kind": "Sweep", "metadata": {"resourceVersion": "7"}}}
    marked = tabling.table_of_event("Sweep", bookmark)["object"]
    assert marked["rows"] == [] and marked["metadata"] == {"resourceVersion": "7"}


async def test_watch_rewriter_handles_events_split_across_chunks() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    rewriter = tabling._WatchRewriter(send, "Sweep", "Metadata", "v1")
    line = json.dumps({"type": "ADDED", "object": sweep("lr")}).encode() + b"\n"
    await rewriter.send({"type": "http.response.start", "status": 200, "headers": []})
    await rewriter.send({"type": "http.response.body", "body": line[:10], "more_body": True})
    await rewriter.send({"type": "http.response.body", "body": line[10:] + line, "more_body": True})
    await rewriter.send({"type": "http.response.body", "body": b"", "more_body": False})
    events = [json.loads(x) for m in sent[1:] for x in m["body"].splitlines()]
    assert [e["object"]["rows"][0]["cells"][0] for e in events] == ["lr", "lr"]


# ---------------------------------------------------------------------------------------------------------
# Through the API
# ---------------------------------------------------------------------------------------------------------


async def test_list_and_get_answer_a_table_when_asked(api: httpx.AsyncClient, unique: str) -> None:
    base = f"/apis/nodus.dev/v1/namespaces/{unique}/sweeps"
    created = await api.post(base, json=sweep_body("lr"))
    assert created.status_code == 201, created.text
    listed = await api.get(base, headers={"Accept": TABLE})
    assert listed.status_code == 200
    table = listed.json()
    assert table["kind"] == "Table"
    assert table["metadata"]["resourceVersion"]  # where kubectl get -w starts
    assert [r["cells"][:3] for r in table["rows"]] == [["lr", "Pending", "0/2"]]
    assert table["rows"][0]["object"]["metadata"]["uid"] == created.json()["metadata"]["uid"]

    one = (await api.get(f"{base}/lr", headers={"Accept": TABLE}, params={"includeObject": "Object"})).json()
    assert one["kind"] == "Table" and one["rows"][0]["object"]["spec"]["matrix"]["params"] == {
        "LR": ["0.1", "0.01"]
    }
    # Without the Table Accept the object is as it always was; errors stay Statuses.
    assert (await api.get(f"{base}/lr")).json()["kind"] == "Sweep"
    missing = await api.get(f"{base}/nope", headers={"Accept": TABLE})
    assert missing.status_code == 404 and missing.json()["kind"] == "Status"


async def test_every_resource_list_can_be_a_table(api: httpx.AsyncClient, unique: str) -> None:
    for res in RESOURCES:
        scope = f"namespaces/{unique}/" if getattr(res, "namespaced", True) else ""
        resp = await api.get(f"/apis/nodus.dev/v1/{scope}{res.plural}", headers={"Accept": TABLE})
        if resp.status_code in (404, 405):
            continue  # a row whose routes are not served (yet)
        assert resp.status_code == 200, (res.plural, resp.text)
        assert resp.json()["kind"] == "Table", res.plural
