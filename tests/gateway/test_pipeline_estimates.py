"""A Pipeline's dry run and estimate (issue #22, ADR-0031): every stage estimated as the Job or Sweep it
creates, the money summed, the warnings and blocking reasons of each stage led by its name, the shared cap
compared with the sum, and ``status.estimatedDuration`` the critical path through ``dependsOn``.

The scheduler's and billing's estimate endpoints are served in-process on the real subjects, over the
session's real NATS; each stage's own figures are asked through the API as a Job's or a Sweep's dry run, so
the Pipeline's are checked against what the gateway answers for its parts. The pure combination
(:mod:`nodus_gateway.chaining`) is tested at the end.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from nodus_gateway.chaining import StageEstimate, combine, critical_path, rerooted, stage_time
from nodus_schema.costs import DurationBand, Estimate, USDBand
from nodus_schema.estimating import RATE_CEILING_ANNOTATION, SlotPlan
from nodus_schema.quantities import format_duration, micros_to_usd, parse_duration, usd_to_micros
from tests.gateway.conftest import failure

API = "/apis/nodus.dev/v1"
DRY = {"dryRun": "All"}
ORDER = ("prepare", "grid", "train", "evaluate")


def path(namespace: str, plural: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/{plural}", *rest])


def job(duration: str, **extra: Any) -> dict[str, Any]:
    return {
        "image": "ghcr.io/acme/train:1.0",
        "expectedDuration": duration,
        "resources": {"gpu": "H100:1"},
        "placement": {"regions": ["us"]},
        "outputs": [{"name": "out", "path": "/nodus/outputs/out"}],
        **extra,
    }


GRID = {
    "maxParallel": 2,
    "matrix": {"params": {"LR": ["0.1", "0.03", "0.01", "0.003", "0.001", "0.0003"]}},
}


def reads(stage: str) -> dict[str, Any]:
    return {"inputs": [{"name": "prev", "fromStage": {"stage": stage, "output": "out"}}]}


def pipeline(name: str, train_gpu: str = "H100:1", **spec: Any) -> dict[str, Any]:
    """prepare (20m) -> grid (6 cells of 30m, 2 at a time) -> train (1h, the best cell) -> evaluate (10m)."""
    stages = [
        {"name": "prepare", "template": {"job": job("20m")}},
        {
            "name": "grid",
            "dependsOn": ["prepare"],
            "template": {"sweep": {**GRID, "template": {"spec": job("30m", **reads("prepare"))}}},
        },
        {
            "name": "train",
            "dependsOn": ["grid"],
            "fromBest": {"stage": "grid", "by": "Cost"},
            "template": {"job": job("1h", resources={"gpu": train_gpu}, **reads("grid"))},
        },
        {"name": "evaluate", "dependsOn": ["train"], "template": {"job": job("10m", **reads("train"))}},
    ]
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {"stages": stages, **spec},
    }


def alone(name: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


async def parts(api: httpx.AsyncClient, namespace: str) -> dict[str, dict[str, Any]]:
    """Each stage's estimate, as the gateway answers a dry run of it as a Job or Sweep on its own (without
    its fromStage inputs, which only a stage may have and which cost nothing)."""
    specs = {
        "prepare": ("jobs", "Job", job("20m")),
        "grid": ("sweeps", "Sweep", {**GRID, "template": {"spec": job("30m")}}),
        "train": ("jobs", "Job", job("1h")),
        "evaluate": ("jobs", "Job", job("10m")),
    }
    out: dict[str, dict[str, Any]] = {}
    for stage, (plural, kind, spec) in specs.items():
        resp = await api.post(path(namespace, plural), json=alone(stage, kind, spec), params=DRY)
        assert resp.status_code == 201, resp.text
        out[stage] = resp.json()["status"]["estimate"]
    return out


def total(estimates: dict[str, dict[str, Any]], band: str, which: str) -> str:
    return micros_to_usd(sum(usd_to_micros(e[band][which]) for e in estimates.values()))


# -- through the API -----------------------------------------------------------------------------------------


async def test_a_dry_run_sums_the_stages_and_names_the_critical_path(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    resp = await api.post(path(unique, "pipelines"), json=pipeline("tune"), params=DRY)
    assert resp.status_code == 201, resp.text
    status = resp.json()["status"]
    e = status["estimate"]
    each = await parts(api, unique)
    assert e["costUSD"] == {"p50": total(each, "costUSD", "p50"), "p90": total(each, "costUSD", "p90")}
    assert e["overheadUSD"] == {
        "p50": total(each, "overheadUSD", "p50"),
        "p90": total(each, "overheadUSD", "p90"),
    }
    assert e["rateUSDPerHour"] == max((x["rateUSDPerHour"] for x in each.values()), key=usd_to_micros)
    assert e["pricebookVersion"] == each["prepare"]["pricebookVersion"] and e["validUntil"]
    assert "blockingReasons" not in e
    assert resp.headers["etag"].startswith(f'"e1:2990000:{e["pricebookVersion"]}:')

    # The critical path is the chain itself: each stage's cold start and run, the grid's six cells in
    # three waves of two (the startup band is the stages' own, as their dry runs answer it).
    cold = {s: each[s]["startup"]["cold"] for s in ORDER}
    runs = {"prepare": 20, "grid": 30, "train": 60, "evaluate": 10}
    waves = {"prepare": 1, "grid": 3, "train": 1, "evaluate": 1}

    def along(which: str, factor: float) -> str:
        took = sum(
            (
                waves[s] * (parse_duration(cold[s][which]) + timedelta(minutes=runs[s] * factor))
                for s in ORDER
            ),
            timedelta(0),
        )
        return format_duration(took)

    p50, p90 = along("p50", 1), along("p90", 1.5)  # a declared duration's p90 is 1.5 times it
    assert status["estimatedDuration"] == {"p50": p50, "p90": p90}
    critical = [w for w in e["warnings"] if w["code"] == "CriticalPath"]
    assert len(critical) == 1
    assert critical[0]["message"].startswith(f"prepare -> grid -> train -> evaluate: p50 {p50}, p90 {p90}.")

    # Every stage's warnings, led by the stage's name, in stage order.
    staged = [w for w in e["warnings"] if w["code"] != "CriticalPath"]
    assert [w["message"].split(":")[0] for w in staged] == [
        f"stage {s}" for s in ORDER for _ in each[s]["warnings"]
    ]
    assert [w["code"] for w in staged] == [w["code"] for s in ORDER for w in each[s]["warnings"]]
    failure(await api.get(path(unique, "pipelines", "tune")), 404, "NotFound")  # a dry run stores nothing


async def test_a_create_stores_the_estimate_and_the_critical_path(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    dry = (await api.post(path(unique, "pipelines"), json=pipeline("p"), params=DRY)).json()["status"]
    resp = await api.post(path(unique, "pipelines"), json=pipeline("p"))
    assert resp.status_code == 201, resp.text
    assert "warning" not in resp.headers
    stored = (await api.get(path(unique, "pipelines", "p"))).json()["status"]
    assert stored["estimatedDuration"] == dry["estimatedDuration"]
    assert stored["estimate"]["costUSD"] == dry["estimate"]["costUSD"]
    assert "duration" not in stored["estimate"]  # the carrier's band is estimatedDuration, not the estimate's


async def test_the_shared_cap_is_compared_with_the_sum(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    data = pipeline("capped", maxCostUSD="1")
    data["spec"]["stages"][0]["template"]["job"]["maxCostUSD"] = "0.5"  # the prepare Job's own cap
    resp = await api.post(path(unique, "pipelines"), json=data, params=DRY)
    assert resp.status_code == 201, resp.text
    e = resp.json()["status"]["estimate"]
    warned = {w["code"]: w["message"] for w in e["warnings"] if not w["message"].startswith("stage ")}
    p50 = e["costUSD"]["p50"]
    assert warned["MaxCostBelowEstimate"].startswith(
        f"spec.maxCostUSD 1.00 is likely to be reached (p50 cost {p50} of every stage together)"
    )
    # A stage's own cap, as billing words it, on the stage's field.
    (own,) = [
        w for w in e["warnings"] if w["code"] == "MaxCostBelowEstimate" and w["message"].startswith("stage")
    ]
    assert own["message"].startswith("stage prepare: spec.stages[0].template.job.maxCostUSD 0.50 is likely")


async def test_a_stage_blocked_by_capacity_blocks_the_create(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    data = pipeline("blocked", train_gpu="B200:1")
    resp = await api.post(path(unique, "pipelines"), json=data, params=DRY)
    assert resp.status_code == 201, resp.text
    status = resp.json()["status"]
    (reason,) = status["estimate"]["blockingReasons"]
    assert reason["code"] == "CapacityUnavailable" and reason["message"].startswith("stage train: ")
    assert "estimatedDuration" not in status  # the blocked stage has no plan to time
    refused = failure(await api.post(path(unique, "pipelines"), json=data), 503, "CapacityUnavailable")
    assert refused["message"] == reason["message"]
    failure(await api.get(path(unique, "pipelines", "blocked")), 404, "NotFound")


async def test_a_name_the_catalog_does_not_know_is_a_422_on_the_stage(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    data = pipeline("typo")
    data["spec"]["stages"][1]["template"]["sweep"]["template"]["spec"]["resources"] = {"gpu": "H1000:1"}
    out = failure(await api.post(path(unique, "pipelines"), json=data, params=DRY), 422, "Invalid")
    (cause,) = out["details"]["causes"]
    assert cause["field"].startswith("spec.stages[1].template.sweep.template.spec.resources.gpu")
    assert cause["reason"] == "FieldValueNotSupported" and "H100" in cause["message"]


async def test_if_match_binds_the_create_to_the_dry_run(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    dry = await api.post(path(unique, "pipelines"), json=pipeline("bound"), params=DRY)
    etag = dry.headers["etag"]
    changed = pipeline("bound", maxCostUSD="100")
    failure(
        await api.post(path(unique, "pipelines"), json=changed, headers={"If-Match": etag}),
        412,
        "PreconditionFailed",
    )
    resp = await api.post(path(unique, "pipelines"), json=pipeline("bound"), headers={"If-Match": etag})
    assert resp.status_code == 201, resp.text
    # 2.99 $/h (the stages' highest rate) + 10 %: the ceiling the sweep controller passes to the children.
    assert resp.json()["metadata"]["annotations"][RATE_CEILING_ANNOTATION] == "3289000"


# -- the pure combination ------------------------------------------------------------------------------------


def slot(run: str, boot: str = "0s", cells: int = 1, first: int = 0, **kw: Any) -> SlotPlan:
    band = parse_duration(run)
    p90 = format_duration(band * 2)
    return SlotPlan(
        label="x",
        cells=cells,
        first_cell=first,
        offering="o",
        run=DurationBand(p50=run, p90=p90),
        boot=DurationBand(p50=boot, p90=boot),
        **kw,
    )


def stage(name: str, *deps: str, run: str = "1h", **kw: Any) -> StageEstimate:
    cost = kw.pop("cost", "1")
    return StageEstimate(
        name=name,
        kind=kw.pop("kind", "Job"),
        at=f"spec.stages[0].template.{kw.pop('where', 'job')}",
        depends_on=deps,
        estimate=Estimate(cost_usd=USDBand(p50=cost, p90=cost), rate_usd_per_hour="2"),
        slots=kw.pop("slots", (slot(run),)),
        **kw,
    )


def test_the_longest_chain_of_a_diamond_wins() -> None:
    stages = [
        stage("a", run="10m"),
        stage("b", "a", run="2h"),
        stage("c", "a", run="1h"),
        stage("d", "b", "c"),
    ]
    times = {s.name: stage_time(s, "p50") or timedelta(0) for s in stages}
    assert critical_path(stages, times) == (timedelta(hours=3, minutes=10), ("a", "b", "d"))
    e = combine(stages, max_cost_usd="10")
    assert e.duration == DurationBand(p50="3h10m0s", p90="6h20m0s")
    assert e.cost_usd == USDBand(p50="4.00", p90="4.00")
    assert [w.code for w in e.warnings] == ["CriticalPath"]  # 10 is above the sum: no cap warning
    assert e.plain() == Estimate(**{f: getattr(e, f) for f in Estimate.__struct_fields__})


def test_the_p50_and_p90_may_take_different_chains() -> None:
    # b is long at the median, c has the long tail.
    b = stage("b", "a", slots=(SlotPlan(label="b", offering="o", run=DurationBand(p50="2h", p90="2h")),))
    c = stage("c", "a", slots=(SlotPlan(label="c", offering="o", run=DurationBand(p50="1h", p90="5h")),))
    e = combine([stage("a", run="0s"), b, c])
    critical = e.warnings[-1].message or ""
    assert critical.startswith("a -> c: p50 2h0m0s, p90 5h0m0s (the p50's longest chain is a -> b)")


def test_a_sweep_stage_runs_its_cells_max_parallel_at_a_time() -> None:
    # 5 cells of 1h (with 10m starts) two at a time: three waves; an index of 2 completions one at a time
    # takes two rounds.
    grid = stage("g", kind="Sweep", where="sweep", max_parallel=2, slots=(slot("1h", "10m", cells=5),))
    assert stage_time(grid, "p50") == 3 * timedelta(hours=1, minutes=10)
    waved = stage("j", slots=(slot("1h", completions=2, parallelism=1),), download=timedelta(minutes=5))
    assert stage_time(waved, "p50") == 2 * timedelta(hours=1, minutes=5)
    assert stage_time(stage("x", slots=(SlotPlan(label="x"),)), "p50") is None  # nothing matches: no plan


def test_stage_paths_move_under_the_stage() -> None:
    at = "spec.stages[1].template.sweep"
    assert rerooted("raise spec.maxParallel; move spec.template.spec.completeByTime", at) == (
        f"raise {at}.maxParallel; move {at}.template.spec.completeByTime"
    )
    assert rerooted("no inspec.tion or x.spec.y here", at) == "no inspec.tion or x.spec.y here"
