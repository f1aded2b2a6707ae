"""nodus account, credits, usage and invoice, and Budgets through get/apply/describe/delete, against a real
gateway (with projects and tokens) and billing's real account endpoints on the session's nats-server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_billing.books import Books
from nodus_billing.holding import Capture, Grant, Op, PlaceHold, PutJob, PutSweep
from nodus_billing.serving import serve_accounts
from nodus_billing.standing import Usage
from nodus_cli import main
from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer

TOKEN = "cli-billing-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
MONTH = "2026-11"
AT_MS = int(datetime(2026, 11, 2, 8, tzinfo=UTC).timestamp() * 1000)
BUDGET_YAML = """\
apiVersion: nodus.dev/v1
kind: Budget
metadata:
  name: ml
spec:
  monthlyUSD: "500.00"
  selector:
    team: ml
"""


@dataclass
class Gateway:
    url: str
    viewer_token: str
    books: Books


@pytest_asyncio.fixture(scope="module")
async def books(nc: NATS) -> AsyncIterator[Books]:
    books = Books(nc)
    subs = await serve_accounts(nc, books)
    yield books
    for sub in subs:
        await sub.unsubscribe()


@pytest_asyncio.fixture
async def gateway(nc: NATS, unique: str, books: Books) -> AsyncIterator[Gateway]:
    """A gateway that knows projects and tokens, with the project ``unique`` and a viewer of it."""
    principals = Principals(nc, pepper=b"cli-billing-pepper", cache_ttl_s=0.2)
    server = ApiServer(build_app(stores_for(nc), admin_token=TOKEN, principals=principals), "127.0.0.1", 0)
    await server.start()
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as admin:
            assert (
                await admin.post(f"{V1}/projects", json={"metadata": {"name": unique}})
            ).status_code == 201
            spec = {"principal": "vera", "roles": {unique: "viewer"}}
            minted = await admin.post(f"{V1}/tokens", json={"spec": spec})
            assert minted.status_code == 201, minted.text
        yield Gateway(server.url, minted.json()["secret"], books)
    finally:
        await server.stop()


class Cli:
    def __init__(self, url: str, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url, self.namespace, self.capsys = url, namespace, capsys

    async def __call__(self, *argv: str, token: str = TOKEN) -> tuple[int, str, str]:
        self.capsys.readouterr()
        args = ["--server", self.url, "--token", token, "-n", self.namespace, *argv]
        code = await asyncio.to_thread(main, args)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def nodus(gateway: Gateway, unique: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(gateway.url, unique, capsys)


def balance(out: str, name: str) -> str:
    """The USD column of one balance row of `nodus account`."""
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0] == name:
            return cells[1]
    raise AssertionError(f"no {name} row in:\n{out}")


async def test_grant_revoke_and_read_the_account(nodus: Cli, gateway: Gateway, unique: str) -> None:
    code, out, err = await nodus("credits", "grant", "$100", "--id", "welcome", "--note", "first credits")
    assert code == 0, err
    assert out.startswith(f"granted $100.00 to project {unique} (id welcome;")
    assert balance(out, "granted") == "$100.00" and balance(out, "available") == "$100.00"
    # The same id again counts once.
    code, out, _ = await nodus("credits", "grant", "100", "--id", "welcome")
    assert code == 0 and balance(out, "granted") == "$100.00"

    code, out, err = await nodus("credits", "revoke", "250.00")
    assert code == 1 and out == ""
    assert (
        "error: " in err
        and "fix: " in err
        and "docs: https://docs.nodus.dev/errors/InsufficientCredits" in err
    )
    code, out, _ = await nodus("credits", "revoke", "40")
    assert code == 0 and out.startswith(f"revoked $40.00 from project {unique}")

    code, out, _ = await nodus("account")
    assert code == 0 and out.startswith(f"Account of project {unique}")
    assert [balance(out, b) for b in ("granted", "available", "held", "spent", "unbilled")] == [
        "$60.00", "$60.00", "$0.00", "$0.00", "$0.00",
    ]  # fmt: skip
    code, out, _ = await nodus("account", "-o", "json")
    assert code == 0 and json.loads(out)["status"]["grantedUSD"] == "60.00"

    # A viewer reads the account; only the cluster admin grants.
    code, out, _ = await nodus("account", token=gateway.viewer_token)
    assert code == 0 and balance(out, "granted") == "$60.00"
    code, _, err = await nodus("credits", "grant", "1", token=gateway.viewer_token)
    assert code == 1 and "is forbidden" in err and "cluster admin" in err


async def test_a_bad_amount_prints_the_field_and_the_fix(nodus: Cli) -> None:
    code, out, err = await nodus("credits", "grant", "ten dollars")
    assert code == 1 and out == ""
    assert "amountUSD: " in err and "fix: " in err


async def test_usage_and_invoice_without_charges(nodus: Cli, unique: str) -> None:
    code, out, err = await nodus("usage", "--month", MONTH)
    assert (code, out) == (0, "") and f"No usage found in {unique} namespace in {MONTH}." in err
    code, out, _ = await nodus("usage", "-o", "csv")
    assert code == 0 and out.startswith("month,job,attempt,sweep,offering,") and out.count("\n") == 1
    code, out, _ = await nodus("invoice", MONTH)
    assert code == 0 and out.splitlines()[-1].split() == ["TOTAL", "0", "0.000000", "$0.00", "$0.00"]
    code, out, err = await nodus("invoice", "November")
    assert code == 1 and "YYYY-MM" in err


async def charge(books: Books, project: str) -> None:
    """Two cells of a Sweep and a Job of its own, charged as billing's metering charges them."""
    ops: list[Op] = [
        Grant(grant_id="seed", project=project, amount_micros=50_000_000),
        PutSweep(name="lr@us", project=project, generation=1),
        PutJob(name="lr-0@u0", project=project, generation=1, sweep="lr@us"),
        PutJob(name="lr-1@u1", project=project, generation=1, sweep="lr@us"),
        PutJob(name="eval@u2", project=project, generation=1),
    ]
    runs = (
        ("lr-0@u0", "lr-0-u0-0-a1", "h100-x1", 2_500_000, 3_600_000, 2_500_000),
        ("lr-1@u1", "lr-1-u1-0-a1", "h100-x1", 2_500_000, 1_800_000, 1_250_000),
        ("eval@u2", "eval-u2-0-a1", "a100-x1", 1_200_000, 900_000, 300_000),
    )
    for i, (job, attempt, offering, rate, millis, amount) in enumerate(runs):
        at = AT_MS + i * 60_000  # placed one after the other: usage lists them in that order
        usage = Usage(
            attempt=attempt,
            offering=offering,
            pricebook_version="v1",
            rate_micros_per_hour=rate,
            billed_millis=millis,
            segments={"Running": amount},
        )
        ops += [
            PlaceHold(
                hold_id=attempt,
                job=job,
                amount_micros=amount,
                funded_until_ms=at + 7_200_000,
                at_ms=at,
                rate_micros_per_hour=rate,
            ),
            Capture(hold_id=attempt, amount_micros=amount, usage=usage),
        ]
    applied = await books.apply(project, ops)
    assert all(r is not None and r.ok for r in applied.results), applied.results


async def test_usage_and_invoice_with_charges(nodus: Cli, gateway: Gateway, unique: str) -> None:
    await charge(gateway.books, unique)
    code, out, err = await nodus("usage", "--month", MONTH)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].split() == [
        "MONTH",
        "SWEEP",
        "JOB",
        "ATTEMPT",
        "OFFERING",
        "RATE/H",
        "BILLED",
        "COST",
        "COVERED",
    ]
    assert lines[1].split() == [
        MONTH,
        "lr",
        "lr-0",
        "lr-0-u0-0-a1",
        "h100-x1",
        "$2.50",
        "3600.000s",
        "$2.50",
        "$0.00",
    ]
    assert lines[-1] == "total charged: $4.05"
    code, out, _ = await nodus("usage", "--month", MONTH, "-o", "csv")
    rows = out.splitlines()
    assert code == 0 and len(rows) == 4
    assert rows[3] == f"{MONTH},eval,eval-u2-0-a1,,a100-x1,v1,1.20,900.000,,,0.30,0.00,0.30,0.00,0.00,0.00"
    code, out, _ = await nodus("usage", "-o", "json")
    assert code == 0 and [i["costUSD"] for i in json.loads(out)["items"]] == ["2.50", "1.25", "0.30"]

    code, out, _ = await nodus("invoice", MONTH)
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == f"Invoice of project {unique} for {MONTH}"
    # Lines by name: the Job "eval", then the Sweep "lr" (its two cells in one line).
    assert lines[3].split() == ["-", "eval", "a100-x1", "$1.20", "1", "0.250000", "$0.30", "$0.00"]
    assert lines[4].split() == ["lr", "-", "h100-x1", "$2.50", "2", "1.500000", "$3.75", "$0.00"]
    assert lines[5].split() == ["TOTAL", "3", "1.750000", "$4.05", "$0.00"]
    code, out, _ = await nodus("invoice", MONTH, "-o", "csv")
    assert code == 0 and out.splitlines()[-1] == "TOTAL,,,,3,1.750000,4.05,0.00"
    code, out, _ = await nodus("invoice", MONTH, "-o", "json")
    assert code == 0 and json.loads(out)["totalUSD"] == "4.05"

    code, out, _ = await nodus("account")
    assert balance(out, "spent") == "$4.05" and balance(out, "available") == "$45.95"


async def test_budgets_through_apply_get_describe_delete(nodus: Cli, tmp_path: Path) -> None:
    manifest = tmp_path / "budget.yaml"
    manifest.write_text(BUDGET_YAML)
    code, out, err = await nodus("apply", "-f", str(manifest))
    assert (code, out.strip()) == (0, "budget.nodus.dev/ml created"), err
    code, out, _ = await nodus("apply", "-f", str(manifest))
    assert (code, out.strip()) == (0, "budget.nodus.dev/ml unchanged")

    code, out, _ = await nodus("get", "budgets")
    header, row = out.strip().splitlines()
    assert code == 0 and header.split() == ["NAME", "MONTHLY", "USED", "MONTH", "SELECTOR", "AGE"]
    assert row.split()[:5] == ["ml", "$500.00", "-", "-", "team=ml"]
    code, out, _ = await nodus("get", "bud", "ml", "-o", "json")
    assert code == 0 and json.loads(out)["spec"] == {"monthlyUSD": "500.00", "selector": {"team": "ml"}}
    code, out, _ = await nodus("describe", "budget", "ml")
    assert code == 0 and "Monthly:" in out and "$500.00" in out and "team=ml" in out

    bad = tmp_path / "bad.yaml"
    bad.write_text(BUDGET_YAML.replace('"500.00"', '"-5"').replace("name: ml", "name: bad"))
    code, _, err = await nodus("apply", "-f", str(bad))
    assert code == 1 and "spec.monthlyUSD: " in err

    code, out, _ = await nodus("delete", "budget", "ml")
    assert code == 0 and out.strip() == "budget.nodus.dev/ml deleted"
