"""The Jobs list and a Job page in headless Chromium: cost by segment, attempts, checkpoints and the log.

The Job is created through the gateway; its status and its Attempts are written into their buckets as the
scheduler and billing write them, and its log lines are shipped into NODUS_LOGS by the node agent's real
LogShipper, so the page reads everything through the same API the CLI uses.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import msgspec
from nats.aio.client import Client as NATS
from selenium.webdriver.remote.webdriver import WebDriver

from nodus_agent.logshipping import LogShipper
from nodus_kit.storing import ObjectStore
from nodus_schema import Job
from nodus_schema.attempts import (
    JOB_LABEL,
    JOB_UID_LABEL,
    Attempt,
    AttemptSpec,
    AttemptStatus,
    CheckpointRecord,
    MountRecord,
    SourceRecord,
    attempt_name,
)
from nodus_schema.costs import Cost, CostSegments
from nodus_schema.messages import StartAttempt
from nodus_schema.meta import ObjectMeta

from .conftest import Gateway, open_page, wait_for

V1 = "/apis/nodus.dev/v1"
Write = Callable[[NATS], Coroutine[Any, Any, None]]


def job_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "image": "ghcr.io/acme/train:1.0",
            "command": ["python", "train.py"],
            "resources": {"gpu": "H100:1"},
        },
    }


def create_job(api: httpx.Client, namespace: str, name: str) -> str:
    resp = api.post(f"{V1}/namespaces/{namespace}/jobs", json=job_body(name))
    assert resp.status_code == 201, resp.text
    uid: str = resp.json()["metadata"]["uid"]
    return uid


CHECKPOINT = CheckpointRecord(
    sequence=3,
    uri="s3://ckpt/train/3.tar.zst",
    size_bytes=5 * 1024 * 1024,
    reason="Interval",
    time="2025-01-02T03:04:05Z",
)


def attempt(namespace: str, job: str, uid: str, n: int, status: AttemptStatus) -> Attempt:
    return Attempt(
        metadata=ObjectMeta(
            name=attempt_name(job, uid, 0, n),
            namespace=namespace,
            labels={JOB_LABEL: job, JOB_UID_LABEL: uid},
        ),
        spec=AttemptSpec(
            job=job,
            index=0,
            attempt=n,
            node=f"node-{n}",
            offering="h100-sxm-80g-x1-us",
            region_class="us",
            rate_micros_per_hour=2_490_000,
            pricebook_version="2025-01",
        ),
        status=status,
    )


COMMIT = "3f2a9c1b7d0e" + "5" * 28


def ran(namespace: str, job: str, uid: str, log_dir: Path) -> Write:
    """What a run leaves: a lost first attempt (after checkpoint 3), a second one restored from it that
    succeeded, their log lines, and the Job's status with its cost by segment."""

    async def write(nc: NATS) -> None:
        attempts = ObjectStore(nc, "attempts", Attempt)
        await attempts.create(
            attempt(
                namespace,
                job,
                uid,
                1,
                AttemptStatus(phase="Lost", reason="NodeLost", wall_millis=61_000, checkpoint=CHECKPOINT),
            )
        )
        await attempts.create(
            attempt(
                namespace,
                job,
                uid,
                2,
                AttemptStatus(
                    phase="Succeeded",
                    exit_code=0,
                    wall_millis=34_000,
                    units_per_second="420.5",
                    restored_from=CHECKPOINT,
                    source=SourceRecord(repo="https://github.com/acme/train.git", ref="v1", commit=COMMIT),
                    mounts=[
                        MountRecord(name="imagenet", mount_path="/data", revision=3, cache_hit=True),
                        MountRecord(name="home", kind="Workspace", mount_path="/nodus/inputs/vocab"),
                    ],
                ),
            )
        )
        for n, lines in (
            (1, ["step 1", "step 2 <b>not bold</b>"]),
            (2, ["restored from checkpoint 3", "done"]),
        ):
            name = attempt_name(job, uid, 0, n)
            path = log_dir / name / "log.txt"
            path.parent.mkdir(parents=True)
            path.write_text("".join(f"{line}\n" for line in lines))
            source = StartAttempt(
                namespace=namespace, job=job, attempt=name, index=0, attempt_no=n, node=f"node-{n}"
            )
            assert await LogShipper(nc, source, path).close(final=True)
        cost = Cost(
            total_usd="0.066250",
            by_segment=CostSegments(
                boot_usd="0.004150",
                running_usd="0.062100",
                restore_usd="0",
                teardown_usd="0.000000",
                covered_by_nodus=["Restore"],
            ),
            final=True,
        )
        status = {
            "phase": "Succeeded",
            "attempts": 2,
            "succeeded": 1,
            "wall_seconds": 95,
            "units_per_second": "420.5",
        }
        await ObjectStore(nc, "jobs", Job).mutate(
            namespace,
            job,
            lambda j: msgspec.structs.replace(
                j, status=msgspec.structs.replace(j.status, cost=cost, **status)
            ),
        )

    return write


TABLE_JS = """
return [...document.querySelectorAll(arguments[0] + ' tbody tr')].map(
  tr => [...tr.querySelectorAll('td')].map(td => td.textContent));
"""


def rows(browser: WebDriver, table: str) -> list[list[str]]:
    result: list[list[str]] = browser.execute_script(TABLE_JS, table)
    return result


def test_the_jobs_list_and_a_job_page_with_attempts_checkpoints_costs_and_log(
    browser: WebDriver, gateway: Gateway, api: httpx.Client, unique: str, tmp_path: Path
) -> None:
    uid = create_job(api, unique, "train")
    gateway.run(ran(unique, "train", uid, tmp_path))
    first, second = attempt_name("train", uid, 0, 1), attempt_name("train", uid, 0, 2)

    open_page(browser, gateway, f"/jobs/{unique}")
    listed = wait_for(browser, lambda b: rows(b, "#jobs-table"), "the Jobs list")
    assert listed == [
        [unique, "train", "Succeeded", "H100:1", "1/1", "2", "1m35s", "420.5", "$0.066250", listed[0][-1]]
    ]

    browser.find_element("link text", "train").click()
    attempts = wait_for(browser, lambda b: len(r := rows(b, "#attempts")) == 2 and r, "the Job's attempts")
    assert browser.current_url.endswith(f"#/jobs/{unique}/train")
    assert [a[:8] for a in attempts] == [
        [first, "0", "1", "node-1", "h100-sxm-80g-x1-us", "Lost", "-", "1m01s"],
        [second, "0", "2", "node-2", "h100-sxm-80g-x1-us", "Succeeded", "0", "34s"],
    ]
    assert attempts[1][9] == f"{COMMIT[:12]} (v1)", "the commit the second attempt checked out"
    assert attempts[1][10] == "imagenet@3 at /data, cached; workspace home at /nodus/inputs/vocab"
    assert attempts[0][9:11] == ["-", "-"]
    assert attempts[1][11] == "checkpoint 3", "the second attempt was restored from checkpoint 3"
    assert rows(browser, "#checkpoints") == [
        [first, "3", "2025-01-02T03:04:05Z", "5.0 MiB", "Interval", "yes", "s3://ckpt/train/3.tar.zst"]
    ]
    assert rows(browser, "#segments") == [
        ["Boot", "$0.004150", ""],
        ["Running", "$0.062100", ""],
        ["Restore", "$0", "covered by Nodus"],
        ["Teardown", "$0.000000", ""],
        ["Total", "$0.066250", "final"],
    ]
    # Every attempt of the index, oldest first; a line that looks like HTML stays text.
    log = browser.find_element("id", "log")
    assert log.text.splitlines() == ["step 1", "step 2 <b>not bold</b>", "restored from checkpoint 3", "done"]
    assert log.find_elements("tag name", "b") == []
