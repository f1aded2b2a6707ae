"""Dry runs and estimates through the API (ADR-031): ``?dryRun=All`` answers ``status.estimate`` and an
``ETag``; a create carries the estimate, is refused by a blocking reason, and binds to a dry-run with
``If-Match`` (the rate ceiling annotation; 412 for another spec). The scheduler's and billing's endpoints
are served in-process on the real subjects, over the session's real NATS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_billing.books import Books
from nodus_billing.holding import Grant, PutBudget
from nodus_billing.quoting import serve_quotes
from nodus_billing.standing import month_of
from nodus_gateway import estimating
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_schema.costs import Estimate
from nodus_schema.defaulting import default_job
from nodus_schema.estimating import ESTIMATE_SUBJECT, RATE_CEILING_ANNOTATION, estimate_etag
from nodus_schema.expanding import cell_job, expand
from nodus_schema.jobs import JobSpec
from nodus_schema.meta import ObjectMeta
from nodus_schema.sweeps import Sweep
from nodus_sweeps.reconciling import _bound
from tests.gateway.conftest import failure

API = "/apis/nodus.dev/v1"
DRY = {"dryRun": "All"}
SXM = {"type": ["H100-SXM-80G"], "exact": True, "count": 1}
PRICEBOOK = "2026-11-30.1"


def jobs(namespace: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/jobs", *rest])


def sweeps(namespace: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/sweeps", *rest])


def job_spec(gpu: Any = None, **kw: Any) -> dict[str, Any]:
    return {
        "image": "ghcr.io/acme/train:1.0",
        "expectedDuration": "2h",
        "resources": {"gpu": SXM if gpu is None else gpu},
        "placement": {"regions": ["us"]},
        **kw,
    }


def job_body(
    name: str, gpu: Any = None, annotations: dict[str, str] | None = None, **kw: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": meta, "spec": job_spec(gpu, **kw)}


def sweep_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name},
        "spec": {
            "maxParallel": 2,
            "matrix": {"gpu": ["H100:1", "L4:1"], "params": {"LR": ["0.1", "0.01"]}},
            "template": {"kind": "Job", "spec": {"image": "x", "expectedDuration": "30m"}},
        },
    }


# -- dry run ---------------------------------------------------------------------------------------


async def test_a_dry_run_answers_the_estimate_and_its_etag_and_stores_nothing(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    resp = await api.post(jobs(unique), json=job_body("train"), params=DRY)
    assert resp.status_code == 201, resp.text
    obj = resp.json()
    assert (obj["spec"]["backoffLimit"], obj["spec"]["placement"]["queueTimeout"]) == (6, "24h")  # defaulted
    e = obj["status"]["estimate"]
    assert (e["rateUSDPerHour"], e["pricebookVersion"]) == ("2.99", PRICEBOOK)
    # The first hold is billing's ten-minute window at 2.99 $/h (0.4983333…, rounded up), not the run's.
    assert (e["costUSD"]["p50"], e["holdUSD"]) == ("6.079667", "0.498334")
    assert e["validUntil"] and "blockingReasons" not in e
    assert "BalanceNotChecked" in [w["code"] for w in e["warnings"]]
    # The ETag is the estimate's, over the spec as it would be stored (defaulted).
    spec = msgspec.convert(obj["spec"], JobSpec)
    assert resp.headers["etag"] == estimate_etag(msgspec.convert(e, Estimate), spec)
    assert resp.headers["etag"].startswith(f'"e1:2990000:{PRICEBOOK}:')
    assert "warning" not in resp.headers
    failure(await api.get(jobs(unique, "train")), 404, "NotFound")


async def test_a_dry_run_of_a_sweep_prices_its_cells(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    resp = await api.post(sweeps(unique), json=sweep_body("lr"), params=DRY)
    assert resp.status_code == 201, resp.text
    e = resp.json()["status"]["estimate"]
    # The highest node rate of the groups: H100:1 takes H100 SXM in us under the default Balanced profile
    # (ADR-0014: the lowest rate per TFLOPS, 2.99/989), not the cheapest H100 (PCIe, 2.49/756).
    assert e["rateUSDPerHour"] == "2.99"
    assert e["placementPreview"]["offering"] == "h100-sxm-80g-x1-us"
    explain = e["placementPreview"]["explain"]
    assert explain.startswith("H100:1: h100-sxm-80g-x1-us") and "; L4:1: l4-x1-us" in explain  # every group
    assert resp.headers["etag"].startswith('"e1:2990000:')
    # Two cells at once (maxParallel 2), each held ten minutes at its rate: the two dearest, the H100s.
    assert (e["holdUSD"], e["concurrentHoldUSD"]) == ("0.498334", "0.996668")
    failure(await api.get(sweeps(unique, "lr")), 404, "NotFound")


async def test_blocking_reasons_are_the_dry_runs_answer_and_refuse_the_create(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    body = job_body("b200", gpu="B200:1")
    resp = await api.post(jobs(unique), json=body, params=DRY)
    assert resp.status_code == 201, resp.text
    (reason,) = resp.json()["status"]["estimate"]["blockingReasons"]
    assert reason["code"] == "CapacityUnavailable"
    assert resp.headers["etag"].startswith(f'"e1:-:{PRICEBOOK}:')  # no rate: blocked by capacity

    refused = failure(await api.post(jobs(unique), json=body), 503, "CapacityUnavailable")
    assert refused["message"] == reason["message"] and refused["fix"] == reason["fix"]
    failure(await api.get(jobs(unique, "b200")), 404, "NotFound")


async def test_a_cap_below_the_first_hold_is_the_hold_and_admits_the_create(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    # A cap is a ceiling (ADR-0023): 0.25 is below the ten-minute first hold (0.498334) and runs.
    resp = await api.post(jobs(unique), json=job_body("capped", maxCostUSD="0.25"))
    assert resp.status_code == 201, resp.text
    e = resp.json()["status"]["estimate"]
    assert "blockingReasons" not in e
    assert (e["holdUSD"], e["concurrentHoldUSD"]) == ("0.25", "0.25")
    assert "MaxCostLimitsHold" in [w["code"] for w in e["warnings"]]
    assert (await api.get(jobs(unique, "capped"))).status_code == 200


async def test_a_cap_below_the_minimum_charge_refuses_the_create(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    # One billing increment at 2.99 $/h: 1 s is 0.000830555… -> 0.000831.
    body = failure(
        await api.post(jobs(unique), json=job_body("capped", maxCostUSD="0.0008")), 403, "MaxCostReached"
    )
    assert body["message"] == (
        "spec.maxCostUSD 0.0008 is below the minimum charge 0.000831 of one index (one billing increment "
        "at its rate): not even one slot could start"
    )
    assert body["fix"] == (
        "Raise spec.maxCostUSD to at least 0.000831; any cap from there runs until it is spent, then "
        "suspends the object with MaxCostReached."
    )
    failure(await api.get(jobs(unique, "capped")), 404, "NotFound")


async def test_a_dry_run_answers_every_field_of_the_estimate(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    """A 10-minute H100 SXM Job, three indexes two at a time, on interruptible capacity if it pays."""
    spec = {
        "expectedDuration": "10m",
        "completions": 3,
        "parallelism": 2,
        "maxCostUSD": "1.00",
        "placement": {"regions": ["us"], "interruptible": "Allow"},
    }
    resp = await api.post(jobs(unique), json=job_body("short", **spec), params=DRY)
    assert resp.status_code == 201, resp.text
    e = resp.json()["status"]["estimate"]
    assert (e["rateUSDPerHour"], e["pricebookVersion"]) == ("1.495", PRICEBOOK)  # the interruptible rate
    assert e["placementPreview"] == {
        "explain": e["placementPreview"]["explain"],
        "interruptible": True,
        "offering": "h100-sxm-80g-x1-us",
        "regionClass": "us",
        "warmReuse": False,
    }
    assert "profile Balanced, interruptible Allow" in e["placementPreview"]["explain"]
    assert e["startup"] == {"cold": {"p50": "2m0s", "p90": "5m0s"}, "warm": {"p50": "10s", "p90": "30s"}}
    # Per index at 1.495 $/h: 10m is 0.249167 and the 2m boot 0.049834; p90 15m 0.37375, 5m 0.124584.
    assert e["costUSD"] == {"p50": "0.897003", "p90": "1.495002"}
    assert e["overheadUSD"] == {"p50": "0.149502", "p90": "0.373752"}
    # The first hold is the ten-minute window at 1.495 (0.249167), two indexes at once; 1 s is 0.000416.
    assert (e["holdUSD"], e["concurrentHoldUSD"], e["minimumChargeUSD"]) == (
        "0.249167",
        "0.498334",
        "0.000416",
    )
    assert "gangHoldUSD" not in e and "assemblyBoundUSD" not in e and "blockingReasons" not in e
    assert [w["code"] for w in e["warnings"]] == [
        "Queued",
        "ColdStart",
        "InterruptibleSelected",
        "MaxCostBelowEstimate",
        "BalanceNotChecked",
    ]
    assert all(w["message"] for w in e["warnings"])


async def test_a_dry_run_without_a_duration_or_history_says_what_it_assumed(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    body = job_body("guess")
    del body["spec"]["expectedDuration"]
    e = (await api.post(jobs(unique), json=body, params=DRY)).json()["status"]["estimate"]
    notes = {w["code"]: w["message"] for w in e["warnings"]}
    assert notes["NoHistory"].startswith("no run history for the Job: ")  # none in this namespace
    assert "default 1h0m0s per index (p90 1h30m0s)" in notes["DefaultDuration"]
    assert e["costUSD"]["p50"] == "3.089667"  # 1h at 2.99 + the 2m boot


# -- create ----------------------------------------------------------------------------------------


async def test_a_create_carries_its_estimate(api: httpx.AsyncClient, unique: str, endpoints: None) -> None:
    resp = await api.post(jobs(unique), json=job_body("train"))
    assert resp.status_code == 201, resp.text
    assert "etag" not in resp.headers and "warning" not in resp.headers
    assert resp.json()["status"]["estimate"]["rateUSDPerHour"] == "2.99"
    stored = (await api.get(jobs(unique, "train"))).json()
    assert stored["status"]["estimate"] == resp.json()["status"]["estimate"]
    # Billing quoted it: the cost billing writes first for a Job nothing was held for, stored with it.
    zero = {"totalUSD": "0.00", "heldUSD": "0.00", "rateUSDPerHour": "0.00", "final": False}
    assert stored["status"]["cost"] == resp.json()["status"]["cost"] == zero
    assert RATE_CEILING_ANNOTATION not in stored["metadata"].get("annotations", {})


async def test_a_create_bound_by_if_match_carries_the_rate_ceiling(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    dry = await api.post(jobs(unique), json=job_body("train"), params=DRY)
    etag = dry.headers["etag"]
    resp = await api.post(jobs(unique), json=job_body("train"), headers={"If-Match": etag})
    assert resp.status_code == 201, resp.text
    # 2.99 $/h + 10 %: h100-sxm-80g-x1-eu (3.289) is still allowed, nothing dearer is.
    assert resp.json()["metadata"]["annotations"] == {RATE_CEILING_ANNOTATION: "3289000"}
    assert resp.json()["status"]["estimate"]["rateUSDPerHour"] == "2.99"
    stored = (await api.get(jobs(unique, "train"))).json()
    assert stored["metadata"]["annotations"][RATE_CEILING_ANNOTATION] == "3289000"


async def test_a_binding_outlives_valid_until(api: httpx.AsyncClient, unique: str, endpoints: None) -> None:
    """The ETag of an estimate long expired still binds: validUntil is never compared at create."""
    dry = (await api.post(jobs(unique), json=job_body("late"), params=DRY)).json()
    expired = Estimate(
        rate_usd_per_hour="2.99", pricebook_version="2025-01-01.1", valid_until="2025-01-01T00:15:00Z"
    )
    etag = estimate_etag(expired, msgspec.convert(dry["spec"], JobSpec))
    resp = await api.post(jobs(unique), json=job_body("late"), headers={"If-Match": etag})
    assert resp.status_code == 201, resp.text
    assert resp.json()["metadata"]["annotations"][RATE_CEILING_ANNOTATION] == "3289000"


async def test_a_stale_tampered_or_foreign_etag_is_412(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    etag = (await api.post(jobs(unique), json=job_body("train"), params=DRY)).headers["etag"]
    cheaper = etag.replace(":2990000:", ":1000000:")  # a rate written by hand: the digest no longer agrees
    other_spec = job_body("train", expectedDuration="3h")  # the spec changed since the dry-run
    for headers, body in [
        ({"If-Match": cheaper}, job_body("train")),
        ({"If-Match": etag}, other_spec),
        ({"If-Match": f"W/{etag}"}, job_body("train")),
        ({"If-Match": '"some-other-etag"'}, job_body("train")),
        ({"If-Match": "*"}, job_body("train")),
    ]:
        refused = failure(await api.post(jobs(unique), json=body, headers=headers), 412, "PreconditionFailed")
        assert "dry-run again" in refused["message"]
        assert refused["fix"] == "Run the dry-run again and create with its new ETag."
    failure(await api.get(jobs(unique, "train")), 404, "NotFound")


async def test_users_cannot_set_the_rate_ceiling(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    mine = {RATE_CEILING_ANNOTATION: "999999999", "team": "ml"}
    resp = await api.post(jobs(unique), json=job_body("train", annotations=mine))
    assert resp.status_code == 201, resp.text
    assert resp.json()["metadata"]["annotations"] == {"team": "ml"}
    # Nor by an update: the stored value (here none) is kept.
    patch = {"metadata": {"annotations": {RATE_CEILING_ANNOTATION: "999999999"}}}
    merge = {"Content-Type": "application/merge-patch+json"}
    patched = await api.patch(jobs(unique, "train"), json=patch, headers=merge)
    assert patched.status_code == 200, patched.text
    assert patched.json()["metadata"]["annotations"] == {"team": "ml"}

    # A bound one keeps its ceiling through an update that tries to change it.
    etag = (await api.post(jobs(unique), json=job_body("bound"), params=DRY)).headers["etag"]
    assert (
        await api.post(jobs(unique), json=job_body("bound"), headers={"If-Match": etag})
    ).status_code == 201
    patched = await api.patch(jobs(unique, "bound"), json=patch, headers=merge)
    assert patched.json()["metadata"]["annotations"] == {RATE_CEILING_ANNOTATION: "3289000"}


async def test_a_sweep_binds_and_its_cells_inherit_the_ceiling(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    etag = (await api.post(sweeps(unique), json=sweep_body("lr"), params=DRY)).headers["etag"]
    resp = await api.post(sweeps(unique), json=sweep_body("lr"), headers={"If-Match": etag})
    assert resp.status_code == 201, resp.text
    assert resp.json()["metadata"]["annotations"] == {RATE_CEILING_ANNOTATION: "3289000"}  # 2.99 + 10 %
    assert resp.json()["status"]["estimate"]["rateUSDPerHour"] == "2.99"
    # The sweep controller copies it onto every cell Job it creates, with the Sweep's price book version.
    sweep = msgspec.convert(resp.json(), Sweep)
    cells = [_bound(sweep, default_job(cell_job(sweep, c))) for c in expand(sweep)]
    assert {c.metadata.annotations.get(RATE_CEILING_ANNOTATION) for c in cells} == {"3289000"}
    assert {c.status.estimate.pricebook_version for c in cells if c.status.estimate} == {PRICEBOOK}
    assert all(c.status.estimate is not None for c in cells)
    # An unbound Sweep's cells carry none.
    unbound = Sweep(metadata=ObjectMeta(name="x", namespace=unique), spec=sweep.spec)
    plain = default_job(cell_job(unbound, expand(unbound)[0]))
    assert RATE_CEILING_ANNOTATION not in _bound(unbound, plain).metadata.annotations


# -- the estimate services down --------------------------------------------------------------------


async def test_without_the_estimate_services_a_create_is_admitted_with_a_warning(
    api: httpx.AsyncClient, unique: str
) -> None:
    resp = await api.post(jobs(unique), json=job_body("train"))
    assert resp.status_code == 201, resp.text
    (warning,) = resp.headers.get_list("warning")
    assert warning.startswith(f'299 - "no estimate: nobody serves {ESTIMATE_SUBJECT}')
    assert "estimate" not in resp.json().get("status", {})
    assert "cost" not in resp.json().get("status", {})  # billing's to write: it did not answer
    assert (await api.get(jobs(unique, "train"))).status_code == 200


async def test_without_the_estimate_services_a_dry_run_is_503(api: httpx.AsyncClient, unique: str) -> None:
    body = failure(
        await api.post(jobs(unique), json=job_body("train"), params=DRY), 503, "ServiceUnavailable"
    )
    assert body["message"].startswith(f"no estimate: nobody serves {ESTIMATE_SUBJECT}")
    assert body["details"]["retryAfterSeconds"] == 1


async def test_services_that_do_not_answer_in_time(
    api: httpx.AsyncClient, unique: str, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscriber that never answers: the dry run is a 504 Timeout; a create goes on without."""
    monkeypatch.setattr(estimating, "ESTIMATE_TIMEOUT_S", 0.2)

    async def silent(_: Any) -> None:
        await asyncio.sleep(0)

    sub = await nc.subscribe(ESTIMATE_SUBJECT, cb=silent)
    try:
        failure(await api.post(jobs(unique), json=job_body("train"), params=DRY), 504, "Timeout")
        resp = await api.post(jobs(unique), json=job_body("train"))
        assert resp.status_code == 201, resp.text
        (warning,) = resp.headers.get_list("warning")
        assert "did not answer within 0.2s" in warning
    finally:
        await sub.unsubscribe()


async def test_after_no_answer_creates_pause_asking_and_then_ask_again(
    api: httpx.AsyncClient, unique: str, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the services are down, creates do not ask each time; once the pause is over, or once a dry
    run got an answer, they ask again."""
    asked = 0

    async def count(msg: Any) -> None:
        nonlocal asked
        asked += 1
        await msg.respond(b"")  # not an EstimateReply: this test counts questions, not answers

    first = await api.post(jobs(unique), json=job_body("a"))  # nobody serves: the pause starts
    assert "nobody serves" in first.headers["warning"]
    sub = await nc.subscribe(ESTIMATE_SUBJECT, cb=count)
    try:
        second = await api.post(jobs(unique), json=job_body("b"))
        assert second.status_code == 201, second.text
        assert "nobody serves" in second.headers["warning"]  # the pause's answer: nobody was asked
        assert asked == 0
        monkeypatch.setattr(estimating, "UNANSWERED_PAUSE_S", 0.0)
        estimating.resume(nc)  # as the pause's end would
        third = await api.post(jobs(unique), json=job_body("c"))
        assert third.status_code == 201, third.text
        assert asked == 1
    finally:
        await sub.unsubscribe()


async def test_kinds_without_an_estimate_ask_nobody(api: httpx.AsyncClient, unique: str) -> None:
    spec = {"type": "S3", "s3": {"endpoint": "http://127.0.0.1:8333", "bucket": "local"}}
    conn = {"apiVersion": "nodus.dev/v1", "kind": "Connection", "metadata": {"name": "c"}, "spec": spec}
    resp = await api.post(f"{API}/namespaces/{unique}/connections", json=conn, params=DRY)
    assert resp.status_code == 201, resp.text  # no estimate services here, and none needed
    assert "etag" not in resp.headers and "warning" not in resp.headers


# -- balances (issue #7): the quote reads the project's books -----------------------------------------


@pytest_asyncio.fixture
async def booked(nc: NATS) -> AsyncIterator[Books]:
    """The estimate endpoints with billing's books: quotes check credits and Budgets."""
    books = Books(nc)
    subs = [await serve_estimates(nc, load_catalog()), await serve_quotes(nc, books=books)]
    yield books
    for sub in subs:
        await sub.unsubscribe()


async def test_a_create_the_project_cannot_fund_is_refused_with_insufficient_credits(
    api: httpx.AsyncClient, unique: str, booked: Books
) -> None:
    # $0.0005 is less than the least a run can start with: 1 s at 2.99 $/h, 0.000831.
    await booked.apply(unique, [Grant(grant_id="g", project=unique, amount_micros=500)])
    resp = await api.post(jobs(unique), json=job_body("poor"), params=DRY)
    assert resp.status_code == 201, resp.text
    e = resp.json()["status"]["estimate"]
    (reason,) = e["blockingReasons"]
    assert reason["code"] == "InsufficientCredits"
    assert reason["message"] == (
        f"project {unique} has $0.0005 of credits not held; the least a run can start with is $0.000831"
    )
    assert "nodus credits grant" in reason["fix"] and "at least $0.000331" in reason["fix"]  # 831 - 500
    codes = [w["code"] for w in e.get("warnings", [])]
    assert "BalanceNotChecked" not in codes and "CreditsLimitHold" not in codes
    body = failure(await api.post(jobs(unique), json=job_body("poor")), 403, "InsufficientCredits")
    assert "nodus credits grant" in body["fix"]
    failure(await api.get(jobs(unique, "poor")), 404, "NotFound")  # nothing stored

    # $0.2005: the least fits, the ten-minute hold (0.498334) does not: admitted, the hold sized to it.
    await booked.apply(unique, [Grant(grant_id="g2", project=unique, amount_micros=200_000)])
    resp = await api.post(jobs(unique), json=job_body("poor"))
    assert resp.status_code == 201, resp.text
    e = resp.json()["status"]["estimate"]
    assert "blockingReasons" not in e
    (note,) = [w for w in e["warnings"] if w["code"] == "CreditsLimitHold"]
    assert note["message"] == (
        f"project {unique} has $0.2005 of credits not held, less than the first hold $0.498334: the run "
        "starts with what is left and is suspended with InsufficientCredits when it is spent"
    )
    assert (e["holdUSD"], e["concurrentHoldUSD"]) == ("0.2005", "0.2005")  # the hold billing will place

    # $2.2005: the whole first hold fits, and nothing is said about credits.
    await booked.apply(unique, [Grant(grant_id="g3", project=unique, amount_micros=2_000_000)])
    resp = await api.post(jobs(unique), json=job_body("rich"))
    assert resp.status_code == 201, resp.text
    e = resp.json()["status"]["estimate"]
    assert "blockingReasons" not in e
    assert "CreditsLimitHold" not in [w["code"] for w in e["warnings"]]


async def test_a_project_budget_the_least_does_not_fit_refuses_the_create(
    api: httpx.AsyncClient, unique: str, booked: Books
) -> None:
    # A Budget of $0.0005 leaves less than the least a run can start with (1 s at 2.99 $/h, 0.000831).
    await booked.apply(
        unique,
        [
            Grant(grant_id="g", project=unique, amount_micros=100_000_000),
            PutBudget(name="monthly@u1", project=unique, monthly_micros=500, generation=1),
        ],
    )
    before = month_of(int(time.time() * 1000))
    resp = await api.post(jobs(unique), json=job_body("small"), params=DRY)
    months = {before, month_of(int(time.time() * 1000))}  # the quote's month (two, across a month's end)
    (reason,) = resp.json()["status"]["estimate"]["blockingReasons"]
    assert reason["code"] == "BudgetExceeded"
    assert reason["message"] in {
        f"Budget monthly allows $0.0005 in {month}; $0.00 is used or held and the least a run can start "
        "with is $0.000831"
        for month in months
    }
    assert (
        reason["fix"]
        == "Raise spec.monthlyUSD of Budget monthly to at least $0.000831, or wait for next month."
    )
    failure(await api.post(jobs(unique), json=job_body("small")), 403, "BudgetExceeded")
    failure(await api.get(jobs(unique, "small")), 404, "NotFound")

    # A Budget of $0.20: the least fits, the ten-minute hold (0.498334) does not: admitted with a warning.
    await booked.apply(
        unique, [PutBudget(name="monthly@u1", project=unique, monthly_micros=200_000, generation=2)]
    )
    before = month_of(int(time.time() * 1000))
    resp = await api.post(jobs(unique), json=job_body("small"))
    months = {before, month_of(int(time.time() * 1000))}
    assert resp.status_code == 201, resp.text
    e = resp.json()["status"]["estimate"]
    assert "blockingReasons" not in e
    (note,) = [w for w in e["warnings"] if w["code"] == "BudgetLimitsHold"]
    assert note["message"] in {
        f"Budget monthly leaves $0.20 in {month}, less than the first hold $0.498334: the run starts with "
        "what is left and is suspended with BudgetExceeded when it is spent"
        for month in months
    }
    assert e["holdUSD"] == "0.20"  # the hold billing will place under the Budget
