"""Node restriction (#17, ADR-0026) on a real nats-server with the generated credentials: what a GPU host
running hostile code can and cannot do with its agent's credential.

Two nodes, n1 and n2. A Job in project ``p`` has a Secret and a Connection and one Attempt bound to n1.
Everything here runs the real parts: the gateway's Node authorizer (nodus_gateway.noding) as the
``gateway`` credential, the scheduler's report handler (nodus_scheduler.reporting) behind the
``scheduler`` durable, the gateway's log reader, and the node agent itself as ``agent-n1``.
tests/deploy/test_permissions.py holds the full matrix of refused subjects; this file holds the attacks.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats
import nats.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_agent.logshipping import log_subject
from nodus_agent.service import AgentService
from nodus_gateway.logstreaming import FORGERIES, LogReader
from nodus_gateway.noding import serve_nodes
from nodus_gateway.resources import stores_for
from nodus_kit import credentials, errors, messaging
from nodus_kit.connecting import connect
from nodus_kit.measuring import REGISTRY
from nodus_kit.messaging import Consumer
from nodus_kit.permitting import Generated
from nodus_kit.servicing import Settings
from nodus_kit.storing import ObjectStore
from nodus_scheduler.reporting import Reports
from nodus_schema.attempts import Attempt
from nodus_schema.configs import Connection, ConnectionSpec, S3Connection, Secret
from nodus_schema.jobs import EnvVar, EnvVarSource, Job, JobSpec, SecretKeySelector
from nodus_schema.messages import AttemptFinished, LogLine, LogLines, Report, StartAttempt
from nodus_schema.meta import ObjectMeta
from nodus_schema.noding import (
    JobFolder,
    RetentionReply,
    RetentionRequest,
    RunSecrets,
    RunSecretsRequest,
    retention_subject,
    secrets_subject,
)
from nodus_testing.binding import bind_attempt, finish
from nodus_testing.waiting import eventually


@dataclass
class World:
    """The connections by credential, the gateway's endpoints, and one Job with a bound Attempt."""

    url: str
    creds: Generated
    conns: dict[str, NATS]
    project: str
    job: Job
    attempt: str

    def of(self, user: str) -> NATS:
        return self.conns[user]


@pytest_asyncio.fixture(loop_scope="session")
async def world(declared: str, creds: Generated) -> AsyncIterator[World]:
    users = ("gateway", "scheduler", "agent-n1", "agent-n2", "operator")
    conns = {
        u: await connect(declared, f"{u}-{uuid.uuid4().hex[:6]}", nkey_seed=creds.seed(u)) for u in users
    }
    gw = conns["gateway"]
    endpoints = await serve_nodes(gw, stores_for(gw))
    project = f"p{uuid.uuid4().hex[:8]}"
    value = base64.b64encode(b"hunter2-value").decode()
    await ObjectStore(gw, "secrets", Secret).create(
        Secret(metadata=ObjectMeta(name="creds", namespace=project), data={"token": value})
    )
    await ObjectStore(gw, "secrets", Secret).create(
        Secret(metadata=ObjectMeta(name="unrelated", namespace=project), data={"k": value})
    )
    s3 = S3Connection(
        endpoint="http://127.0.0.1:9",
        bucket="b",
        access_key_id_ref=SecretKeySelector(name="s3keys", key="id"),
    )
    await ObjectStore(gw, "connections", Connection).create(
        Connection(metadata=ObjectMeta(name="data", namespace=project), spec=ConnectionSpec(type="S3", s3=s3))
    )
    ref = EnvVarSource(secret_key_ref=SecretKeySelector(name="creds", key="token"))
    spec = JobSpec(
        image="x", command=["true"], env=[EnvVar(name="TOKEN", value_from=ref)], connections=["data"]
    )
    job = await ObjectStore(gw, "jobs", Job).create(
        Job(metadata=ObjectMeta(name="train", namespace=project, uid=str(uuid.uuid4())), spec=spec)
    )
    attempt = f"train-{(job.metadata.uid or '')[:8]}-0-a1"
    await bind_attempt(conns["scheduler"], project, attempt, job, "n1")
    try:
        yield World(declared, creds, conns, project, job, attempt)
    finally:
        for sub in endpoints:
            await sub.unsubscribe()
        for nc in conns.values():
            await nc.close()


async def ask_secrets(nc: NATS, node: str, project: str, attempt: str) -> RunSecrets:
    req = RunSecretsRequest(namespace=project, attempt=attempt)
    return await messaging.request(nc, secrets_subject(node), req, RunSecrets, timeout=5)


# -- who may connect -----------------------------------------------------------------------------------
async def test_an_anonymous_client_and_an_unknown_key_are_refused(declared: str, tmp_path: Path) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(declared, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(credentials.new_seed())
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            declared,
            nkeys_seed=str(stranger),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=2,
        )


# -- Secrets: only an Attempt's own node, only what its Job names ---------------------------------------
async def test_the_bound_node_gets_what_its_job_names_and_nothing_else(world: World) -> None:
    got = await ask_secrets(world.of("agent-n1"), "n1", world.project, world.attempt)
    assert (got.job, got.job_uid) == ("train", world.job.metadata.uid)
    assert [s.metadata.name for s in got.secrets] == ["creds"]  # not "unrelated"
    assert [c.metadata.name for c in got.connections] == ["data"]
    assert got.missing == ["Secret/s3keys"]  # the Connection's Secret, named but not there
    assert base64.b64decode(got.secrets[0].data["token"]) == b"hunter2-value"


async def test_another_node_gets_nothing_of_it(world: World) -> None:
    n2 = world.of("agent-n2")
    before = await _refused_count("gateway", "node-access")
    with pytest.raises(errors.NotFound):
        await ask_secrets(n2, "n2", world.project, world.attempt)  # on its own subject: not bound
    with pytest.raises(errors.NotFound):
        await ask_secrets(n2, "n2", world.project, "no-such-attempt")
    assert await _refused_count("gateway", "node-access") == before + 2
    # On n1's subject the bus refuses the publish itself: no answer ever comes.
    with pytest.raises(errors.NodusError):
        await messaging.request(
            n2, secrets_subject("n1"), RunSecretsRequest(namespace=world.project, attempt=world.attempt),
            RunSecrets, timeout=1,
        )  # fmt: skip


async def test_a_finished_attempt_gets_nothing(world: World) -> None:
    await finish(world.of("scheduler"), world.project, world.attempt)
    with pytest.raises(errors.NotFound):
        await ask_secrets(world.of("agent-n1"), "n1", world.project, world.attempt)


async def test_an_agent_cannot_read_the_buckets_itself(world: World) -> None:
    """The reproduction of the issue: STREAM.INFO with a subjects filter listed every Secret's key, and a
    direct get returned its value. The server drops both requests now (a permissions violation), so no
    answer comes."""
    js = world.of("agent-n1").jetstream(timeout=1)
    with pytest.raises(nats.errors.TimeoutError):
        await js.stream_info("KV_secrets", subjects_filter=">")
    with pytest.raises(nats.errors.TimeoutError):
        await js.get_last_msg("KV_secrets", f"$KV.secrets.{world.project}.creds", direct=True)
    with pytest.raises(nats.errors.TimeoutError):
        await js.get_last_msg("KV_jobs", f"$KV.jobs.{world.project}.train", direct=True)


async def test_retention_answers_for_folders_without_reading_jobs(world: World) -> None:
    uid8 = (world.job.metadata.uid or "")[:8]
    folders = [
        JobFolder(namespace=world.project, name="train", uid8=uid8),  # running: kept
        JobFolder(namespace=world.project, name="train", uid8="00000000"),  # an older Job of the name
        JobFolder(namespace=world.project, name="gone", uid8=uid8),  # deleted
    ]
    reply = await messaging.request(
        world.of("agent-n1"), retention_subject("n1"), RetentionRequest(folders=folders), RetentionReply
    )
    assert reply.expired == [False, True, True]


# -- reports and logs: a node speaks for its own runs only ---------------------------------------------
async def test_a_report_from_another_node_is_dropped_and_counted(world: World) -> None:
    reports = Reports(ObjectStore(world.of("scheduler"), "attempts", Attempt))
    consumer = await Consumer(
        world.of("scheduler").jetstream(),
        stream="NODUS_REPORTS",
        durable="scheduler",
        subject="nodus.report.>",
        typ=Report,  # type: ignore[arg-type]
        handler=reports.handle,
    ).start()
    attempts = ObjectStore(world.of("scheduler"), "attempts", Attempt)
    try:
        forged = AttemptFinished(
            namespace=world.project, attempt=world.attempt, node="n2", time="2026-12-01T00:00:00Z",
            exit_code=0, wall_millis=1, reason="Completed", units_per_second="99999",
        )  # fmt: skip
        n2 = world.of("agent-n2").jetstream()
        # n2 on its own subject about n1's run; then n1's own subject with a body that names n2.
        await messaging.publish(n2, f"nodus.report.n2.{world.project}.{world.attempt}", forged, msg_id="f1")
        lying = msgspec.structs.replace(forged, node="n1")
        await messaging.publish(n2, f"nodus.report.n2.{world.project}.{world.attempt}", lying, msg_id="f2")
        n1 = world.of("agent-n1").jetstream()
        await messaging.publish(n1, f"nodus.report.n1.{world.project}.{world.attempt}", forged, msg_id="f3")
        await eventually(lambda: reports.forgeries.total >= 3, deadline_s=10, message="forgeries not counted")
        assert (await attempts.get(world.project, world.attempt)).status.phase == "Pending"
        # And the genuine one still counts.
        genuine = msgspec.structs.replace(forged, node="n1", units_per_second="1.5")
        await messaging.publish(n1, f"nodus.report.n1.{world.project}.{world.attempt}", genuine, msg_id="g1")

        async def succeeded() -> bool:
            a = await attempts.get(world.project, world.attempt)
            return a.status.phase == "Succeeded" and a.status.units_per_second == "1.5"

        await eventually(succeeded, deadline_s=10, message="the genuine report was not applied")
        assert reports.forgeries.total == 3
    finally:
        await consumer.stop()


async def test_log_lines_from_another_node_are_not_shown(world: World) -> None:
    def batch(node: str, text: str, offset: int) -> LogLines:
        line = LogLine(time="2026-12-01T00:00:00Z", text=text)
        return LogLines(
            namespace=world.project, job="train", attempt=world.attempt, index=0, attempt_no=1, node=node,
            offset=offset, end=offset + len(text) + 1, lines=[line],
        )  # fmt: skip

    n1, n2 = world.of("agent-n1").jetstream(), world.of("agent-n2").jetstream()
    subject = log_subject("n1", world.project, "train", world.attempt)
    await n1.publish(subject, msgspec.json.encode(batch("n1", "genuine", 0)))
    forged_subject = log_subject("n2", world.project, "train", world.attempt)
    await n2.publish(forged_subject, msgspec.json.encode(batch("n2", "forged", 8)))
    await n2.publish(forged_subject, msgspec.json.encode(batch("n1", "lying", 16)))
    gw = world.of("gateway")
    before = FORGERIES.total
    reader = LogReader(
        gw.jetstream(), f"nodus.logs.*.{world.project}.train.*", lambda s: True,
        ObjectStore(gw, "attempts", Attempt),
    )  # fmt: skip
    await reader.open()
    try:
        shown: list[str] = []
        while not reader.caught_up:
            shown += [line.text for line in await reader.next(5)]
    finally:
        await reader.close()
    assert shown == ["genuine"]
    assert FORGERIES.total == before + 2


# -- the agent runs only what is bound to it -------------------------------------------------------------
async def test_the_agent_runs_no_assignment_that_is_not_its_own(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    project = world.project
    scheduler = world.of("scheduler")
    # An Attempt bound to n2, and a StartAttempt for it sent to n1 (by the scheduler's credential: no
    # one else may publish assignments), whose program would write a file if it ran.
    other = await bind_attempt(scheduler, project, f"train-{uuid.uuid4().hex[:8]}-0-a1", world.job, "n2")
    marker = tmp_path / "ran"
    msg = StartAttempt(
        namespace=project, job="train", attempt=other.metadata.name or "", index=0, attempt_no=1, node="n1",
        command=[sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"],
        job_uid=world.job.metadata.uid,
    )  # fmt: skip
    settings = Settings(
        service="nodus-agent",
        nats_url=world.url,
        nats_nkey_seed=str(world.creds.seed("agent-n1")),
        env={
            "NODUS_AGENT_NODE": "n1",
            "NODUS_AGENT_WORKDIR": str(tmp_path / "agent"),
            "NODUS_AGENT_FAKE_GPUS": "true",
            "NODUS_AGENT_STOP_GRACE_S": "2",
        },
    )
    service = AgentService(settings)
    task = asyncio.create_task(service.run(), name="agent-n1")
    dead = await world.of("operator").subscribe("nodus.dead.NODUS_ASSIGNMENTS.agent-n1")
    try:

        def consuming() -> bool:
            if task.done():
                task.result()
            return service.consumer is not None

        await eventually(consuming, deadline_s=20, message="the agent never started consuming")
        with caplog.at_level(logging.WARNING):
            await messaging.publish(scheduler.jetstream(), "nodus.assign.n1", msg, msg_id=uuid.uuid4().hex)
            letter = await dead.next_msg(timeout=10)
        assert letter.headers is not None and "not bound to node n1" in str(letter.headers)
        assert not marker.exists()
        assert not (tmp_path / "agent" / project / (other.metadata.name or "")).exists()
    finally:
        await dead.unsubscribe()
        service.stopping.set()
        await asyncio.wait_for(task, 20)


async def _refused_count(service: str, what: str) -> float:
    labels = {"service": service, "what": what}
    return REGISTRY.get_sample_value("nodus_node_messages_refused_total", labels) or 0.0
