"""The node agent, run in-process as production runs it, against the session's real nats-server.

Each test has its own node name (its own assignment subject, durable consumer and report subjects) and
its own work directory. Programs are small ``python -c`` snippets; where a test must act while a program
runs, the program waits for a file the test creates, so nothing here sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from nodus_agent import processes
from nodus_agent.attemptdir import RUNNING, AttemptDir, Record
from nodus_agent.envcontract import NO_COMMAND
from nodus_agent.running import AGENT_RESTARTED
from nodus_agent.service import AgentService
from nodus_kit import messaging
from nodus_kit.errors import NotFound
from nodus_kit.servicing import Settings
from nodus_kit.storing import ObjectStore
from nodus_schema.configs import Secret
from nodus_schema.jobs import EnvVar, EnvVarSource, SecretKeySelector, SecretMount
from nodus_schema.messages import (
    AttemptFinished,
    AttemptProgress,
    AttemptStarted,
    NodeBeat,
    Report,
    StartAttempt,
    StopAttempt,
    StopReason,
    beat_subject,
)
from nodus_schema.meta import ObjectMeta
from nodus_schema.nodes import Node
from nodus_testing.binding import bind
from nodus_testing.waiting import eventually

NAMESPACE = "team-a"
ASSIGNMENTS = "NODUS_ASSIGNMENTS"
# Agents ask the gateway's Node authorizer for their runs (ADR-0026): it answers on the session's bus.
pytestmark = pytest.mark.usefixtures("node_access")


# -- harness ----------------------------------------------------------------------------------------------
@dataclass
class Reports:
    """Every report the stream stored for one node (an ordered consumer from the first message)."""

    items: list[Report] = field(default_factory=list)
    decoder: msgspec.json.Decoder[Report] = field(default_factory=lambda: msgspec.json.Decoder(Report))

    async def on_msg(self, msg: Msg) -> None:
        self.items.append(self.decoder.decode(msg.data))

    def started(self, attempt: str) -> list[AttemptStarted]:
        return [r for r in self.items if isinstance(r, AttemptStarted) and r.attempt == attempt]

    def progress(self, attempt: str) -> list[AttemptProgress]:
        return [r for r in self.items if isinstance(r, AttemptProgress) and r.attempt == attempt]

    def finished(self, attempt: str) -> list[AttemptFinished]:
        return [r for r in self.items if isinstance(r, AttemptFinished) and r.attempt == attempt]

    async def wait_finished(self, attempt: str, deadline_s: float = 10.0) -> AttemptFinished:
        found = await eventually(
            lambda: self.finished(attempt), deadline_s, message=f"{attempt} never finished"
        )
        return found[0]


@dataclass
class Agent:
    service: AgentService
    task: asyncio.Task[None]
    nc: NATS
    node: str
    reports: Reports
    subscription: Subscription

    @property
    def workdir(self) -> Path:
        return self.service.agent.workdir

    def attempt_dir(self, attempt: str) -> Path:
        return self.workdir / NAMESPACE / attempt

    def start_msg(self, attempt: str, command: list[str], **fields: Any) -> StartAttempt:
        # One Job per test (its node is the test's own): the Node authorizer gives a run what its Job names.
        job = f"train-{self.node}"
        defaults: dict[str, Any] = {"namespace": NAMESPACE, "job": job, "index": 0, "attempt_no": 1}
        return StartAttempt(**{**defaults, **fields}, attempt=attempt, node=self.node, command=command)

    async def assign(self, msg: StartAttempt | StopAttempt, msg_id: str) -> int:
        if isinstance(msg, StartAttempt):
            await bind(self.nc, msg)  # what the scheduler writes first: the agent checks it (ADR-0026)
        ack = await messaging.publish(self.nc.jetstream(), f"nodus.assign.{self.node}", msg, msg_id=msg_id)
        return int(ack.seq)

    async def consumed(self, seq: int) -> None:
        """Until the agent has handled and acknowledged every assignment up to stream sequence ``seq``."""

        async def done() -> bool:
            info = await self.nc.jetstream().consumer_info(ASSIGNMENTS, f"agent-{self.node}")
            return int(info.delivered.stream_seq or 0) >= seq and info.num_ack_pending == 0

        await eventually(done, message=f"assignment {seq} was never acknowledged")

    async def stop(self) -> None:
        self.service.stopping.set()
        await asyncio.wait_for(self.task, 20)
        await self.subscription.unsubscribe()


async def start_agent(nats_url: str, seed: Path, nc: NATS, node: str, workdir: Path, **env: str) -> Agent:
    # The gateway's Node authorizer must answer: tests that start agents ask for the node_access fixture.
    reports = Reports()
    sub = await nc.jetstream().subscribe(
        f"nodus.report.{node}.>",
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        cb=reports.on_msg,
    )
    settings = Settings(
        service="nodus-agent",
        nats_url=nats_url,
        nats_nkey_seed=str(seed),
        env={
            "NODUS_AGENT_NODE": node,
            "NODUS_AGENT_WORKDIR": str(workdir),
            "NODUS_AGENT_FAKE_GPUS": "true",  # the same inventory on a GPU host as on a laptop
            "NODUS_AGENT_HEARTBEAT_S": "0.2",
            "NODUS_AGENT_RECORD_S": "1",  # the record refreshed every 1 s, beats on the bus between
            "NODUS_AGENT_STOP_GRACE_S": "3",
            **env,
        },
    )
    service = AgentService(settings)
    task = asyncio.create_task(service.run(), name=f"agent:{node}")

    def ready() -> bool:
        if task.done():
            task.result()  # a crash at start shows its traceback, not a timeout
        return service.consumer is not None

    await eventually(ready, message=f"agent {node} never started consuming")
    return Agent(service, task, nc, node, reports, sub)


@pytest_asyncio.fixture
async def agent(
    nats_url: str, nats_seed: Path, nc: NATS, unique: str, tmp_path: Path
) -> AsyncIterator[Agent]:
    running = await start_agent(nats_url, nats_seed, nc, unique, tmp_path / "agent")
    try:
        yield running
    finally:
        if not running.task.done():
            await running.stop()
        await nc.jetstream().delete_consumer(ASSIGNMENTS, f"agent-{unique}")


def python(*parts: str) -> list[str]:
    """``python -c`` with the parts dedented one by one, so snippets can be indented as they read best."""
    return [sys.executable, "-c", "\n".join(textwrap.dedent(p) for p in parts)]


# A program that waits for "$NODUS_STATE/go", so a test can act while it runs.
WAIT_FOR_GO = """
    import os, pathlib, time
    go = pathlib.Path(os.environ["NODUS_STATE"], "go")
    while not go.exists():
        time.sleep(0.02)
"""


# -- registration -----------------------------------------------------------------------------------------
async def test_node_registers_with_fake_gpus_heartbeats_and_goes_not_ready(
    nats_url: str, nats_seed: Path, nc: NATS, unique: str, tmp_path: Path
) -> None:
    running = await start_agent(
        nats_url, nats_seed, nc, unique, tmp_path,
        NODUS_AGENT_GPUS="2", NODUS_AGENT_OFFERING="h100-sxm-80g-x2-us",
        NODUS_AGENT_REGION="us", NODUS_AGENT_POOL="blue", NODUS_AGENT_INTERRUPTIBLE="true",
    )  # fmt: skip
    store = ObjectStore(nc, "nodes", Node)
    try:
        node = await store.get(None, unique)
        assert node.spec.offering == "h100-sxm-80g-x2-us" and node.spec.region_class == "us"
        assert node.spec.pool == "blue" and node.spec.interruptible is True
        assert node.status.phase == "Ready" and node.status.fake_gpus is True
        assert [(g.index, g.uuid, g.variant, g.memory) for g in node.status.gpus] == [
            (0, f"GPU-fake-{unique}-0", "H100-SXM-80G", "80Gi"),
            (1, f"GPU-fake-{unique}-1", "H100-SXM-80G", "80Gi"),
        ]
        assert await running.service.checks()["registered"]()
        first = node.status.last_heartbeat_time
        assert first is not None

        async def advanced() -> bool:
            beat = (await store.get(None, unique)).status.last_heartbeat_time
            return beat is not None and beat > first

        # Heartbeat times are whole seconds (metav1.Time): at most ~1 s until the next one differs.
        await eventually(advanced, deadline_s=5, message="the heartbeat never advanced")
        # Between refreshes the agent beats on the bus (core NATS, ADR-0042): its own subject, its clock.
        beats: asyncio.Queue[Msg] = asyncio.Queue()
        sub = await nc.subscribe(beat_subject(unique), cb=beats.put)
        try:
            first_beat = msgspec.json.decode((await asyncio.wait_for(beats.get(), 5)).data, type=NodeBeat)
            second_beat = msgspec.json.decode((await asyncio.wait_for(beats.get(), 5)).data, type=NodeBeat)
        finally:
            await sub.unsubscribe()
        assert first_beat.phase == second_beat.phase == "Ready"
        assert 0 < second_beat.time_ms - first_beat.time_ms < 5_000
        assert abs(second_beat.time_ms / 1000 - time.time()) < 5
    finally:
        await running.stop()
        await nc.jetstream().delete_consumer(ASSIGNMENTS, f"agent-{unique}")
    assert (await store.get(None, unique)).status.phase == "NotReady"


async def test_a_deleted_node_record_is_registered_again(agent: Agent, nc: NATS) -> None:
    # The scheduler deletes the record of a node NotReady for too long, or an operator deletes it
    # (nodus_scheduler.retiring, DELETE .../nodes/<name>): an agent still running registers it again.
    store = ObjectStore(nc, "nodes", Node)
    first = await store.get(None, agent.node)
    await store.delete(None, agent.node)

    async def back() -> Node | None:
        try:
            return await store.get(None, agent.node)
        except NotFound:
            return None  # not yet: the next heartbeat finds it gone

    node = await eventually(back, deadline_s=5, message="the deleted Node was never registered again")
    assert node.metadata.uid != first.metadata.uid  # a new record, not the old one brought back
    assert node.status.phase == "Ready" and node.spec == first.spec
    assert node.status.gpus == first.status.gpus
    assert await agent.service.checks()["registered"]()


# -- running ------------------------------------------------------------------------------------------------
async def test_program_sees_the_env_contract(
    agent: Agent, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODUS_AGENT_SECRET_FOR_TEST", "must-not-leak")
    attempt = f"{unique}-env"
    program = python("""
        import json, os
        with open(os.path.join(os.environ["NODUS_OUTPUTS"], "env.json"), "w") as f:
            json.dump(dict(os.environ), f)
    """)
    env = [EnvVar(name="NODUS_PARAM_LR", value="0.001"), EnvVar(name="NODUS_ATTEMPT", value="hijack")]
    await agent.assign(agent.start_msg(attempt, program, index=3, env=env), msg_id=f"{attempt}:start")

    finished = await agent.reports.wait_finished(attempt)
    assert (finished.reason, finished.exit_code, finished.node) == ("Completed", 0, unique)
    assert agent.reports.started(attempt)
    root = agent.attempt_dir(attempt)
    seen = json.loads((root / "outputs" / "env.json").read_text())
    assert seen["NODUS_PARAM_LR"] == "0.001"
    assert seen["NODUS_INDEX"] == seen["JOB_COMPLETION_INDEX"] == "3"
    assert seen["NODUS_ATTEMPT"] == attempt  # the contract wins over the job's env
    want = (f"train-{unique}", NAMESPACE, unique)
    assert (seen["NODUS_JOB"], seen["NODUS_NAMESPACE"], seen["NODUS_NODE"]) == want
    assert seen["NODUS_REPORT"] == str(root / "report.jsonl")
    assert (seen["NODUS_STATE"], seen["NODUS_INPUTS"]) == (str(root / "state"), str(root / "inputs"))
    assert "NODUS_AGENT_SECRET_FOR_TEST" not in seen
    record = json.loads((root / "record.json").read_text())
    assert record["phase"] == "Finished" and record["exitCode"] == 0 and record["reported"] is True


async def test_report_lines_become_exact_throughput(agent: Agent, unique: str) -> None:
    attempt = f"{unique}-rate"
    program = python(
        """
        import json, os, pathlib, time
        report = os.environ["NODUS_REPORT"]
        def line(text):
            with open(report, "a") as f:
                f.write(text + "\\n")
        line('{"unitsPerSecond": 250}')
        line('not json at all')
        """,
        WAIT_FOR_GO,
        """
        line('{"unitsPerSecond": 812.1000000000000000001, "loss": 0.5}')
        line('{"loss": 0.25}')
        line('{"unitsPerSecond": NaN}')
        """,
    )
    await agent.assign(agent.start_msg(attempt, program), msg_id=f"{attempt}:start")

    progress = await eventually(lambda: agent.reports.progress(attempt), message="no AttemptProgress")
    assert progress[0].units_per_second == "250"
    (agent.attempt_dir(attempt) / "state" / "go").touch()
    finished = await agent.reports.wait_finished(attempt)
    # A float would have made this 812.1: the digits survive because they are never a float.
    assert finished.units_per_second == "812.1000000000000000001"
    assert finished.reason == "Completed"


async def test_non_zero_exit_is_an_error_with_the_log_tail(agent: Agent, unique: str) -> None:
    attempt = f"{unique}-fail"
    program = python("""
        import sys
        print("loading the data set")
        print("CUDA out of memory: tried to allocate 2.00 GiB", file=sys.stderr)
        sys.exit(3)
    """)
    await agent.assign(agent.start_msg(attempt, program), msg_id=f"{attempt}:start")

    finished = await agent.reports.wait_finished(attempt)
    assert (finished.reason, finished.exit_code) == ("Error", 3)
    assert finished.message is not None and "exited with code 3" in finished.message
    assert "CUDA out of memory: tried to allocate 2.00 GiB" in finished.message
    assert finished.wall_millis > 0


async def test_the_node_reports_where_billing_starts_and_stops_in_milliseconds(
    agent: Agent, unique: str
) -> None:
    """Exact metering (#18): the start of the run, the program's launch and the stop, on the node's clock."""
    attempt = f"{unique}-times"
    before = time.time_ns() // 1_000_000
    await agent.assign(
        agent.start_msg(attempt, python("import time; time.sleep(0.3)")), msg_id=f"{attempt}:s"
    )
    finished = await agent.reports.wait_finished(attempt)
    after = time.time_ns() // 1_000_000
    (started,) = agent.reports.started(attempt)
    assert started.started_ms is not None and started.program_ms is not None
    assert before <= started.started_ms <= started.program_ms
    assert finished.started_ms == started.started_ms
    assert finished.stopped_ms is not None and started.program_ms + 300 <= finished.stopped_ms <= after


async def test_stop_attempt_stops_the_program_and_its_group(agent: Agent, unique: str) -> None:
    attempt = f"{unique}-stop"
    program = python("""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        out = os.environ["NODUS_OUTPUTS"]
        with open(os.path.join(out, "pids.tmp"), "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        os.rename(os.path.join(out, "pids.tmp"), os.path.join(out, "pids"))
        time.sleep(60)
    """)
    await agent.assign(agent.start_msg(attempt, program), msg_id=f"{attempt}:start")
    pids_file = agent.attempt_dir(attempt) / "outputs" / "pids"
    await eventually(pids_file.exists, message="the program never started")
    _, child = (int(p) for p in pids_file.read_text().split())

    await agent.assign(
        StopAttempt(namespace=NAMESPACE, attempt=attempt, reason=StopReason.CANCELLED),
        msg_id=f"{attempt}:stop",
    )
    finished = await agent.reports.wait_finished(attempt, deadline_s=5)
    assert finished.reason == "Stopped" and finished.message is not None and "Cancelled" in finished.message
    assert finished.exit_code == 128 + 15  # SIGTERM, as a shell or a container runtime reports it
    # The grandchild was in the program's process group: gone too (reparented, so only /proc can tell).
    await eventually(lambda: not _running(child), deadline_s=5, message="the program's child survived")


async def test_timeout_is_deadline_exceeded(agent: Agent, unique: str) -> None:
    attempt = f"{unique}-late"
    program = python("import time; time.sleep(60)")
    await agent.assign(agent.start_msg(attempt, program, timeout_seconds=1), msg_id=f"{attempt}:start")
    finished = await agent.reports.wait_finished(attempt, deadline_s=6)
    assert finished.reason == "DeadlineExceeded"
    assert 1000 <= finished.wall_millis < 5000


async def test_duplicate_start_runs_the_program_once(agent: Agent, unique: str, tmp_path: Path) -> None:
    attempt = f"{unique}-twice"
    runs = tmp_path / "runs.txt"
    program = python(
        f"""
        with open({str(runs)!r}, "a") as f:
            f.write("ran\\n")
        """,
        WAIT_FOR_GO,
    )
    start = agent.start_msg(attempt, program)
    await agent.assign(start, msg_id=f"{attempt}:start")
    # The scheduler's retry after a lost ack: a new message id, so the stream does not drop it.
    await agent.consumed(await agent.assign(start, msg_id=f"{attempt}:start:retry"))
    (agent.attempt_dir(attempt) / "state" / "go").touch()
    finished = await agent.reports.wait_finished(attempt)
    # And once more after it finished: the recorded report is published again, nothing runs.
    await agent.consumed(await agent.assign(start, msg_id=f"{attempt}:start:late"))

    assert finished.reason == "Completed"
    assert runs.read_text().splitlines() == ["ran"]
    assert len(agent.reports.started(attempt)) == 1
    assert len(agent.reports.finished(attempt)) == 1  # same msg id: the stream kept one


async def test_attempts_this_runner_cannot_run_are_lost(agent: Agent, unique: str) -> None:
    no_command = f"{unique}-image"
    await agent.assign(agent.start_msg(no_command, [], image="busybox"), msg_id=f"{no_command}:start")

    finished = await agent.reports.wait_finished(no_command)
    assert (finished.reason, finished.exit_code, finished.message) == ("Lost", None, NO_COMMAND)
    assert not agent.reports.started(no_command)


async def test_a_missing_secret_fails_the_attempt_naming_it(agent: Agent, unique: str) -> None:
    attempt = f"{unique}-secret"
    env = [EnvVar(name="TOKEN", value_from=EnvVarSource(secret_key_ref=SecretKeySelector(name="s", key="k")))]
    await agent.assign(agent.start_msg(attempt, python("pass"), env=env), msg_id=f"{attempt}:start")

    finished = await agent.reports.wait_finished(attempt)
    # The customer's to fix (counted against backoffLimit), not lost capacity.
    assert finished.reason == "Error" and finished.message is not None
    assert "Secret ns/s does not exist" in finished.message or "does not exist" in finished.message
    assert not agent.reports.started(attempt)


async def test_secret_values_reach_the_program_as_env_and_files(agent: Agent, unique: str) -> None:
    name = f"{unique}-creds"
    value = f"hunter2-{unique}"
    secrets = ObjectStore(agent.nc, "secrets", Secret)
    await secrets.create(
        Secret(
            metadata=ObjectMeta(name=name, namespace=NAMESPACE),
            data={"token": base64.b64encode(value.encode()).decode()},
        )
    )
    attempt = f"{unique}-uses-secret"
    env = [
        EnvVar(
            name="TOKEN", value_from=EnvVarSource(secret_key_ref=SecretKeySelector(name=name, key="token"))
        )
    ]
    program = python(
        """
        import os, pathlib
        state = pathlib.Path(os.environ["NODUS_STATE"])
        state.joinpath("env.txt").write_text(os.environ["TOKEN"])
        secret_dir = pathlib.Path(os.environ["NODUS_SECRETS"])
        state.joinpath("file.txt").write_text((secret_dir / os.environ["SECRET_NAME"] / "token").read_text())
        """
    )
    plain = [*env, EnvVar(name="SECRET_NAME", value=name)]
    start = agent.start_msg(attempt, program, env=plain, secrets=[SecretMount(name=name)])
    await agent.assign(start, msg_id=f"{attempt}:start")

    finished = await agent.reports.wait_finished(attempt)
    assert finished.reason == "Completed", finished.message
    state = agent.attempt_dir(attempt) / "state"
    assert (state / "env.txt").read_text() == value
    assert (state / "file.txt").read_text() == value
    secret_file = agent.attempt_dir(attempt) / "secrets" / name / "token"
    assert oct(secret_file.stat().st_mode & 0o777) == "0o400"


async def test_stop_before_start_leaves_a_record_that_wins(agent: Agent, unique: str) -> None:
    attempt = f"{unique}-early"
    await agent.assign(
        StopAttempt(namespace=NAMESPACE, attempt=attempt, reason=StopReason.CANCELLED), msg_id=f"{attempt}:s"
    )
    await agent.consumed(
        await agent.assign(agent.start_msg(attempt, python("pass")), msg_id=f"{attempt}:start")
    )
    finished = await agent.reports.wait_finished(attempt)
    assert finished.reason == "Stopped" and not agent.reports.started(attempt)


async def test_restarted_agent_settles_what_the_old_one_left_running(
    nats_url: str, nats_seed: Path, nc: NATS, unique: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "agent"
    # What an agent killed mid-run leaves: records of programs, one gone since, one still running.
    vanished, orphan = f"{unique}-vanished", f"{unique}-orphan"
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()
    AttemptDir(workdir, NAMESPACE, vanished).save(Record(phase=RUNNING, pid=gone.pid, started_epoch_ms=1))
    sleeper = "import time; time.sleep(60)"
    alive = await asyncio.create_subprocess_exec(sys.executable, "-c", sleeper, start_new_session=True)
    ticks = processes.start_ticks(alive.pid)
    AttemptDir(workdir, NAMESPACE, orphan).save(Record(phase=RUNNING, pid=alive.pid, pid_start_ticks=ticks))

    running = await start_agent(nats_url, nats_seed, nc, unique, workdir)
    try:
        lost = [await running.reports.wait_finished(a) for a in (vanished, orphan)]
    finally:
        await running.stop()
        await nc.jetstream().delete_consumer(ASSIGNMENTS, f"agent-{unique}")
        if alive.returncode is None:
            alive.kill()
    assert [(f.reason, f.message, f.exit_code) for f in lost] == [("Lost", AGENT_RESTARTED, None)] * 2
    # The orphan was stopped, not left running unmanaged (SIGTERM, before the kill above).
    assert await asyncio.wait_for(alive.wait(), 5) == -15


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
