"""spec.source on the node (ADR-0036): a git checkout or an uploaded blob in the attempt's src/, the run's
working directory, reported with the commit it resolved to.

On the real parts: a git host over https (``git_server``: git's own http-backend behind the local CA), the
session's SeaweedFS as the agent's store of blobs, the gateway's Node authorizer on the real nats-server
(a private repository's token comes from a Git Connection the Job lists), and the runner with the
process runtime as the agent drives it (and the docker runtime on podman, where it runs). Programs are
small ``python -c`` snippets that print what they see; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import secrets
import sys
import tarfile
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import zstandard
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from nodus_agent import s3
from nodus_agent.attemptdir import FINISHED, AttemptDir, Record
from nodus_agent.granting import Grants
from nodus_agent.preparing import Toolkit
from nodus_agent.reporting import Reporter
from nodus_agent.running import AGENT_RESTARTED, Runner
from nodus_agent.runtimes import Runtime, link_path
from nodus_agent.settings import AgentSettings, ConfigError
from nodus_agent.sourcing import GitCredential, mask, prefixes, program_path, repo_url
from nodus_kit.storing import ObjectStore
from nodus_schema.configs import Connection, ConnectionSpec, GitConnection, Secret
from nodus_schema.jobs import GitSource, InitCommand, Job, JobSpec, SecretKeySelector, Source
from nodus_schema.messages import AttemptFinished, AttemptStarted, Report, StartAttempt
from nodus_schema.meta import ObjectMeta
from nodus_schema.volumes import blob_key
from nodus_testing.binding import bind
from nodus_testing.gitserver import GitServer
from nodus_testing.seaweed import SeaweedS3
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("node_access")

NAMESPACE = "team-a"
# The program: where it runs, what it sees of the env contract, and the checkout's train.py.
SHOW = textwrap.dedent(
    """
    import os
    print("cwd=" + os.getcwd())
    print("src=" + os.environ.get("NODUS_SRC", "-"))
    print("mounts=" + os.environ.get("NODUS_MOUNTS", "-"))
    print("train=" + open("train.py").read().strip())
    """
)


# -- harness -------------------------------------------------------------------------------------------------
@dataclass
class Reports:
    """Every report the stream holds for one node (an ordered consumer from the first message)."""

    items: list[Report] = field(default_factory=list)
    decoder: msgspec.json.Decoder[Report] = field(default_factory=lambda: msgspec.json.Decoder(Report))

    async def on_msg(self, msg: Msg) -> None:
        self.items.append(self.decoder.decode(msg.data))

    def started(self, attempt: str) -> list[AttemptStarted]:
        return [r for r in self.items if isinstance(r, AttemptStarted) and r.attempt == attempt]

    async def finished(self, attempt: str) -> AttemptFinished:
        found = await eventually(
            lambda: [r for r in self.items if isinstance(r, AttemptFinished) and r.attempt == attempt],
            deadline_s=30,
            message=f"{attempt} never finished",
        )
        return found[0]


@dataclass
class Node:
    nc: NATS
    name: str
    runner: Runner
    reports: Reports
    workdir: Path
    git: GitServer

    def start_msg(self, attempt: str, source: Source, **fields: Any) -> StartAttempt:
        defaults: dict[str, Any] = {
            "namespace": NAMESPACE,
            "job": f"train-{self.name}",
            "index": 0,
            "attempt_no": 1,
            "command": [sys.executable, "-c", SHOW],
        }
        return StartAttempt(**{**defaults, **fields}, attempt=attempt, node=self.name, source=source)

    async def run(self, msg: StartAttempt) -> AttemptFinished:
        await bind(self.nc, msg)  # what the scheduler writes first: the agent checks it (ADR-0026)
        await self.runner.start(msg)
        return await self.reports.finished(msg.attempt)

    def adir(self, attempt: str) -> AttemptDir:
        return AttemptDir(self.workdir, NAMESPACE, attempt)

    def log(self, attempt: str) -> str:
        return self.adir(attempt).log.read_text()


def settings_for(node: str, workdir: Path, git: GitServer) -> AgentSettings:
    return AgentSettings.from_env(
        {
            "NODUS_AGENT_NODE": node,
            "NODUS_AGENT_WORKDIR": str(workdir),
            "NODUS_AGENT_FAKE_GPUS": "true",
            "NODUS_AGENT_STOP_GRACE_S": "3",
            "NODUS_AGENT_CA_BUNDLE": str(git.ca),  # the test CA, as an operator sets a private one
            "NODUS_GIT_HOST": git.base,  # owner/name resolves against the test's git host
        }
    )


@pytest_asyncio.fixture(scope="module")
async def store_client(seaweed: SeaweedS3) -> AsyncIterator[tuple[Any, s3.S3Settings]]:
    """The agents' store: one bucket for the module (blobs are keyed by namespace and content)."""
    settings = s3.S3Settings(
        bucket=f"src-{secrets.token_hex(4)}",
        endpoint=seaweed.endpoint_url,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
    )
    async with s3.client(settings) as client:
        await client.create_bucket(Bucket=settings.bucket)
        yield client, settings


async def make_node(
    nc: NATS,
    name: str,
    workdir: Path,
    git: GitServer,
    store: tuple[Any, s3.S3Settings],
    runtime: Runtime | None,
) -> AsyncIterator[Node]:
    reports = Reports()
    sub = await nc.jetstream().subscribe(
        f"nodus.report.{name}.>",
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        cb=reports.on_msg,
    )
    client, store_settings = store
    toolkit = Toolkit(nc=nc, grants=Grants(nc, name), store=store_settings, s3=client)
    runner = Runner(settings_for(name, workdir, git), Reporter(nc.jetstream(), name), runtime, toolkit)
    try:
        yield Node(nc, name, runner, reports, workdir, git)
    finally:
        await runner.shutdown()
        await sub.unsubscribe()


@pytest_asyncio.fixture
async def node(
    nc: NATS, git_server: GitServer, store_client: tuple[Any, s3.S3Settings], unique: str, tmp_path: Path
) -> AsyncIterator[Node]:
    async for made in make_node(nc, unique, tmp_path / "agent", git_server, store_client, None):
        yield made


def git_source(repo: str, ref: str | None = None, path: str | None = None) -> Source:
    return Source(git=GitSource(repo=repo, ref=ref, path=path))


def tar_zst(files: dict[str, bytes], *, prefix: str = "./") -> bytes:
    """An archive as ``tar -C dir .`` writes one (members ``./x``), compressed with zstd."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor().compress(raw.getvalue())


async def upload_blob(store: tuple[Any, s3.S3Settings], data: bytes, *, as_digest: str | None = None) -> str:
    """``data`` at its blob key (what the gateway's upload leaves); ``as_digest`` puts it under another."""
    client, settings = store
    digest = as_digest or f"sha256:{hashlib.sha256(data).hexdigest()}"
    await client.put_object(Bucket=settings.bucket, Key=blob_key(NAMESPACE, digest), Body=data)
    return digest


def every_file_text(root: Path) -> str:
    """What the agent left on disk for an attempt (record, plan, start, log, the checkout's .git)."""
    return "\n".join(p.read_bytes().decode("utf-8", errors="replace") for p in root.rglob("*") if p.is_file())


# -- git -----------------------------------------------------------------------------------------------------
async def test_a_branch_a_tag_and_a_commit_are_checked_out_and_recorded(
    node: Node, git_server: GitServer, unique: str
) -> None:
    repo, first = git_server.create_repo(f"acme/{unique}", {"train.py": "v1\n"})
    second = repo.commit({"train.py": "v2\n"})
    repo.tag("v1.0", first)
    cases = {"branch": ("main", second, "v2"), "tag": ("v1.0", first, "v1"), "commit": (first, first, "v1")}

    for what, (ref, commit, content) in cases.items():
        msg = node.start_msg(f"{unique}-{what}", git_source(repo.url, ref))
        finished = await node.run(msg)

        assert finished.reason == "Completed", finished.message
        assert finished.source is not None
        assert (finished.source.repo, finished.source.ref, finished.source.commit) == (repo.url, ref, commit)
        (started,) = node.reports.started(msg.attempt)
        assert started.source == finished.source and started.source.millis is not None
        assert f"train={content}" in node.log(msg.attempt)


async def test_owner_name_resolves_against_the_git_host_and_the_head_is_followed(
    node: Node, git_server: GitServer, unique: str
) -> None:
    repo, _ = git_server.create_repo(f"acme/{unique}", {"train.py": "old\n"})
    newest = repo.commit({"train.py": "new\n"})
    msg = node.start_msg(f"{unique}-head", git_source(f"acme/{unique}"))  # no ref: the repository's HEAD

    finished = await node.run(msg)

    assert finished.reason == "Completed", finished.message
    assert finished.source is not None
    assert (finished.source.repo, finished.source.commit) == (f"{git_server.base}/acme/{unique}.git", newest)
    assert "train=new" in node.log(msg.attempt)


async def test_a_commit_no_branch_ends_at_is_fetched_by_its_short_id(
    node: Node, git_server: GitServer, unique: str
) -> None:
    # A server that serves no commit by id: the shallow fetch of an abbreviated id fails, the full one works.
    repo, first = git_server.create_repo(f"acme/{unique}", {"train.py": "first\n"}, any_commit=False)
    repo.commit({"train.py": "second\n"})
    msg = node.start_msg(f"{unique}-short", git_source(repo.url, first[:12]))

    finished = await node.run(msg)

    assert finished.reason == "Completed", finished.message
    assert finished.source is not None and finished.source.commit == first
    assert "train=first" in node.log(msg.attempt)


async def test_the_process_runs_in_the_checkout_with_nodus_src(
    node: Node, git_server: GitServer, unique: str
) -> None:
    repo, _ = git_server.create_repo(f"acme/{unique}", {"train.py": "here\n"})
    msg = node.start_msg(f"{unique}-cwd", git_source(repo.url, "main"))

    finished = await node.run(msg)

    assert finished.reason == "Completed", finished.message
    src = node.adir(msg.attempt).src
    log = node.log(msg.attempt)
    assert f"cwd={src}\n" in log and f"src={src}\n" in log and "train=here" in log
    # The default path /nodus/src is a link under NODUS_MOUNTS, as a container would see it there.
    mounts = node.adir(msg.attempt).mounts
    assert f"mounts={mounts}\n" in log
    assert (mounts / "nodus" / "src").resolve() == src.resolve()


async def test_a_working_dir_around_a_relative_checkout_path_is_taken_under_nodus_mounts(
    node: Node, git_server: GitServer, unique: str
) -> None:
    repo, _ = git_server.create_repo(f"acme/{unique}", {"train.py": "nested\n"})
    # The checkout at /work/code; the program starts in /work and reads code/train.py.
    program = "import os; print('cwd=' + os.getcwd()); print('train=' + open('code/train.py').read())"
    msg = node.start_msg(
        f"{unique}-wd",
        git_source(repo.url, "main", path="code"),
        working_dir="/work",
        command=[sys.executable, "-c", program],
    )

    finished = await node.run(msg)

    assert finished.reason == "Completed", finished.message
    log = node.log(msg.attempt)
    assert f"cwd={node.adir(msg.attempt).mounts / 'work'}\n" in log and "train=nested" in log


async def test_a_private_repository_is_fetched_with_its_git_connection_token_kept_out_of_sight(
    node: Node, git_server: GitServer, unique: str
) -> None:
    repo, commit = git_server.create_repo(f"private/{unique}", {"train.py": "secret-sauce\n"})
    token = git_server.token
    secret_store: ObjectStore[Secret] = ObjectStore(node.nc, "secrets", Secret)
    connections: ObjectStore[Connection] = ObjectStore(node.nc, "connections", Connection)
    await secret_store.create(
        Secret(
            metadata=ObjectMeta(name=f"{unique}-tok", namespace=NAMESPACE),
            data={"token": base64.b64encode(token.encode()).decode()},
        )
    )
    git = GitConnection(
        url=f"{git_server.base}/private", token_ref=SecretKeySelector(name=f"{unique}-tok", key="token")
    )
    meta = ObjectMeta(name=f"{unique}-git", namespace=NAMESPACE)
    await connections.create(Connection(metadata=meta, spec=ConnectionSpec(type="Git", git=git)))
    msg = node.start_msg(f"{unique}-priv", git_source(repo.url, "main"))
    # The Job lists the Connection: only then does the Node authorizer hand it (and its Secret) out.
    job = Job(
        metadata=ObjectMeta(name=msg.job, namespace=NAMESPACE, uid=f"{unique}-uid"),
        spec=JobSpec(command=list(msg.command), connections=[f"{unique}-git"]),
    )
    await ObjectStore(node.nc, "jobs", Job).create(job)

    finished = await node.run(msg)

    assert finished.reason == "Completed", finished.message
    assert finished.source is not None and finished.source.commit == commit
    assert "train=secret-sauce" in node.log(msg.attempt)
    # The token went to the git host as basic auth, and nowhere else: not in the log, the reports, the
    # attempt's files (record, plan, start message, the checkout's .git/config) or the Job's messages.
    sent = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    assert any(r.authorization == f"Basic {sent}" for r in git_server.requests if unique in r.path)
    leaks = [token, sent]
    on_disk = every_file_text(node.adir(msg.attempt).root)
    reports = "\n".join(msgspec.json.encode(r).decode() for r in node.reports.items)
    for text in (on_disk, reports):
        assert not any(leak in text for leak in leaks)


async def test_a_private_repository_without_a_connection_is_source_unavailable_saying_what_to_create(
    node: Node, git_server: GitServer, unique: str
) -> None:
    repo, _ = git_server.create_repo(f"private/{unique}", {"train.py": "x\n"})
    msg = node.start_msg(f"{unique}-noauth", git_source(repo.url, "main"))

    finished = await node.run(msg)

    assert finished.reason == "SourceUnavailable"
    assert finished.message is not None and "create a Git Connection" in finished.message
    assert not node.reports.started(msg.attempt)  # nothing ran: never billed as Running


async def test_a_missing_ref_is_source_unavailable_with_gits_error_and_a_fix(
    node: Node, git_server: GitServer, unique: str
) -> None:
    repo, _ = git_server.create_repo(f"acme/{unique}", {"train.py": "x\n"})
    msg = node.start_msg(f"{unique}-noref", git_source(repo.url, "no-such-branch"))

    finished = await node.run(msg)

    assert (finished.reason, finished.exit_code) == ("SourceUnavailable", None)
    assert finished.message is not None
    assert "couldn't find remote ref no-such-branch" in finished.message  # git's own words
    assert "Fix: the ref 'no-such-branch' is not in" in finished.message
    # What was tried, without a commit (none was reached).
    assert finished.source is not None
    assert (finished.source.repo, finished.source.ref, finished.source.commit) == (
        repo.url, "no-such-branch", None,
    )  # fmt: skip
    assert not node.reports.started(msg.attempt)


async def test_a_vanished_repository_is_source_unavailable(
    node: Node, git_server: GitServer, unique: str
) -> None:
    git_server.create_repo(f"acme/{unique}", {"train.py": "x\n"})
    git_server.delete_repo(f"acme/{unique}")
    msg = node.start_msg(f"{unique}-gone", git_source(f"acme/{unique}", "main"))

    finished = await node.run(msg)

    assert finished.reason == "SourceUnavailable"
    assert finished.message is not None
    assert "not found" in finished.message and "does not exist" in finished.message
    assert "check spec.source.git.repo" in finished.message


# -- blobs ---------------------------------------------------------------------------------------------------
async def test_an_uploaded_blob_is_extracted_into_the_checkout(
    node: Node, store_client: tuple[Any, s3.S3Settings], unique: str
) -> None:
    digest = await upload_blob(store_client, tar_zst({"train.py": f"blob-{unique}\n".encode()}))
    msg = node.start_msg(f"{unique}-blob", Source(blob=digest))

    finished = await node.run(msg)

    assert finished.reason == "Completed", finished.message
    assert finished.source is not None
    assert (finished.source.blob, finished.source.commit) == (digest, None)
    assert f"train=blob-{unique}" in node.log(msg.attempt)
    assert f"cwd={node.adir(msg.attempt).src}\n" in node.log(msg.attempt)


async def test_a_blob_whose_bytes_do_not_match_its_digest_is_source_unavailable(
    node: Node, store_client: tuple[Any, s3.S3Settings], unique: str
) -> None:
    claimed = f"sha256:{hashlib.sha256(unique.encode()).hexdigest()}"
    await upload_blob(store_client, tar_zst({"train.py": b"tampered\n"}), as_digest=claimed)
    msg = node.start_msg(f"{unique}-tamper", Source(blob=claimed))

    finished = await node.run(msg)

    assert finished.reason == "SourceUnavailable"
    assert finished.message is not None and "is not what was uploaded" in finished.message
    assert finished.source is not None and finished.source.blob == claimed
    assert not any(node.adir(msg.attempt).src.iterdir())  # all or nothing


async def test_a_missing_or_hostile_blob_is_source_unavailable_and_writes_nothing_outside(
    node: Node, store_client: tuple[Any, s3.S3Settings], unique: str
) -> None:
    missing = f"sha256:{hashlib.sha256(f'missing-{unique}'.encode()).hexdigest()}"
    gone = await node.run(node.start_msg(f"{unique}-missing", Source(blob=missing)))
    assert gone.reason == "SourceUnavailable"
    assert gone.message is not None and f"is not in project {NAMESPACE}'s store" in gone.message

    hostile = await upload_blob(store_client, tar_zst({f"../escape-{unique}": b"x"}, prefix=""))
    msg = node.start_msg(f"{unique}-hostile", Source(blob=hostile))
    refused = await node.run(msg)
    assert refused.reason == "SourceUnavailable"
    assert refused.message is not None and "climbs" in refused.message
    assert not (node.adir(msg.attempt).root / f"escape-{unique}").exists()


# -- the docker runtime --------------------------------------------------------------------------------------
@pytest.mark.containers
async def test_a_container_runs_in_the_checkout_at_its_working_dir_init_command_included(
    nc: NATS,
    git_server: GitServer,
    store_client: tuple[Any, s3.S3Settings],
    busybox_image: str,
    podman: Any,
    unique: str,
    tmp_path: Path,
) -> None:
    from nodus_agent.configuring import Ulimit
    from nodus_agent.containers import ContainerRuntime
    from nodus_agent.dockerapi import DockerAPI
    from nodus_agent.dockerruntime import DockerRuntime

    api = DockerAPI(podman.socket_path)
    sandbox = [Ulimit("nofile", 1024, 1024), Ulimit("nproc", 1024, 1024)]
    runtime = DockerRuntime(ContainerRuntime(api, unique, sandbox, engine_grace_s=2))
    repo, commit = git_server.create_repo(f"acme/{unique}", {"train.py": "in-container\n"})
    script = 'echo "cwd=$(pwd) src=$NODUS_SRC"; cat train.py; cat made-by-init'
    try:
        async for made in make_node(nc, unique, tmp_path / "agent", git_server, store_client, runtime):
            msg = made.start_msg(
                f"{unique}-ctr",
                git_source(repo.url, "main"),
                image=busybox_image,
                working_dir="/workspace",
                command=["sh", "-c", script],
                init_command=InitCommand(command=["sh", "-c", "test -f train.py && echo ok > made-by-init"]),
            )
            finished = await made.run(msg)

            assert finished.reason == "Completed", finished.message
            assert finished.source is not None and finished.source.commit == commit
            log = made.log(msg.attempt)
            assert "cwd=/workspace src=/workspace" in log and "in-container" in log and "ok" in log
    finally:
        await api.close()


# -- pure rules ----------------------------------------------------------------------------------------------
def test_repositories_resolve_and_urls_with_credentials_are_refused() -> None:
    assert repo_url("acme/app", "https://git.example.com") == "https://git.example.com/acme/app.git"
    assert repo_url("https://h.example/x/y.git") == "https://h.example/x/y.git"
    for bad, why in (
        ("http://h.example/x.git", "only https"),
        ("https://user:tok@h.example/x.git", "credentials in its URL"),
        ("acme", "owner/name"),
        ("-x/y", "owner/name"),
    ):
        with pytest.raises(ValueError, match=why):
            repo_url(bad)


def test_a_git_connection_applies_at_a_path_boundary_on_the_same_https_host() -> None:
    assert prefixes("https://h.example/team", "https://h.example/team/app.git")
    assert prefixes("https://H.example:443/", "https://h.example/team/app.git")
    assert not prefixes("https://h.example/team", "https://h.example/teamx/app.git")
    assert not prefixes("https://h.example", "https://other.example/team/app.git")
    assert not prefixes("https://h.example:8443", "https://h.example/team/app.git")
    assert not prefixes("http://h.example", "http://h.example/team/app.git")  # never a token over http


def test_git_output_is_masked_with_every_form_of_the_token() -> None:
    cred = GitCredential(connection="c", url="https://h.example", username="bot", token="s3cr3t-token")
    header = cred.header()
    assert header == f"Authorization: Basic {base64.b64encode(b'bot:s3cr3t-token').decode()}"
    text = mask(f"fatal: s3cr3t-token {header} {base64.b64encode(b's3cr3t-token').decode()}", cred.forms())
    assert "s3cr3t" not in text and header.split()[-1] not in text and "***" in text
    assert "s3cr3t" not in repr(cred)


def test_where_the_program_sees_the_checkout() -> None:
    def at(path: str | None, working_dir: str | None = None) -> str:
        msg = StartAttempt(
            namespace="n", job="j", attempt="a", index=0, attempt_no=1, node="x",
            source=git_source("a/b", path=path), working_dir=working_dir,
        )  # fmt: skip
        return program_path(msg)

    assert at(None) == "/nodus/src"
    assert at("code") == "/nodus/src/code"
    assert at("code", "/work") == "/work/code"
    assert at("/opt/code", "/work") == "/opt/code"
    assert at(None, "/work") == "/work"


def test_process_runtime_links_stay_inside_the_attempt_directory(tmp_path: Path) -> None:
    adir = AttemptDir(tmp_path, NAMESPACE, "a")
    assert link_path(adir, "/nodus/inputs/data") == adir.inputs / "data"
    assert link_path(adir, "/data/set") == adir.mounts / "data" / "set"
    for bad in ("/data/../../etc", "relative", "/"):
        with pytest.raises(ValueError, match="absolute and normalised"):
            link_path(adir, bad)


def test_the_git_host_setting_takes_https_only() -> None:
    base = {"NODUS_AGENT_NODE": "n"}
    assert AgentSettings.from_env(base).git_host == "https://github.com"
    assert AgentSettings.from_env({**base, "NODUS_GIT_HOST": "https://git.example/"}).git_host == (
        "https://git.example"
    )
    with pytest.raises(ConfigError, match="NODUS_GIT_HOST"):
        AgentSettings.from_env({**base, "NODUS_GIT_HOST": "http://git.example"})


async def test_finished_records_keep_the_source_for_a_repeated_report(
    node: Node, git_server: GitServer, unique: str
) -> None:
    repo, commit = git_server.create_repo(f"acme/{unique}", {"train.py": "again\n"})
    msg = node.start_msg(f"{unique}-again", git_source(repo.url, "main"))
    await node.run(msg)

    record = msgspec.json.decode(node.adir(msg.attempt).record_path.read_bytes(), type=Record)
    assert record.phase == FINISHED and record.report is not None
    assert record.report.source is not None and record.report.source.commit == commit
    plan = node.adir(msg.attempt).load_plan()
    assert plan is not None and plan.source == record.report.source


async def test_a_restarted_agent_reports_the_checkout_of_the_run_it_found(
    node: Node, git_server: GitServer, unique: str
) -> None:
    repo, commit = git_server.create_repo(f"acme/{unique}", {"train.py": "long\n"})
    # Blocks until a signal: it runs until the next agent stops it.
    wait = "import signal\nsignal.pause()"
    msg = node.start_msg(
        f"{unique}-orphan", git_source(repo.url, "main"), command=[sys.executable, "-c", wait]
    )
    await bind(node.nc, msg)
    await node.runner.start(msg)
    await eventually(lambda: node.reports.started(msg.attempt), message="never started")
    # The agent is killed while the program runs: its watch ends, the program and the files stay.
    run = node.runner.runs[(NAMESPACE, msg.attempt)]
    assert run.task is not None
    run.task.cancel()
    await asyncio.gather(run.task, return_exceptions=True)

    # The next agent has no plan in memory: it reads what the first one saved beside the record.
    again = Runner(node.runner.settings, Reporter(node.nc.jetstream(), node.name), None, node.runner.toolkit)
    await again.recover()

    finished = await node.reports.finished(msg.attempt)
    assert (finished.reason, finished.message) == ("Lost", AGENT_RESTARTED)  # a process cannot be re-adopted
    assert finished.source is not None and finished.source.commit == commit
