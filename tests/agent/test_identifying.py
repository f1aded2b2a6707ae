"""A run's ServiceAccount on the node (ADR-0037, nodus_agent.identifying): the env and files the program
gets under each runtime, the token masked in its shipped log and its finish report, the files gone when
the attempt ends, and a run whose account the gateway could not grant failing without running.

The gateway's answer is given by a stand-in for the agent's Grants (the minting and the Node authorizer
are tested in tests/gateway/test_service_accounts.py, the whole path in tests/e2e/test_service_accounts.py);
reports and logs go to the session's real nats-server, containers to podman.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from nodus_agent import identifying
from nodus_agent.attemptdir import FINISHED, AttemptDir, Record
from nodus_agent.configuring import Ulimit
from nodus_agent.containers import ContainerRuntime
from nodus_agent.dockerapi import DockerAPI
from nodus_agent.dockerruntime import DockerRuntime
from nodus_agent.granting import Granted, Grants
from nodus_agent.logshipping import MASK, STREAM, LogLines, log_subject
from nodus_agent.preparing import Toolkit
from nodus_agent.reporting import Reporter
from nodus_agent.running import Runner
from nodus_agent.runtimes import ProcessRuntime, Runtime
from nodus_agent.settings import AgentSettings
from nodus_schema.messages import AttemptFinished, StartAttempt
from nodus_schema.noding import RunSecrets, ServiceAccountGrant
from nodus_testing.podman import PodmanService
from nodus_testing.waiting import eventually

NS = "team-a"
TOKEN = "nodus-sa.team-a.train-0-a1." + "T0k3n_" * 7 + "x"
CA = "-----BEGIN CERTIFICATE-----\nMIIBlocal\n-----END CERTIFICATE-----\n"
URL = "https://nodus.example.com"
SANDBOX = [Ulimit("nofile", 1024, 1024), Ulimit("nproc", 1024, 1024)]


class GatewaySays(Grants):
    """The gateway's answer for every Attempt: this one (the real Grants asks the bus)."""

    def __init__(self, nc: NATS, node: str, answer: RunSecrets) -> None:
        super().__init__(nc, node)
        self.answer = answer

    async def of(self, msg: StartAttempt) -> Granted:
        return Granted.of(msg.namespace, self.answer)


def granted(ca: str | None = CA) -> RunSecrets:
    grant = ServiceAccountGrant(name="trainer", token=TOKEN, url=URL, ca_pem=ca)
    return RunSecrets(job="train", job_uid="u", service_account=grant)


def runner(nc: NATS, node: str, workdir: Path, answer: RunSecrets, runtime: Runtime | None = None) -> Runner:
    settings = AgentSettings.from_env(
        {"NODUS_AGENT_NODE": node, "NODUS_AGENT_WORKDIR": str(workdir), "NODUS_AGENT_FAKE_GPUS": "true"}
    )
    toolkit = Toolkit(nc=nc, grants=GatewaySays(nc, node, answer))
    return Runner(settings, Reporter(nc.jetstream(), node), runtime or ProcessRuntime(workdir), toolkit)


def start(node: str, attempt: str, **fields: Any) -> StartAttempt:
    return StartAttempt(
        namespace=NS, job="train", attempt=attempt, index=0, attempt_no=1, node=node, **fields
    )


async def finished(workdir: Path, attempt: str) -> AttemptFinished:
    adir = AttemptDir(workdir, NS, attempt)

    def done() -> Record | None:
        record = adir.load()
        return record if record is not None and record.phase == FINISHED else None

    record = await eventually(done, deadline_s=30, message=f"{attempt} never finished")
    assert record.report is not None
    return record.report


async def shipped(nc: NATS, node: str, attempt: str) -> list[str]:
    """Every line NODUS_LOGS holds for the attempt."""
    js, subject = nc.jetstream(), log_subject(node, NS, "train", attempt)
    try:
        last = await js.get_last_msg(STREAM, subject)
    except NotFoundError:
        return []
    sub = await js.subscribe(
        subject, stream=STREAM, ordered_consumer=True, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    lines: list[str] = []
    try:
        seq = 0
        while seq < (last.seq or 0):
            msg = await sub.next_msg(timeout=5)
            seq = msg.metadata.sequence.stream
            lines += [line.text for line in msgspec.json.decode(msg.data, type=LogLines).lines]
    finally:
        await sub.unsubscribe()
    return lines


PROGRAM = """
import json, os, pathlib
env = {k: os.environ.get(k, "") for k in ("NODUS_TOKEN", "NODUS_URL", "NODUS_CA", "NODUS_SA_DIR")}
folder = pathlib.Path(env["NODUS_SA_DIR"])
out = pathlib.Path(os.environ["NODUS_OUTPUTS"])
(out / "env.txt").write_text(json.dumps(env))
(out / "files.txt").write_text(json.dumps(sorted(p.name for p in folder.iterdir())))
assert (folder / "token").read_text() == env["NODUS_TOKEN"]
assert pathlib.Path(env["NODUS_CA"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
print("my token is", env["NODUS_TOKEN"], flush=True)
raise SystemExit(3)
"""


async def test_a_local_process_gets_its_token_url_and_ca_and_never_shows_the_token(
    nc: NATS, unique: str, tmp_path: Path
) -> None:
    msg = start(unique, f"{unique}-p", command=[sys.executable, "-c", PROGRAM])
    await runner(nc, unique, tmp_path, granted()).start(msg)
    report = await finished(tmp_path, msg.attempt)

    assert (report.reason, report.exit_code) == ("Error", 3)  # the asserts passed; it exits 3 on purpose
    adir = AttemptDir(tmp_path, NS, msg.attempt)
    env = json.loads((adir.outputs / "env.txt").read_text())
    assert env == {
        "NODUS_TOKEN": TOKEN,
        "NODUS_URL": URL,
        "NODUS_CA": str(adir.serviceaccount / "ca.crt"),
        "NODUS_SA_DIR": str(adir.serviceaccount),
    }
    assert json.loads((adir.outputs / "files.txt").read_text()) == ["ca.crt", "token"]
    # Masked where it leaves the node: the report's log tail and the shipped log.
    assert report.message is not None and f"my token is {MASK}" in report.message
    assert TOKEN not in report.message
    lines = await eventually(lambda: shipped(nc, unique, msg.attempt), message="no log shipped")
    assert any(f"my token is {MASK}" in line for line in lines)
    assert not any(TOKEN in line for line in lines)
    # Gone from the node's disk once the attempt ended.
    assert not adir.serviceaccount.exists()


async def test_without_a_private_ca_there_is_no_nodus_ca(nc: NATS, unique: str, tmp_path: Path) -> None:
    program = (
        "import os; open(os.environ['NODUS_OUTPUTS'] + '/ca', 'w').write(os.environ.get('NODUS_CA', '-'))"
    )
    msg = start(unique, f"{unique}-n", command=[sys.executable, "-c", program])
    await runner(nc, unique, tmp_path, granted(ca=None)).start(msg)
    assert (await finished(tmp_path, msg.attempt)).reason == "Completed"
    assert (AttemptDir(tmp_path, NS, msg.attempt).outputs / "ca").read_text() == "-"


async def test_a_job_without_an_account_gets_none_of_it(nc: NATS, unique: str, tmp_path: Path) -> None:
    program = (
        "import os; assert not any(k in os.environ for k in ('NODUS_TOKEN', 'NODUS_SA_DIR', 'NODUS_URL'))"
    )
    msg = start(unique, f"{unique}-none", command=[sys.executable, "-c", program])
    await runner(nc, unique, tmp_path, RunSecrets(job="train", job_uid="u")).start(msg)
    assert (await finished(tmp_path, msg.attempt)).reason == "Completed"
    assert not AttemptDir(tmp_path, NS, msg.attempt).serviceaccount.exists()


async def test_an_account_the_gateway_could_not_grant_fails_the_run_before_it_starts(
    nc: NATS, unique: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    msg = start(unique, f"{unique}-m", command=[sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    answer = RunSecrets(job="train", job_uid="u", missing=["ServiceAccount/trainer"])
    await runner(nc, unique, tmp_path, answer).start(msg)
    report = await finished(tmp_path, msg.attempt)
    assert report.reason == "Error" and report.message is not None
    assert "ServiceAccount trainer" in report.message and "NODUS_PUBLIC_URL" in report.message
    assert not marker.exists()


def test_removing_the_folder_works_on_its_read_only_modes(tmp_path: Path) -> None:
    adir = AttemptDir(tmp_path, NS, "a1")
    identity = identifying.write(granted().service_account or _never(), adir)
    assert identity.folder.stat().st_mode & 0o777 == 0o500
    assert (identity.folder / "token").stat().st_mode & 0o777 == 0o400
    identifying.remove(adir)
    assert not adir.serviceaccount.exists()
    identifying.remove(adir)  # nothing there: nothing to do


def _never() -> ServiceAccountGrant:
    raise AssertionError("granted() always has a grant")


# -- containers ----------------------------------------------------------------------------------------------
@pytest.fixture
async def docker(podman: PodmanService) -> AsyncIterator[DockerAPI]:
    api = DockerAPI(podman.socket_path)
    yield api
    await api.close()


@pytest.mark.containers
async def test_a_container_sees_them_read_only_at_nodus_serviceaccount(
    nc: NATS, docker: DockerAPI, busybox_image: str, unique: str, tmp_path: Path
) -> None:
    runtime = DockerRuntime(ContainerRuntime(docker, unique, SANDBOX, engine_grace_s=2))
    script = """
        echo "sa=$NODUS_SA_DIR ca=$NODUS_CA url=$NODUS_URL" > /nodus/outputs/env.txt
        cat /nodus/serviceaccount/token > /nodus/outputs/token.txt
        if touch /nodus/serviceaccount/x 2>/dev/null; then echo writable; else echo read-only; fi
        test "$(cat /nodus/serviceaccount/token)" = "$NODUS_TOKEN" && echo same-token
    """
    msg = start(unique, f"{unique}-c", image=busybox_image, command=["sh", "-c", textwrap.dedent(script)])
    await runner(nc, unique, tmp_path, granted(), runtime).start(msg)
    report = await finished(tmp_path, msg.attempt)

    assert report.reason == "Completed", report.message
    adir = AttemptDir(tmp_path, NS, msg.attempt)
    ca_path = "/nodus/serviceaccount/ca.crt"
    assert (adir.outputs / "env.txt").read_text() == f"sa=/nodus/serviceaccount ca={ca_path} url={URL}\n"
    assert (adir.outputs / "token.txt").read_text() == TOKEN
    log = adir.log.read_text()
    assert "read-only" in log and "same-token" in log
    assert not adir.serviceaccount.exists()
