"""The runner end to end on the real parts: containers on podman's Docker API, checkpoints and outputs on
SeaweedFS, reports on a real nats-server.

The runtime- and store-level behaviour is tested beside each module (test_containers, test_checkpointing,
test_outputs); here the runner drives them as the agent does: the env contract inside a container, an
OOM and an exit code reported with their reasons, a container re-adopted by a runner that replaced a
crashed one, and a Checkpointed index suspended with a checkpoint and resumed from it by its next
Attempt, whose outputs are committed to the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from nodus_agent import s3
from nodus_agent.attemptdir import FINISHED, RUNNING, AttemptDir, Record
from nodus_agent.configuring import Ulimit
from nodus_agent.containers import ContainerRuntime
from nodus_agent.dockerapi import DockerAPI
from nodus_agent.dockerruntime import DockerRuntime
from nodus_agent.preparing import Toolkit
from nodus_agent.reporting import Reporter
from nodus_agent.running import Runner
from nodus_agent.settings import AgentSettings
from nodus_schema.jobs import CheckpointPolicy, JobOutput, Resources
from nodus_schema.messages import AttemptFinished, StartAttempt, StopAttempt, StopReason
from nodus_testing.podman import PodmanService
from nodus_testing.seaweed import SeaweedS3
from nodus_testing.waiting import eventually

NAMESPACE = "team-a"
SANDBOX = [Ulimit("nofile", 1024, 1024), Ulimit("nproc", 1024, 1024)]


def settings_for(node: str, workdir: Path) -> AgentSettings:
    return AgentSettings.from_env(
        {
            "NODUS_AGENT_NODE": node,
            "NODUS_AGENT_WORKDIR": str(workdir),
            "NODUS_AGENT_FAKE_GPUS": "true",
            "NODUS_AGENT_STOP_GRACE_S": "3",
        }
    )


def start(node: str, attempt: str, **fields: Any) -> StartAttempt:
    defaults: dict[str, Any] = {"namespace": NAMESPACE, "job": "train", "index": 0, "attempt_no": 1}
    return StartAttempt(**{**defaults, **fields}, attempt=attempt, node=node)


async def finished(workdir: Path, attempt: str, deadline_s: float = 30.0) -> AttemptFinished:
    """The attempt's AttemptFinished, from the runner's record once it is written."""
    adir = AttemptDir(workdir, NAMESPACE, attempt)

    def done() -> Record | None:
        record = adir.load()
        return record if record is not None and record.phase == FINISHED else None

    record = await eventually(done, deadline_s=deadline_s, message=f"{attempt} never finished")
    assert record.report is not None
    return record.report


async def running_record(workdir: Path, attempt: str) -> Record:
    adir = AttemptDir(workdir, NAMESPACE, attempt)

    def up() -> Record | None:
        record = adir.load()
        return record if record is not None and record.phase == RUNNING else None

    return await eventually(up, message=f"{attempt} never started")


@pytest.fixture
async def docker(podman: PodmanService) -> AsyncIterator[DockerAPI]:
    api = DockerAPI(podman.socket_path)
    yield api
    await api.close()


def docker_runner(nc: NATS, api: DockerAPI, node: str, workdir: Path) -> Runner:
    settings = settings_for(node, workdir)
    runtime = DockerRuntime(ContainerRuntime(api, node, SANDBOX, engine_grace_s=2))
    return Runner(settings, Reporter(nc.jetstream(), node), runtime, Toolkit(nc=nc))


# -- containers ------------------------------------------------------------------------------------------
@pytest.mark.containers
async def test_a_container_runs_with_the_env_contract_mounts_and_its_log(
    nc: NATS, docker: DockerAPI, busybox_image: str, unique: str, tmp_path: Path
) -> None:
    runner = docker_runner(nc, docker, unique, tmp_path)
    script = """
        echo '{"unitsPerSecond": 7.5}' >> "$NODUS_REPORT"
        echo "job=$NODUS_JOB index=$JOB_COMPLETION_INDEX state=$NODUS_STATE" > /nodus/outputs/env.txt
        echo hello-from-the-container
        if touch /nodus/inputs/x 2>/dev/null; then echo inputs-writable; else echo inputs-read-only; fi
    """
    msg = start(unique, f"{unique}-c", image=busybox_image, command=["sh", "-c", textwrap.dedent(script)])
    await runner.start(msg)
    report = await finished(tmp_path, msg.attempt)

    assert (report.reason, report.exit_code, report.units_per_second) == ("Completed", 0, "7.5")
    adir = AttemptDir(tmp_path, NAMESPACE, msg.attempt)
    assert (adir.outputs / "env.txt").read_text() == "job=train index=0 state=/nodus/state\n"
    log = adir.log.read_text()
    assert "hello-from-the-container" in log and "inputs-read-only" in log
    assert adir.load().container is not None  # type: ignore[union-attr]


@pytest.mark.containers
async def test_exit_codes_and_oom_are_reported_with_their_reasons(
    nc: NATS, docker: DockerAPI, busybox_image: str, unique: str, tmp_path: Path
) -> None:
    runner = docker_runner(nc, docker, unique, tmp_path)
    failing = start(unique, f"{unique}-fail", image=busybox_image, command=["sh", "-c", "echo boom; exit 3"])
    oom = start(
        unique,
        f"{unique}-oom",
        image=busybox_image,
        command=["sh", "-c", "head -c 200m /dev/zero | tail"],
        resources=Resources(memory="32Mi"),
    )
    await runner.start(failing)
    await runner.start(oom)

    failed = await finished(tmp_path, failing.attempt)
    assert (failed.reason, failed.exit_code) == ("Error", 3)
    assert failed.message is not None and "boom" in failed.message  # the log's last lines
    killed = await finished(tmp_path, oom.attempt)
    assert (killed.reason, killed.exit_code) == ("OOMKilled", 137)


@pytest.mark.containers
@pytest.mark.slow
async def test_a_restarted_runner_re_adopts_a_running_container_and_reports_its_real_exit(
    nc: NATS, docker: DockerAPI, busybox_image: str, unique: str, tmp_path: Path
) -> None:
    first = docker_runner(nc, docker, unique, tmp_path)
    wait_then_exit = "while [ ! -f /nodus/state/go ]; do sleep 0.1; done; echo done; exit 4"
    msg = start(unique, f"{unique}-adopt", image=busybox_image, command=["sh", "-c", wait_then_exit])
    await first.start(msg)
    record = await running_record(tmp_path, msg.attempt)
    # The agent dies: its supervision is gone, the container is not.
    run = first.runs[(NAMESPACE, msg.attempt)]
    assert run.task is not None
    run.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run.task
    assert (await docker.inspect(record.container or ""))["State"]["Running"]

    second = docker_runner(nc, docker, unique, tmp_path)
    await second.recover()
    assert (NAMESPACE, msg.attempt) in second.runs  # watched again, not reported Lost
    (tmp_path / NAMESPACE / msg.attempt / "state" / "go").touch()
    report = await finished(tmp_path, msg.attempt)
    assert (report.reason, report.exit_code) == ("Error", 4)


# -- checkpoints and outputs -----------------------------------------------------------------------------
# A program that counts steps in /nodus/state/progress, resuming from what is there, and waits for
# "go" before finishing: the first Attempt is suspended while it waits, the second finishes.
COUNTER = """
import os, pathlib, time
state = pathlib.Path(os.environ["NODUS_STATE"])
progress = state / "progress"
step = int(progress.read_text()) if progress.exists() else 0
started_at = step
for _ in range(5):
    step += 1
    progress.write_text(str(step))
if started_at == 0:
    (state / "blob.bin").write_bytes(os.urandom(1 << 20))
while not (state / "go").exists() and started_at == 0:
    time.sleep(0.05)
out = pathlib.Path(os.environ["NODUS_OUTPUTS"])
(out / "result.txt").write_text(f"resumed at {started_at}, ended at {step}")
"""


@pytest.mark.s3
@pytest.mark.slow
async def test_a_suspended_index_resumes_from_its_checkpoint_and_commits_its_outputs(
    nc: NATS, seaweed: SeaweedS3, unique: str, tmp_path: Path
) -> None:
    bucket = f"{unique}-store"
    store = s3.S3Settings(
        bucket=bucket,
        endpoint=seaweed.endpoint_url,
        region=seaweed.region,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
    )
    async with s3.client(store) as client:
        await client.create_bucket(Bucket=bucket)
        settings = settings_for(unique, tmp_path)
        toolkit = Toolkit(nc=nc, store=store, s3=client)
        runner = Runner(settings, Reporter(nc.jetstream(), unique), toolkit=toolkit)
        common: dict[str, Any] = {
            "command": [sys.executable, "-c", COUNTER],
            "continuity": "Checkpointed",
            "checkpoint": CheckpointPolicy(interval="6h"),
            "job_uid": "0123456789abcdef",
            "outputs": [JobOutput(name="result", path="/nodus/outputs/result.txt")],
        }
        first = start(unique, f"{unique}-a1", **common)
        await runner.start(first)
        await running_record(tmp_path, first.attempt)
        progress = tmp_path / NAMESPACE / first.attempt / "state" / "progress"
        await eventually(lambda: progress.exists() and progress.read_text() == "5", message="no progress")
        # A suspension of a Checkpointed Job: checkpoint, then stop.
        await runner.stop(
            StopAttempt(
                namespace=NAMESPACE, attempt=first.attempt, reason=StopReason.SUSPENDED, checkpoint=True
            )
        )
        stopped = await finished(tmp_path, first.attempt)
        assert stopped.reason == "Stopped"
        blob = (tmp_path / NAMESPACE / first.attempt / "state" / "blob.bin").read_bytes()

        second = start(unique, f"{unique}-a2", attempt_no=2, restore_from=first.attempt, **common)
        await runner.start(second)
        done = await finished(tmp_path, second.attempt)

    assert done.reason == "Completed", done.message
    assert done.restored_from is not None and done.restored_from.sequence == 1
    assert done.restored_from.reason == "Suspend"
    second_state = tmp_path / NAMESPACE / second.attempt / "state"
    assert (second_state / "blob.bin").read_bytes() == blob  # byte-identical
    assert (tmp_path / NAMESPACE / second.attempt / "outputs" / "result.txt").read_text() == (
        "resumed at 5, ended at 10"
    )
    names = {o.name: o for o in done.outputs}
    assert set(names) == {"result", "outputs"}
    assert names["result"].uri == f"s3://{bucket}/{NAMESPACE}/train/0/outputs/result"
    assert names["result"].archive is False and names["outputs"].archive is True
