"""The billing API of the gateway (issue #7) against billing's real endpoints on the session's nats-server.

Billing's account, grant and usage endpoints run in-process (``serve_accounts`` on a ``Books``), as the
billing service serves them; charges are put in the books the way billing's own metering puts them
(``Books.apply`` with PutJob, PlaceHold and Capture), so usage, invoices and their CSV are checked to the
micro-dollar. Budgets are checked through the generic resource routes, as a Table, and with the real
kubectl.
"""

from __future__ import annotations

import asyncio
import csv
import io
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_billing.books import Books
from nodus_billing.holding import Capture, Grant, Op, PlaceHold, PutJob, PutSweep
from nodus_billing.serving import serve_accounts
from nodus_billing.standing import Usage
from nodus_gateway import billingapi
from nodus_gateway.app import build_app
from nodus_gateway.invoicing import billed_hours, billed_seconds
from nodus_gateway.principals import Principals
from nodus_gateway.resources import resource, stores_for
from nodus_gateway.server import ApiServer
from nodus_kit.storing import ObjectStore
from nodus_schema.billing import Budget, BudgetStatus
from nodus_testing import certs
from nodus_testing.localstack import kubeconfig

ADMIN_TOKEN = "billing-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1"
MONTH = "2026-11"
AT_MS = int(datetime(2026, 11, 15, tzinfo=UTC).timestamp() * 1000)
OCTOBER_MS = int(datetime(2026, 10, 20, tzinfo=UTC).timestamp() * 1000)
HOUR_MS = 3_600_000


# ---------------------------------------------------------------------------------------------------------
# Fixtures: billing's endpoints, a gateway with projects and tokens, a project with a viewer
# ---------------------------------------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def books(nc: NATS) -> AsyncIterator[Books]:
    """Billing's books, and its account, grant and usage endpoints serving them."""
    books = Books(nc)
    subs = await serve_accounts(nc, books)
    yield books
    for sub in subs:
        await sub.unsubscribe()


def client(app: FastAPI, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {token}"},
    )


@dataclass
class Project:
    name: str
    admin: httpx.AsyncClient
    viewer: httpx.AsyncClient
    stranger: httpx.AsyncClient
    books: Books

    def path(self, *rest: str) -> str:
        return "/".join([f"{V1}/namespaces/{self.name}", *rest])

    async def grant(self, amount: str, **more: Any) -> httpx.Response:
        return await self.admin.post(self.path("account", "grants"), json={"amountUSD": amount, **more})


async def mint(admin: httpx.AsyncClient, principal: str, roles: dict[str, str]) -> str:
    resp = await admin.post(f"{V1}/tokens", json={"spec": {"principal": principal, "roles": roles}})
    assert resp.status_code == 201, resp.text
    secret: str = resp.json()["secret"]
    return secret


@pytest_asyncio.fixture
async def project(nc: NATS, unique: str, books: Books) -> AsyncIterator[Project]:
    """A project of its own per test (credits are per project), with a viewer and a stranger."""
    principals = Principals(nc, pepper=b"billing-pepper", cache_ttl_s=0.2)
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals)
    other = f"o-{unique}"
    async with client(app, ADMIN_TOKEN) as admin:
        for name in (unique, other):
            resp = await admin.post(f"{V1}/projects", json={"metadata": {"name": name}})
            assert resp.status_code == 201, resp.text
        viewer_token = await mint(admin, "vera", {unique: "viewer"})
        stranger_token = await mint(admin, "sam", {other: "editor"})
        async with client(app, viewer_token) as viewer, client(app, stranger_token) as stranger:
            yield Project(unique, admin, viewer, stranger, books)


def assert_status(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["code"], body["reason"]) == ("Status", code, reason)
    assert body["fix"] and body["docs"].endswith(f"/errors/{reason}")
    return body


def causes(body: dict[str, Any]) -> set[str]:
    return {c["field"] for c in body["details"]["causes"]}


def balances(account: dict[str, Any]) -> dict[str, Any]:
    status: dict[str, Any] = account["status"]
    return status


# ---------------------------------------------------------------------------------------------------------
# Account and credits
# ---------------------------------------------------------------------------------------------------------


async def test_grant_then_read_the_account(project: Project) -> None:
    resp = await project.grant("100.00", id="welcome", note="first credits")
    assert resp.status_code == 201, resp.text
    granted = resp.json()
    assert granted == {
        "apiVersion": "nodus.dev/v1",
        "kind": "Account",
        "metadata": {"name": project.name, "namespace": project.name},
        "status": {
            "grantedUSD": "100.00",
            "availableUSD": "100.00",
            "heldUSD": "0.00",
            "spentUSD": "0.00",
            "unbilledUSD": "0.00",
            "openHolds": 0,
        },
    }
    read = await project.admin.get(project.path("account"))
    assert read.status_code == 200 and read.json() == granted


async def test_a_grant_retried_with_the_same_id_counts_once(project: Project) -> None:
    for _ in range(2):
        resp = await project.grant("25.50", id="ticket-42")
        assert resp.status_code == 201, resp.text
    assert balances(resp.json())["grantedUSD"] == "25.50"
    # The Idempotency-Key header names the grant when the body does not.
    for _ in range(2):
        resp = await project.admin.post(
            project.path("account", "grants"),
            json={"amountUSD": "10"},
            headers={"Idempotency-Key": "3f1c2d6e-0a51-4e8e-9d6b-2b7f5f6e9a10"},
        )
        assert resp.status_code == 201, resp.text
    assert balances(resp.json())["grantedUSD"] == "35.50"
    # Without either, each request is a grant of its own.
    for _ in range(2):
        resp = await project.grant("1.25")
    assert balances(resp.json())["grantedUSD"] == "38.00"


async def test_revoking_more_than_is_available_is_409_insufficient_credits(project: Project) -> None:
    assert (await project.grant("10.00", id="g")).status_code == 201
    body = assert_status(await project.grant("25.00", id="r1", revoke=True), 409, "InsufficientCredits")
    assert "10.00" in body["message"] + body["fix"]  # billing's words: what can be revoked
    assert body["details"]["name"] == project.name
    resp = await project.grant("4.00", id="r2", revoke=True)
    assert resp.status_code == 201, resp.text
    assert balances(resp.json())["grantedUSD"] == balances(resp.json())["availableUSD"] == "6.00"


async def test_a_viewer_reads_the_account_but_only_the_cluster_admin_grants(project: Project) -> None:
    assert (await project.grant("5.00", id="g")).status_code == 201
    read = await project.viewer.get(project.path("account"))
    assert read.status_code == 200 and balances(read.json())["grantedUSD"] == "5.00"
    body = assert_status(
        await project.viewer.post(project.path("account", "grants"), json={"amountUSD": "1"}),
        403,
        "Forbidden",
    )
    assert "cluster admin" in body["fix"]
    # A token without a role in the project learns nothing about it, and grants nothing either.
    assert_status(await project.stranger.get(project.path("account")), 403, "Forbidden")
    assert_status(await project.stranger.get(project.path("usage")), 403, "Forbidden")
    assert_status(await project.stranger.get(project.path("invoices", MONTH)), 404, "NotFound")
    assert_status(
        await project.stranger.post(project.path("account", "grants"), json={"amountUSD": "1"}),
        403,
        "Forbidden",
    )
    after = await project.admin.get(project.path("account"))
    assert balances(after.json())["grantedUSD"] == "5.00"


@pytest.mark.parametrize(
    ("amount", "why"),
    [
        ("-5.00", "must not be negative"),
        ("0", "greater than 0"),
        ("ten", "decimal"),
        ("1.1234567", "6 decimal"),
        ("1e3", "exponent"),
        (100, "string"),
    ],
)
async def test_a_bad_amount_is_422_with_a_field_cause(project: Project, amount: Any, why: str) -> None:
    body = assert_status(await project.grant(amount), 422, "Invalid")
    assert causes(body) == {"amountUSD"}
    assert why in body["details"]["causes"][0]["message"]
    assert balances((await project.admin.get(project.path("account"))).json())["grantedUSD"] == "0.00"


async def test_a_grant_body_is_read_strictly(project: Project) -> None:
    body = assert_status(
        await project.admin.post(project.path("account", "grants"), json={"amount": "5"}), 422, "Invalid"
    )
    assert causes(body) == {"amountUSD", "amount"}
    body = assert_status(await project.grant("5", id="no spaces allowed"), 422, "Invalid")
    assert causes(body) == {"id"}
    resp = await project.admin.post(
        project.path("account", "grants"), json={"amountUSD": "5"}, headers={"Idempotency-Key": "a b"}
    )
    assert_status(resp, 400, "BadRequest")


async def test_credits_go_to_existing_projects_only(project: Project, unique: str) -> None:
    resp = await project.admin.post(f"{V1}/namespaces/nope-{unique}/account/grants", json={"amountUSD": "1"})
    body = assert_status(resp, 404, "NotFound")
    assert body["message"] == f'projects.nodus.dev "nope-{unique}" not found'


async def test_without_billing_the_answer_is_503_with_a_fix(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A subject nobody serves: NATS answers "no responders" at once, as when billing is not running.
    monkeypatch.setattr(billingapi, "ACCOUNT_SUBJECT", "nodus.rpc.billing.nobody")
    monkeypatch.setattr(billingapi, "USAGE_SUBJECT", "nodus.rpc.billing.nobody")
    body = assert_status(await project.admin.get(project.path("account")), 503, "ServiceUnavailable")
    assert "nodus-billing" in body["fix"] and body["details"]["retryAfterSeconds"] == 1
    assert_status(await project.viewer.get(project.path("usage")), 503, "ServiceUnavailable")
    assert_status(await project.viewer.get(project.path("invoices", MONTH)), 503, "ServiceUnavailable")


# ---------------------------------------------------------------------------------------------------------
# Usage and invoices
# ---------------------------------------------------------------------------------------------------------


USAGE_HEADER = (
    "month,job,attempt,sweep,offering,pricebookVersion,rateUSDPerHour,billedSeconds,startTime,finishTime,"
    "costUSD,bootUSD,runningUSD,restoreUSD,teardownUSD,coveredUSD"
)
INVOICE_HEADER = "sweep,job,offering,rateUSDPerHour,attempts,quantity,amountUSD,coveredUSD"


async def test_usage_and_invoice_of_a_project_without_charges(project: Project) -> None:
    usage = await project.viewer.get(project.path("usage"), params={"month": MONTH})
    assert usage.status_code == 200, usage.text
    assert usage.json() == {
        "apiVersion": "nodus.dev/v1",
        "kind": "UsageList",
        "project": project.name,
        "month": MONTH,
        "items": [],
    }
    every = await project.viewer.get(project.path("usage"))
    assert every.json()["month"] is None and every.json()["items"] == []
    text = await project.viewer.get(project.path("usage"), params={"format": "csv"})
    assert text.headers["content-type"].startswith("text/csv")
    assert text.text == USAGE_HEADER + "\r\n"
    inv = await project.viewer.get(project.path("invoices", MONTH))
    assert inv.json() == {
        "apiVersion": "nodus.dev/v1",
        "kind": "Invoice",
        "project": project.name,
        "month": MONTH,
        "lines": [],
        "totalUSD": "0.00",
        "coveredUSD": "0.00",
    }
    text = await project.viewer.get(project.path("invoices", MONTH), headers={"Accept": "text/csv"})
    assert text.text == f"{INVOICE_HEADER}\r\nTOTAL,,,,0,0.000000,0.00,0.00\r\n"


async def test_bad_months_and_formats_are_400_with_a_fix(project: Project) -> None:
    for bad in ("2026-13", "2026-1", "nov"):
        body = assert_status(
            await project.viewer.get(project.path("usage"), params={"month": bad}), 400, "BadRequest"
        )
        assert "YYYY-MM" in body["fix"]
        assert_status(await project.viewer.get(project.path("invoices", bad)), 400, "BadRequest")
    body = assert_status(
        await project.viewer.get(project.path("usage"), params={"format": "xml"}), 400, "BadRequest"
    )
    assert "format=csv" in body["fix"]


@dataclass(frozen=True)
class Run:
    """One Attempt's run as billing's metering books it: a hold, then its capture with the usage."""

    job: str
    attempt: str
    offering: str
    rate: int
    millis: int
    boot: int
    running: int
    covered: int = 0
    at_ms: int = AT_MS

    @property
    def amount(self) -> int:
        return self.boot + self.running

    def ops(self) -> list[Op]:
        start = datetime.fromtimestamp(self.at_ms / 1000, UTC)
        finish = datetime.fromtimestamp((self.at_ms + self.millis) / 1000, UTC)
        usage = Usage(
            attempt=self.attempt,
            offering=self.offering,
            pricebook_version="v7",
            rate_micros_per_hour=self.rate,
            billed_millis=self.millis,
            segments={"Boot": self.boot, "Running": self.running},
            covered={"Restore": self.covered} if self.covered else {},
            start_time=start.isoformat().replace("+00:00", "Z"),
            finish_time=finish.isoformat().replace("+00:00", "Z"),
        )
        return [
            PlaceHold(
                hold_id=self.attempt,
                job=self.job,
                amount_micros=self.amount + 1_000_000,
                funded_until_ms=self.at_ms + 2 * HOUR_MS,
                at_ms=self.at_ms,
                rate_micros_per_hour=self.rate,
            ),
            Capture(hold_id=self.attempt, amount_micros=self.amount, usage=usage),
        ]


H100 = "h100-sxm-80g-x1-us"
A100 = "a100-80g-x1-us"
RUNS = (
    # Two cells of Sweep "lr" on the same offering and rate: one invoice line.
    Run("lr-0@u0", "lr-0-u0-0-a1", H100, 2_500_000, 90 * 60_000, 250_000, 3_500_000),
    Run("lr-1@u1", "lr-1-u1-0-a1", H100, 2_500_000, 1_234_567, 100_000, 757_338, covered=42_000),
    # A Job of its own on another offering.
    Run("train@u2", "train-u2-0-a1", A100, 1_200_000, 10 * 60_000, 0, 200_000),
    # Last month's: in no November figure.
    Run("train@u2", "train-u2-0-a0", A100, 1_200_000, HOUR_MS, 0, 1_200_000, at_ms=OCTOBER_MS),
)


async def charge(project: Project) -> None:
    ops: list[Op] = [
        Grant(grant_id="seed", project=project.name, amount_micros=100_000_000),
        PutSweep(name="lr@us", project=project.name, generation=1),
        PutJob(name="lr-0@u0", project=project.name, generation=1, sweep="lr@us"),
        PutJob(name="lr-1@u1", project=project.name, generation=1, sweep="lr@us"),
        PutJob(name="train@u2", project=project.name, generation=1),
    ]
    for run in RUNS:
        ops += run.ops()
    applied = await project.books.apply(project.name, ops)
    assert all(r is not None and r.ok for r in applied.results), applied.results


def usd(micros: int) -> str:
    whole, frac = divmod(micros, 1_000_000)
    return f"{whole}.{f'{frac:06d}'.rstrip('0').ljust(2, '0')}"


async def test_usage_lists_every_attempt_to_the_micro_dollar(project: Project) -> None:
    await charge(project)
    resp = await project.viewer.get(project.path("usage"), params={"month": MONTH})
    assert resp.status_code == 200, resp.text
    items = resp.json()["items"]
    november = [r for r in RUNS if r.at_ms == AT_MS]
    assert [i["attempt"] for i in items] == [r.attempt for r in november]
    first = items[0]
    assert first == {
        "month": MONTH,
        "job": "lr-0",
        "attempt": "lr-0-u0-0-a1",
        "sweep": "lr",
        "offering": H100,
        "pricebookVersion": "v7",
        "rateUSDPerHour": "2.50",
        "billedSeconds": "5400.000",
        "startTime": "2026-11-15T00:00:00Z",
        "finishTime": "2026-11-15T01:30:00Z",
        "costUSD": "3.75",
        "bootUSD": "0.25",
        "runningUSD": "3.50",
        "restoreUSD": "0.00",
        "teardownUSD": "0.00",
        "coveredUSD": "0.00",
    }
    assert items[1]["billedSeconds"] == "1234.567" and items[1]["costUSD"] == "0.857338"
    assert items[1]["coveredUSD"] == "0.042" and items[2]["sweep"] is None and items[2]["job"] == "train"
    # Every month when none is asked for; CSV with the same columns and the same strings.
    assert len((await project.viewer.get(project.path("usage"))).json()["items"]) == len(RUNS)
    text = (await project.viewer.get(project.path("usage"), params={"month": MONTH, "format": "csv"})).text
    rows = list(csv.reader(io.StringIO(text)))
    assert ",".join(rows[0]) == USAGE_HEADER
    assert [dict(zip(rows[0], row, strict=True)) for row in rows[1:]] == [
        {k: "" if v is None else str(v) for k, v in item.items()} for item in items
    ]
    assert rows[1] == [
        MONTH, "lr-0", "lr-0-u0-0-a1", "lr", H100, "v7", "2.50", "5400.000", "2026-11-15T00:00:00Z",
        "2026-11-15T01:30:00Z", "3.75", "0.25", "3.50", "0.00", "0.00", "0.00",
    ]  # fmt: skip
    account = balances((await project.viewer.get(project.path("account"))).json())
    spent = sum(r.amount for r in RUNS)
    assert account["spentUSD"] == usd(spent) and account["availableUSD"] == usd(100_000_000 - spent)
    assert account["heldUSD"] == "0.00" and account["openHolds"] == 0


async def test_the_invoice_groups_by_sweep_or_job_and_offering(project: Project) -> None:
    await charge(project)
    resp = await project.viewer.get(project.path("invoices", MONTH))
    assert resp.status_code == 200, resp.text
    inv = resp.json()
    lr = [r for r in RUNS if r.job.startswith("lr-")]
    assert inv["lines"] == [
        {
            "sweep": "lr",
            "job": None,
            "offering": H100,
            "rateUSDPerHour": "2.50",
            "attempts": 2,
            "quantity": str(billed_hours(sum(r.millis for r in lr))),
            "amountUSD": usd(sum(r.amount for r in lr)),
            "coveredUSD": "0.042",
        },
        {
            "sweep": None,
            "job": "train",
            "offering": A100,
            "rateUSDPerHour": "1.20",
            "attempts": 1,
            "quantity": "0.166667",
            "amountUSD": "0.20",
            "coveredUSD": "0.00",
        },
    ]
    assert inv["lines"][0]["quantity"] == "1.842935"  # (5 400 000 + 1 234 567) ms in hours, 6 places
    assert inv["lines"][0]["amountUSD"] == "4.607338"
    assert (inv["totalUSD"], inv["coveredUSD"]) == ("4.807338", "0.042")
    text = (await project.viewer.get(project.path("invoices", MONTH), params={"format": "csv"})).text
    assert text.splitlines() == [
        INVOICE_HEADER,
        f"lr,,{H100},2.50,2,1.842935,4.607338,0.042",
        f",train,{A100},1.20,1,0.166667,0.20,0.00",
        "TOTAL,,,,3,2.009602,4.807338,0.042",
    ]
    october = (await project.viewer.get(project.path("invoices", "2026-10"))).json()
    assert [line["attempts"] for line in october["lines"]] == [1] and october["totalUSD"] == "1.20"


def test_billed_time_is_exact() -> None:
    assert (
        billed_seconds(0) == "0.000" and billed_seconds(1) == "0.001" and billed_seconds(90_500) == "90.500"
    )
    assert str(billed_hours(HOUR_MS)) == "1.000000" and str(billed_hours(1)) == "0.000000"
    assert str(billed_hours(2)) == "0.000001"  # 0.00000055… h rounds half up


# ---------------------------------------------------------------------------------------------------------
# Budgets
# ---------------------------------------------------------------------------------------------------------


def budget(name: str, spec: Any, **more: Any) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Budget", "metadata": {"name": name}, "spec": spec, **more}


async def test_budgets_are_created_read_listed_and_changed(project: Project) -> None:
    spec = {"monthlyUSD": "500.00", "selector": {"team": "ml"}}
    sent = budget("ml", spec, status={"usedUSD": "499.00", "month": MONTH})
    created = await project.admin.post(project.path("budgets"), json=sent)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["spec"] == spec and body.get("status", {}) == {}  # users never write status
    assert body["metadata"]["generation"] == 1 and body["metadata"]["namespace"] == project.name
    got = await project.viewer.get(project.path("budgets", "ml"))
    assert got.status_code == 200 and got.json()["spec"] == spec
    listed = (await project.viewer.get(project.path("budgets"))).json()
    assert listed["kind"] == "BudgetList" and [i["metadata"]["name"] for i in listed["items"]] == ["ml"]
    # A viewer only reads.
    assert_status(
        await project.viewer.post(project.path("budgets"), json=budget("x", spec)), 403, "Forbidden"
    )
    patched = await project.admin.patch(
        project.path("budgets", "ml"),
        json={"spec": {"monthlyUSD": "750"}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["spec"] == {"monthlyUSD": "750", "selector": {"team": "ml"}}
    assert patched.json()["metadata"]["generation"] == 2
    put = patched.json()
    put["spec"] = {"monthlyUSD": "750"}
    replaced = await project.admin.put(project.path("budgets", "ml"), json=put)
    assert replaced.status_code == 200 and replaced.json()["spec"] == {"monthlyUSD": "750"}
    assert (await project.admin.delete(project.path("budgets", "ml"))).status_code == 200
    assert_status(await project.admin.get(project.path("budgets", "ml")), 404, "NotFound")


@pytest.mark.parametrize(
    ("spec", "fields"),
    [
        ({"monthlyUSD": "-1"}, {"spec.monthlyUSD"}),
        ({"monthlyUSD": "lots"}, {"spec.monthlyUSD"}),
        ({"monthlyUSD": "0.0000001"}, {"spec.monthlyUSD"}),
        ({"monthlyUSD": 500}, {"spec.monthlyUSD"}),
        ({}, {"spec.monthlyUSD"}),
        (
            {"monthlyUSD": "5", "selector": {"bad key!": "x", "team": "not a value"}},
            {"spec.selector[bad key!]", "spec.selector[team]"},
        ),
        ({"monthlyUSD": "5", "selectr": {}}, {"spec.selectr"}),
        (None, {"spec"}),
    ],
)
async def test_a_bad_budget_is_422_with_field_causes(project: Project, spec: Any, fields: set[str]) -> None:
    sent = (
        budget("b", spec)
        if spec is not None
        else {"apiVersion": "nodus.dev/v1", "kind": "Budget", "metadata": {"name": "b"}}
    )
    body = assert_status(await project.admin.post(project.path("budgets"), json=sent), 422, "Invalid")
    assert causes(body) == fields
    assert body["details"]["kind"] == "Budget"


async def test_budgets_as_a_kubectl_table(project: Project, nc: NATS) -> None:
    created = await project.admin.post(project.path("budgets"), json=budget("all", {"monthlyUSD": "1000.00"}))
    assert created.status_code == 201, created.text
    table = (await project.viewer.get(project.path("budgets"), headers={"Accept": TABLE})).json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Monthly", "Used", "Month", "Age"]
    assert table["rows"][0]["cells"][:4] == ["all", "$1000.00", "-", "-"]
    # Billing writes status (month, usedUSD), as it does for every Budget it enforces.
    store: ObjectStore[Budget] = ObjectStore(nc, resource("budgets").bucket, Budget)
    current = await store.get(project.name, "all")
    current.status = BudgetStatus(month=MONTH, used_usd="12.345", observed_generation=1)
    await store.update(current)
    one = (await project.viewer.get(project.path("budgets", "all"), headers={"Accept": TABLE})).json()
    assert one["rows"][0]["cells"][:4] == ["all", "$1000.00", "$12.345", MONTH]


async def test_discovery_lists_budgets_with_their_verbs_and_short_name(project: Project) -> None:
    listed = {r["name"]: r for r in (await project.viewer.get(V1)).json()["resources"]}
    budgets = listed["budgets"]
    assert (budgets["kind"], budgets["singularName"], budgets["namespaced"]) == ("Budget", "budget", True)
    assert budgets["shortNames"] == ["bud"] and "categories" not in budgets
    assert budgets["verbs"] == [
        "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch",
    ]  # fmt: skip
    assert "account" not in listed and "usage" not in listed  # views of a project, not resources


async def test_openapi_documents_the_billing_routes(project: Project) -> None:
    index = (await project.viewer.get("/openapi/v3")).json()
    doc = (await project.viewer.get(index["paths"]["apis/nodus.dev/v1"]["serverRelativeURL"])).json()
    paths, schemas = doc["paths"], doc["components"]["schemas"]
    base = "/apis/nodus.dev/v1/namespaces/{namespace}"
    account = paths[f"{base}/account"]["get"]["responses"]["200"]["content"]
    assert account == {"application/json": {"schema": {"$ref": "#/components/schemas/Account"}}}
    grants = paths[f"{base}/account/grants"]["post"]
    assert set(grants["responses"]) >= {"201", "default"}
    assert grants["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CreditGrant"
    }
    assert "Idempotency-Key" in {p["name"] for p in grants["parameters"]}
    for path, kind in ((f"{base}/usage", "UsageList"), (f"{base}/invoices/{{month}}", "Invoice")):
        content = paths[path]["get"]["responses"]["200"]["content"]
        assert content["application/json"]["schema"] == {"$ref": f"#/components/schemas/{kind}"}
        assert content["text/csv"]["schema"] == {"type": "string"}
        assert {"format"} <= {p["name"] for p in paths[path]["get"]["parameters"]}
    assert schemas["CreditGrant"]["required"] == ["amountUSD"]
    assert "grantedUSD" in schemas["AccountStatus"]["properties"]
    assert f"{base}/budgets/{{name}}" in paths and "Budget" in schemas and "BudgetList" in schemas


# ---------------------------------------------------------------------------------------------------------
# The real kubectl
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_kubectl_gets_budgets(nc: NATS, unique: str, tmp_path: Path) -> None:
    assert shutil.which("kubectl"), "kubectl is not on the PATH: install it (Debian/Google package kubectl)"
    tls = certs.ensure(tmp_path / "certs")
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN)
    server = ApiServer(app, "127.0.0.1", 0, ssl_certfile=str(tls.cert), ssl_keyfile=str(tls.key))
    await server.start()
    try:
        config = tmp_path / "kubeconfig"
        config.write_text(kubeconfig(server.url, ADMIN_TOKEN, tls.ca.read_bytes()))
        manifest = tmp_path / "budget.yaml"
        manifest.write_text(
            "apiVersion: nodus.dev/v1\nkind: Budget\nmetadata:\n  name: ml\n"
            'spec:\n  monthlyUSD: "250.00"\n  selector:\n    team: ml\n'
        )

        async def kubectl(*args: str) -> str:
            argv = ["kubectl", "--kubeconfig", str(config), "--cache-dir", str(tmp_path / "cache"), *args]
            done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
            return done.stdout

        assert "budget.nodus.dev/ml created" in await kubectl("apply", "-n", unique, "-f", str(manifest))
        header, row = (await kubectl("get", "budgets", "-n", unique)).strip().splitlines()
        assert header.split() == ["NAME", "MONTHLY", "USED", "MONTH", "AGE"]
        assert row.split()[:4] == ["ml", "$250.00", "-", "-"]
        assert (
            await kubectl("get", "bud", "ml", "-n", unique, "-o", "jsonpath={.spec.monthlyUSD}")
        ) == "250.00"
        assert 'budget.nodus.dev "ml" deleted' in await kubectl("delete", "budget", "ml", "-n", unique)
    finally:
        await server.stop()


# ---------------------------------------------------------------------------------------------------------
# Grants within the books' bounds (MAX_USD): a bad amount is a 4xx with a fix, never a 500
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "amount",
    ["1000000000.000001", "99999999999999", "99999999999999999999", True, None, 1.5, {"usd": "1"}, ["1"]],
    ids=["just-above-max", "the-report", "beyond-64-bits", "bool", "null", "float", "object", "list"],
)
async def test_a_grant_above_max_usd_or_not_a_string_is_422_with_a_fix(project: Project, amount: Any) -> None:
    body = assert_status(await project.grant(amount), 422, "Invalid")
    assert causes(body) == {"amountUSD"}
    if isinstance(amount, str):
        assert "at most 1000000000" in body["details"]["causes"][0]["message"]
    # Nothing was granted, and the book takes the next grant (an oversize one once poisoned it for good).
    assert (await project.grant("1.00")).status_code == 201
    assert balances((await project.admin.get(project.path("account"))).json())["grantedUSD"] == "1.00"


async def test_a_grant_of_exactly_max_usd_is_granted(project: Project) -> None:
    resp = await project.grant("1000000000.000000")
    assert resp.status_code == 201, resp.text
    assert balances(resp.json())["grantedUSD"] == "1000000000.00"


async def test_a_billing_answer_the_gateway_does_not_know_is_503_not_500(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Billing answering InternalError (an older billing; a bug) is billing unable to serve the request:
    503 with a fix, and none of its exception's text."""

    async def failing(*_: Any, **__: Any) -> Any:
        raise billingapi.kit.NodusError("OverflowError: can't serialize ints < -2**63 or > 2**64 - 1")

    monkeypatch.setattr(billingapi.messaging, "request", failing)
    for resp in (await project.grant("1.00"), await project.viewer.get(project.path("account"))):
        body = assert_status(resp, 503, "ServiceUnavailable")
        assert "OverflowError" not in resp.text and body["details"]["retryAfterSeconds"] == 1
