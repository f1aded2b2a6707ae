"""The Pipelines list and a Pipeline page in headless Chromium (issue #22): the stages in columns by depth,
each with its phase, cost, wall time and a link to its child, the best cell a stage took, the spend against
the one cap, and a status written while the page is open.

The Pipeline is created through the gateway and its status written into the ``pipelines`` bucket as the
controller writes it; the page reads it through the API and follows the watch. How the page reads a DAG
(``stages.js``) is also checked on the module itself.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import httpx
import msgspec
from nats.aio.client import Client as NATS
from selenium.webdriver.remote.webdriver import WebDriver

from nodus_kit.storing import ObjectStore
from nodus_schema.pipelines import Pipeline, PipelineStatus

from .conftest import Gateway, open_page, wait_for

V1 = "/apis/nodus.dev/v1"
CAP_USD = "4.00"

DAG_JS = """
return [...document.querySelectorAll('#dag .dag-col')].map(col => ({
  depth: Number(col.dataset.depth),
  stages: [...col.querySelectorAll('.stage')].map(s => {
    const link = s.querySelector('.stage-object a');
    const best = s.querySelector('.stage-best');
    return {
      name: s.dataset.stage,
      phase: s.dataset.phase,
      badge: s.querySelector('.phase').dataset.phase,
      cost: s.querySelector('.stage-cost').textContent,
      wall: s.querySelector('.stage-wall').textContent,
      object: s.querySelector('.stage-object').textContent,
      href: link ? link.getAttribute('href') : null,
      best: best ? best.textContent : null,
    };
  }),
}));
"""


def job(image: str = "ghcr.io/acme/x:1") -> dict[str, Any]:
    return {"job": {"image": image, "command": ["true"], "resources": {"gpu": "L4:1"}}}


def pipeline_body(name: str) -> dict[str, Any]:
    """prepare -> grid (a Sweep) -> train (fromBest) -> evaluate, which also waits for report."""
    grid = {
        "sweep": {
            "matrix": {"params": {"LR": ["0.1", "0.01"]}},
            "template": {"spec": {"image": "x", "command": ["true"], "resources": {"gpu": "L4:1"}}},
        }
    }
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "maxCostUSD": CAP_USD,
            "stages": [
                {"name": "prepare", "template": job()},
                {"name": "grid", "dependsOn": ["prepare"], "template": grid},
                {"name": "report", "dependsOn": ["prepare"], "template": job()},
                {
                    "name": "train",
                    "dependsOn": ["grid"],
                    "fromBest": {"stage": "grid", "by": "Throughput"},
                    "template": job(),
                },
                {"name": "evaluate", "dependsOn": ["train", "report"], "template": job()},
            ],
        },
    }


def running(name: str) -> PipelineStatus:
    return msgspec.convert(
        {
            "phase": "Running",
            "cost": {"totalUSD": "1.20"},
            "estimate": {"costUSD": {"p50": "2.10", "p90": "3.40"}},
            "estimatedDuration": {"p50": "1h10m", "p90": "1h45m"},
            "stages": [
                {
                    "name": "prepare",
                    "kind": "Job",
                    "object": f"{name}-prepare",
                    "phase": "Succeeded",
                    "costUSD": "0.10",
                    "wallSeconds": 60,
                },
                {
                    "name": "grid",
                    "kind": "Sweep",
                    "object": f"{name}-grid",
                    "phase": "Succeeded",
                    "costUSD": "0.80",
                    "wallSeconds": 720,
                },
                {
                    "name": "report",
                    "kind": "Job",
                    "object": f"{name}-report",
                    "phase": "Running",
                    "costUSD": "0.004",
                },
                {
                    "name": "train",
                    "kind": "Job",
                    "object": f"{name}-train",
                    "phase": "Running",
                    "costUSD": "0.296",
                    "wallSeconds": 300,
                    "fromBest": {
                        "stage": "grid",
                        "by": "Throughput",
                        "cell": 1,
                        "object": f"{name}-grid-1",
                        "params": {"LR": "0.01"},
                        "gpu": "L4:1",
                    },
                },
                {"name": "evaluate", "kind": "Job", "phase": "Waiting"},
            ],
        },
        PipelineStatus,
    )


def create_pipeline(api: httpx.Client, namespace: str, name: str) -> None:
    resp = api.post(f"{V1}/namespaces/{namespace}/pipelines", json=pipeline_body(name))
    assert resp.status_code == 201, resp.text


def write_status(
    namespace: str, name: str, status: PipelineStatus
) -> Callable[[NATS], Coroutine[Any, Any, None]]:
    """A coroutine factory for :meth:`Gateway.run`: the status written as the controller writes it."""

    async def write(nc: NATS) -> None:
        store = ObjectStore(nc, "pipelines", Pipeline)
        await store.mutate(namespace, name, lambda p: msgspec.structs.replace(p, status=status))

    return write


def dag(browser: WebDriver) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = browser.execute_script(DAG_JS)
    return result


def by_name(columns: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["name"]: {**s, "depth": c["depth"]} for c in columns for s in c["stages"]}


def live(browser: WebDriver) -> bool:
    return bool(browser.execute_script("return document.getElementById('live').dataset.state === 'live'"))


def test_the_pipeline_page_shows_stages_by_depth_and_follows_the_watch(
    browser: WebDriver, gateway: Gateway, api: httpx.Client, unique: str
) -> None:
    create_pipeline(api, unique, "flow")
    gateway.run(write_status(unique, "flow", running("flow")))

    open_page(browser, gateway, f"/pipelines/{unique}/flow")
    columns = wait_for(browser, lambda b: (d := dag(b)) and len(d) == 4 and d, "the DAG's four columns")
    assert [[s["name"] for s in c["stages"]] for c in columns] == [
        ["prepare"],
        ["grid", "report"],
        ["train"],
        ["evaluate"],
    ]
    stages = by_name(columns)
    assert {n: s["phase"] for n, s in stages.items()} == {
        "prepare": "Succeeded",
        "grid": "Succeeded",
        "report": "Running",
        "train": "Running",
        "evaluate": "Waiting",
    }
    assert stages["train"]["badge"] == "Running"
    assert (stages["grid"]["cost"], stages["grid"]["wall"]) == ("$0.80", "12m00s")
    assert (stages["report"]["cost"], stages["report"]["wall"]) == ("$0.004", "-")
    # Each child links to its own page: a Sweep stage to the Sweep's, a Job stage to the Job's.
    assert stages["grid"]["href"] == f"#/sweeps/{unique}/flow-grid"
    assert stages["train"]["href"] == f"#/jobs/{unique}/flow-train"
    assert (stages["evaluate"]["object"], stages["evaluate"]["href"]) == ("not created yet", None)
    assert stages["train"]["best"] == "best of grid by Throughput: cell 1 (LR=0.01, L4:1)"
    assert browser.find_element("id", "stages-done").text == "2/5"
    assert browser.find_element("id", "estimate-cost").text == "p50 $2.10 · p90 $3.40"
    assert browser.find_element("id", "estimate-duration").text == "p50 1h10m · p90 1h45m"
    assert browser.find_element("id", "cap-text").text == f"spent $1.20 of the ${CAP_USD} cap (30.0%)"

    # The page follows the watch: the controller writes that train succeeded and evaluate started.
    wait_for(browser, live, "the watch to be open")
    after = running("flow")
    moved = [
        msgspec.structs.replace(s, phase="Succeeded", cost_usd="0.33")
        if s.name == "train"
        else msgspec.structs.replace(s, phase="Running", object="flow-evaluate")
        if s.name == "evaluate"
        else s
        for s in after.stages
    ]
    total = "3.900001"
    gateway.run(
        write_status(
            unique,
            "flow",
            msgspec.structs.replace(
                after, stages=moved, cost=msgspec.structs.replace(after.cost, total_usd=total)
            ),
        )
    )

    def updated(b: WebDriver) -> dict[str, dict[str, Any]] | None:
        s = by_name(dag(b))
        return s if s.get("evaluate", {}).get("phase") == "Running" else None

    stages = wait_for(browser, updated, "evaluate to start without a reload")
    assert (stages["train"]["phase"], stages["train"]["cost"]) == ("Succeeded", "$0.33")
    assert stages["evaluate"]["href"] == f"#/jobs/{unique}/flow-evaluate"
    assert browser.find_element("id", "stages-done").text == "3/5"
    cap = browser.find_element("id", "cap")
    assert cap.get_attribute("class") == "cap high" and cap.get_attribute("data-permille") == "975"

    # A stage's link opens its child's page.
    browser.find_element("link text", "flow-grid").click()
    wait_for(browser, lambda b: b.current_url.endswith(f"#/sweeps/{unique}/flow-grid"), "the Sweep's route")


def test_the_pipelines_list_links_to_the_pipeline_page(
    browser: WebDriver, gateway: Gateway, api: httpx.Client, unique: str
) -> None:
    create_pipeline(api, unique, "flow")
    gateway.run(write_status(unique, "flow", running("flow")))

    open_page(browser, gateway, f"/pipelines/{unique}")
    row = wait_for(browser, lambda b: b.find_element("css selector", "#pipelines-table tr[data-name='flow']"))
    cells = [td.text for td in row.find_elements("tag name", "td")]
    assert cells[:6] == [unique, "flow", "Running", "2/5", "$1.20", f"${CAP_USD}"]
    assert "active" in browser.find_element("id", "nav-pipelines").get_attribute("class")
    row.find_element("link text", "flow").click()
    wait_for(browser, lambda b: len(dag(b)) == 4, "the Pipeline page from the list")
    assert browser.current_url.endswith(f"#/pipelines/{unique}/flow")


STAGES_JS = """
const done = arguments[arguments.length - 1];
import('/ui/stages.js').then((m) => {
  const p = {
    spec: {stages: [
      {name: 'a', template: {job: {}}},
      {name: 'b', dependsOn: ['a'], template: {sweep: {}}},
      {name: 'c', dependsOn: ['a', 'b'], template: {job: {}}, fromBest: {stage: 'b'}},
      {name: 'd', template: {job: {}}},
      {name: 'x', dependsOn: ['y'], template: {job: {}}},
      {name: 'y', dependsOn: ['x'], template: {job: {}}},
    ]},
    status: {stages: [{name: 'a', phase: 'Succeeded'}, {name: 'ghost', kind: 'Job', phase: 'Running'}]},
  };
  const views = m.stageViews(p);
  done({
    depths: views.map((v) => [v.name, v.kind, v.depth]),
    done: m.stagesDone(p),
    best: m.bestText(views[2]),
  });
}, (e) => done({error: String(e)}));
"""


def test_stages_are_read_at_their_depth(browser: WebDriver, gateway: Gateway) -> None:
    open_page(browser, gateway, "/pipelines")
    result = browser.execute_async_script(STAGES_JS)
    assert "error" not in result, result
    # c is under its deepest dependency (b), d has none, a cycle (refused by the gateway) stays drawable.
    assert result["depths"] == [
        ["a", "Job", 0],
        ["b", "Sweep", 1],
        ["c", "Job", 2],
        ["d", "Job", 0],
        ["x", "Job", 1],
        ["y", "Job", 0],
        ["ghost", "Job", 0],
    ]
    assert result["done"] == {"succeeded": 1, "total": 7}
    assert result["best"] == "best of b by Cost: not chosen yet"
