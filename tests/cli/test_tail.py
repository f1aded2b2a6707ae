"""``nodus tail``: the subject -> type table (pure), decoding and rendering, and the command itself run as
a process against the session's real nats-server, one message of each kind published on the bus."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_cli import tailing
from nodus_cli.cli import main
from nodus_kit import declaring, messaging, permitting
from nodus_kit.connecting import connect
from nodus_kit.storing import ObjectStore
from nodus_schema import subjects
from nodus_schema.billing import AccountRequest, HoldRequest
from nodus_schema.configs import Secret
from nodus_schema.estimating import EstimateRequest, QuoteRequest
from nodus_schema.messages import (
    AttemptFinished,
    AttemptStarted,
    LogLine,
    LogLines,
    ObjectEvent,
    StartAttempt,
    StopAttempt,
    StopReason,
)
from nodus_schema.meta import ObjectMeta, now_rfc3339
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_testing.natsserver import NatsServer
from nodus_testing.processes import free_port
from nodus_testing.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
BUS_MD = ROOT / "docs" / "bus.md"

# -- the subject table ----------------------------------------------------------------------------------
# One concrete subject for each row of docs/bus.md's subject table, with the type it must decode to.
EXAMPLES = [
    ("$KV.sweeps.default.lr", "Sweep"),
    ("$KV.jobs.default.lr-0", "Job"),
    ("$KV.attempts.default.lr-0-abcd1234-0-a1", "Attempt"),
    ("$KV.nodes._.h100-us-1", "Node"),
    ("$KV.accounts._.team-a", "BillingBook"),
    ("$KV.funding.default.lr-0", "Funding"),
    ("$KV.budgets.default.monthly", "Budget"),
    ("$KV.offerings._.h100-sxm-80g-x8-us", "Offering"),
    ("$KV.secrets.default.db", "Secret"),
    ("$KV.connections.default.warehouse", "Connection"),
    ("$KV.tokens._.0123456789abcdef01234567", "TokenRecord"),
    ("$KV.projects._.team-a", "Project"),
    ("$KV.leases.scheduler", "LeaseRecord"),
    ("$KV.jobs._meta.compacted", "CompactedRevision"),
    ("nodus.assign.h100-us-1", "Assignment"),
    ("nodus.report.h100-us-1.default.lr-0-abcd1234-0-a1", "Report"),
    ("nodus.logs.n1.default.lr-0.lr-0-abcd1234-0-a1", "LogLines"),
    ("nodus.events.default.jobs.lr-0", "ObjectEvent"),
    ("nodus.events._.nodes.h100-us-1", "ObjectEvent"),
    ("nodus.dead.NODUS_REPORTS.billing", "Report"),
    ("nodus.dead.NODUS_ASSIGNMENTS.agent-h100-us-1", "Assignment"),
    ("nodus.dead.NODUS_ASSIGNMENTS.simfleet-a-0", "Assignment"),
    ("nodus.dead.NODUS_OTHER.someone", "DeadLetter"),
    ("nodus.rpc.scheduler.estimate", "EstimateRequest"),
    ("nodus.rpc.billing.quote", "QuoteRequest"),
    ("nodus.rpc.billing.hold", "HoldRequest"),
    ("nodus.rpc.billing.account", "AccountRequest"),
    ("nodus.rpc.billing.grant", "GrantRequest"),
    ("nodus.rpc.billing.usage", "UsageRequest"),
    ("nodus.rpc.node.n1.secrets", "RunSecretsRequest"),
    ("nodus.rpc.node.n1.retention", "RetentionRequest"),
    ("nodus.billing.anything.at.all", subjects.UNKNOWN),
]


@pytest.mark.parametrize(("subject", "type_name"), EXAMPLES)
def test_every_documented_subject_maps_to_its_type(subject: str, type_name: str) -> None:
    row = subjects.subject_type(subject)
    assert row is not None and row.type_name == type_name


@pytest.mark.parametrize("subject", ["nodus.unknown.x", "nodus.report.too.short", "foo", "$KV.nobucket.a.b"])
def test_subjects_outside_the_tree_have_no_type(subject: str) -> None:
    assert subjects.subject_type(subject) is None


def _documented_subjects() -> list[str]:
    """The first column of docs/bus.md's "Subjects" table, placeholders filled in."""
    text = BUS_MD.read_text().split("## Subjects", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \|", text, flags=re.M)
    fill = {"<ns>": "default", "<name>": "x", "<node>": "n1", "<attempt>": "a1", "<job>": "j"}
    fill |= {"<plural>": "jobs", "<stream>": "NODUS_REPORTS", "<consumer>": "billing"}
    out = []
    for row in rows:
        for bucket in subjects.KV_TYPES if "<bucket>" in row else [""]:
            subject = row.replace("<bucket>", bucket)
            for k, v in fill.items():
                subject = subject.replace(k, v)
            out.append(subject.replace(">", "x"))
    return out


def test_the_table_covers_every_subject_bus_md_lists() -> None:
    documented = _documented_subjects()
    assert len(documented) > 20  # the table was found and read
    missing = [s for s in documented if subjects.subject_type(s) is None]
    assert not missing, f"docs/bus.md subjects without a row in nodus_schema.subjects: {missing}"


def test_streams_and_buckets_agree_with_the_declarations() -> None:
    declared = {s.name: s.subjects for s in declaring.STREAMS} | {
        f"KV_{b.name}": [f"$KV.{b.name}.>"] for b in declaring.BUCKETS
    }
    assert {s.name: [s.subject] for s in subjects.STREAMS} == declared
    work_queues = {s.name for s in declaring.STREAMS if s.retention.value == "workqueue"}
    assert {s.name for s in subjects.STREAMS if s.work_queue} == work_queues
    for row in subjects.SUBJECTS:
        assert row.stream is None or row.stream in declared, row


@pytest.mark.parametrize(
    ("filter_subject", "stream"),
    [
        ("nodus.report.>", "NODUS_REPORTS"),
        ("nodus.report.n1.*.*", "NODUS_REPORTS"),
        ("$KV.jobs.>", "KV_jobs"),
        ("$KV.jobs.default.*", "KV_jobs"),
        ("nodus.assign.n1", "NODUS_ASSIGNMENTS"),
        ("nodus.>", None),
        (">", None),
        ("$KV.>", None),
        ("nodus.rpc.>", None),
        ("nodus.*.n1", None),
    ],
)
def test_a_filter_is_read_from_a_stream_only_when_one_stream_holds_all_it_matches(
    filter_subject: str, stream: str | None
) -> None:
    found = subjects.stream_for(filter_subject)
    assert (found.name if found else None) == stream


# -- decoding and rendering -----------------------------------------------------------------------------
NOW = datetime(2026, 11, 30, 12, 0, 1, 250_000, tzinfo=UTC)


def _enc(msg: object) -> bytes:
    return msgspec.json.encode(msg)


def test_a_union_names_its_member_and_the_summary_says_what_happened() -> None:
    msg = AttemptFinished(
        namespace="default",
        attempt="a1",
        node="n1",
        time=NOW.isoformat(),
        exit_code=3,
        wall_millis=5,
        reason="Error",
    )
    d = tailing.decode("nodus.report.n1.default.a1", {}, _enc(msg), NOW)
    assert d.type == "AttemptFinished"
    (line,) = tailing.render_text(d)
    assert (
        line == "12:00:01.250 nodus.report.n1.default.a1 AttemptFinished"
        " attempt=default/a1 node=n1 reason=Error exitCode=3"
    )


def test_a_kv_object_shows_its_kind_name_and_phase_and_a_delete_marker_says_deleted() -> None:
    node = Node(
        metadata=ObjectMeta(name="n1"),
        spec=NodeSpec(offering="l4-x1-us", region_class="us"),
        status=NodeStatus(phase="Ready"),
    )
    d = tailing.decode("$KV.nodes._.n1", {"Nodus-Op": "create"}, _enc(node), NOW)
    assert d.type == "Node"
    assert tailing.summarize(d) == "ADDED Node n1 phase=Ready"
    gone = tailing.decode("$KV.nodes._.n1", {"KV-Operation": "DEL", "Nodus-Op": "delete"}, _enc(node), NOW)
    assert tailing.summarize(gone).startswith("DELETED Node n1")


def test_secret_values_never_reach_the_output() -> None:
    secret = Secret(metadata=ObjectMeta(name="db", namespace="default"), data={"password": "aHVudGVyMg=="})
    d = tailing.decode("$KV.secrets.default.db", {"Nodus-Op": "create"}, _enc(secret), NOW)
    out = tailing.render_json(d) + "\n".join(tailing.render_text(d))
    assert "aHVudGVyMg==" not in out
    assert json.loads(tailing.render_json(d))["data"]["data"] == {"password": "***"}


def test_log_lines_print_one_line_each() -> None:
    batch = LogLines(
        namespace="default",
        job="j",
        attempt="a1",
        index=0,
        attempt_no=1,
        node="n1",
        offset=0,
        end=12,
        lines=[
            LogLine(time=NOW.isoformat(), text="hello"),
            LogLine(time=NOW.isoformat(), text="world", stream="stderr"),
        ],
    )
    lines = tailing.render_text(tailing.decode("nodus.logs.n1.default.j.a1", {}, _enc(batch), NOW))
    assert [line.split(" ", 3)[3] for line in lines] == ["default/a1 log: hello", "default/a1 stderr: world"]


def test_unknown_subjects_and_undecodable_payloads_print_raw_with_type_unknown() -> None:
    d = tailing.decode("nodus.nothing.here", {}, b"x" * 500, NOW)
    assert d.type == "?"
    (line,) = tailing.render_text(d)
    assert line.endswith("x" * tailing.RAW_LIMIT + "…")
    bad = tailing.decode("nodus.report.n1.default.a1", {}, b'{"type":"Nope"}', NOW)
    assert bad.type == "?" and bad.data == {"type": "Nope"}


def test_json_output_has_subject_type_headers_and_data() -> None:
    msg = StopAttempt(namespace="default", attempt="a1", reason=StopReason.CANCELLED)
    out = json.loads(
        tailing.render_json(tailing.decode("nodus.assign.n1", {"Nats-Msg-Id": "x"}, _enc(msg), NOW))
    )
    assert out["subject"] == "nodus.assign.n1" and out["type"] == "StopAttempt"
    assert out["headers"] == {"Nats-Msg-Id": "x"}
    assert out["data"]["reason"] == "Cancelled" and out["time"] == "2026-11-30T12:00:01.250Z"


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("5m", 300), ("1h30m", 5400), ("2d", 172800), ("500ms", 0.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert tailing.duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "argv",
    [
        ["tail"],
        ["tail", "nodus..x"],
        ["tail", "nodus.>.x"],
        ["tail", "nodus.report.>", "--since", "5 minutes"],
        ["tail", "nodus.report.>", "--since", "5m", "--all"],
        ["tail", "nodus.report.>", "-o", "yaml"],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    assert main(argv) == 2


def test_the_nats_url_comes_from_the_flag_the_environment_then_local_env(tmp_path: Path) -> None:
    (tmp_path / ".nodus").mkdir()
    (tmp_path / ".nodus" / "local.env").write_text("NODUS_NATS_URL=nats://127.0.0.1:4333\n")
    sub = tmp_path / "deeper"
    sub.mkdir()
    assert tailing.nats_url(None, {}, sub) == "nats://127.0.0.1:4333"
    assert tailing.nats_url(None, {"NODUS_NATS_URL": "nats://e:1"}, sub) == "nats://e:1"
    assert tailing.nats_url("nats://f:2", {"NODUS_NATS_URL": "nats://e:1"}, sub) == "nats://f:2"


def test_the_seed_comes_from_the_flag_the_environment_then_local_env(tmp_path: Path) -> None:
    """The bus refuses anonymous clients (#17): `make up` writes the operator's seed to local.env, and
    `nodus tail` uses it unless told otherwise."""
    (tmp_path / ".nodus").mkdir()
    (tmp_path / ".nodus" / "local.env").write_text("NODUS_NATS_OPERATOR_SEED=/stack/operator.nk\n")
    assert tailing.nkey_seed(None, {}, tmp_path) == "/stack/operator.nk"
    assert tailing.nkey_seed(None, {"NODUS_NATS_OPERATOR_SEED": "/env.nk"}, tmp_path) == "/env.nk"
    assert tailing.nkey_seed("/flag.nk", {"NODUS_NATS_OPERATOR_SEED": "/env.nk"}, tmp_path) == "/flag.nk"


# -- the command, as a process --------------------------------------------------------------------------
class Running:
    """A ``nodus tail`` process whose output lines are collected as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        assert proc.stdout is not None and proc.stderr is not None
        self._readers = [
            asyncio.create_task(self._read(proc.stdout, self.out)),
            asyncio.create_task(self._read(proc.stderr, self.err)),
        ]

    @staticmethod
    async def _read(stream: asyncio.StreamReader, into: list[str]) -> None:
        async for line in stream:
            into.append(line.decode().rstrip("\n"))

    async def following(self) -> None:
        await eventually(
            lambda: any("following" in line for line in self.err) or self.proc.returncode is not None,
            deadline_s=20,
            message="nodus tail never said it was following",
        )
        assert self.proc.returncode is None, self.err

    async def line(self, predicate: Callable[[str], bool], what: str) -> str:
        found: list[str] = []

        def seen() -> bool:
            found[:] = [line for line in self.out if predicate(line)]
            return bool(found)

        await eventually(seen, deadline_s=15, message=f"{what}; stdout {self.out}, stderr {self.err}")
        return found[0]

    async def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        code = await asyncio.wait_for(self.proc.wait(), 15)
        await asyncio.gather(*self._readers)
        return code


async def _tail(nats_url: str, *args: str, seed: Path | None = None) -> Running:
    credential = ["--nkey-seed", str(seed)] if seed is not None else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodus_cli",
        "tail",
        *args,
        "--server",
        nats_url,
        *credential,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    return Running(proc)


@pytest_asyncio.fixture
async def tails() -> AsyncIterator[list[Running]]:
    started: list[Running] = []
    yield started
    for t in started:
        if t.proc.returncode is None:
            t.proc.kill()
            await t.proc.wait()


@pytest.mark.slow
async def test_tail_decodes_each_kind_of_message_live(
    nc: NATS, nats_url: str, nats_seed: Path, unique: str, tails: list[Running]
) -> None:
    js = nc.jetstream()
    await declaring.ensure(js)
    node, ns, job, attempt = f"n{unique}", "default", f"j{unique}", f"a{unique}"
    # Streams: from the start of a filter only this test publishes on, so no race with the subscription.
    reports = await _tail(nats_url, f"nodus.report.{node}.>", "--all", "-o", "json", seed=nats_seed)
    logs = await _tail(nats_url, f"nodus.logs.*.{ns}.{job}.*", "--all", seed=nats_seed)
    events = await _tail(nats_url, f"nodus.events.{ns}.jobs.{job}", "--since", "1h", seed=nats_seed)
    dead = await _tail(nats_url, f"nodus.dead.NODUS_REPORTS.c{unique}", "--all", seed=nats_seed)
    nodes = await _tail(nats_url, f"$KV.nodes._.{node}", "--all", seed=nats_seed)
    # Core subjects (requests, the assignments work queue, anything): live, once subscribed.
    everything = await _tail(nats_url, ">", seed=nats_seed)
    tails.extend([reports, logs, events, dead, nodes, everything])
    await asyncio.gather(*(t.following() for t in tails))

    started = AttemptStarted(namespace=ns, attempt=attempt, node=node, time=now_rfc3339())
    await messaging.publish(js, f"nodus.report.{node}.{ns}.{attempt}", started, msg_id=f"{attempt}:started")
    batch = LogLines(
        namespace=ns, job=job, attempt=attempt, index=0, attempt_no=1, node=node, offset=0, end=6,
        lines=[LogLine(time=now_rfc3339(), text=f"hello {unique}")],
    )  # fmt: skip
    await messaging.publish(js, f"nodus.logs.n1.{ns}.{job}.{attempt}", batch, msg_id=f"{attempt}:log:0-6")
    event = ObjectEvent(
        namespace=ns, kind="Job", name=job, uid=unique, reason="Running", message="placed", time=now_rfc3339()
    )
    await messaging.publish(js, f"nodus.events.{ns}.jobs.{job}", event, msg_id=f"event:{unique}:run")
    finished = AttemptFinished(
        namespace=ns,
        attempt=attempt,
        node=node,
        time=now_rfc3339(),
        exit_code=1,
        wall_millis=9,
        reason="Error",
    )
    await js.publish(
        f"nodus.dead.NODUS_REPORTS.c{unique}",
        msgspec.json.encode(finished),
        headers={messaging.DEAD_REASON: "gave up", messaging.DEAD_SUBJECT: "nodus.report.x"},
    )
    store = ObjectStore(nc, "nodes", Node)
    await store.create(
        Node(
            metadata=ObjectMeta(name=node),
            spec=NodeSpec(offering="l4-x1-us", region_class="us"),
            status=NodeStatus(phase="Ready"),
        )
    )
    start = StartAttempt(
        namespace=ns,
        job=job,
        attempt=attempt,
        index=0,
        attempt_no=1,
        node=node,
        image="busybox",
        command=["true"],
    )
    await messaging.publish(js, f"nodus.assign.{node}", start, msg_id=f"{ns}/{attempt}:start")
    await nc.publish("nodus.rpc.billing.account", msgspec.json.encode(AccountRequest(project=f"p{unique}")))
    await nc.publish(f"nodus.{unique}.what", b"not json at all")

    line = await reports.line(lambda s: attempt in s, "the report")
    out = json.loads(line)
    assert (out["subject"], out["type"]) == (f"nodus.report.{node}.{ns}.{attempt}", "AttemptStarted")
    assert out["headers"]["Nats-Msg-Id"] == f"{attempt}:started" and out["data"]["node"] == node
    await logs.line(lambda s: s.endswith(f"LogLines {ns}/{attempt} log: hello {unique}"), "the log line")
    await events.line(lambda s: f"ObjectEvent Job {ns}/{job} Running: placed" in s, "the event")
    await dead.line(
        lambda s: f"AttemptFinished attempt={ns}/{attempt}" in s and s.endswith("dead: gave up"),
        "the dead letter",
    )
    await nodes.line(
        lambda s: s.endswith(f"$KV.nodes._.{node} Node ADDED Node {node} phase=Ready"), "the node"
    )
    await everything.line(
        lambda s: f"nodus.assign.{node} StartAttempt attempt={ns}/{attempt} node={node}" in s,
        "the assignment",
    )
    await everything.line(
        lambda s: f"nodus.rpc.billing.account AccountRequest project=p{unique}" in s, "the request"
    )
    await everything.line(
        lambda s: s.endswith(f"nodus.{unique}.what ? not json at all"), "the unknown subject"
    )

    # Ctrl-C (and a SIGTERM) end it cleanly.
    codes = await asyncio.gather(
        *(t.stop(signal.SIGINT if i % 2 else signal.SIGTERM) for i, t in enumerate(tails))
    )
    assert codes == [0] * len(tails)


@pytest.mark.slow
async def test_tail_exits_1_with_the_fix_when_nats_cannot_be_reached(tails: list[Running]) -> None:
    running = await _tail(f"nats://127.0.0.1:{free_port()}", "nodus.report.>")
    tails.append(running)
    code = await asyncio.wait_for(running.proc.wait(), 30)
    await asyncio.gather(*running._readers)
    assert code == 1
    text = "\n".join(running.err)
    assert "cannot connect to NATS" in text and "fix:" in text and "--server" in text


def test_every_rpc_request_type_decodes() -> None:
    # The request types named in the table are the ones the services serve (a renamed one would not decode).
    for subject, msg in [
        (
            "nodus.rpc.billing.hold",
            HoldRequest(
                namespace="d", job="j", job_uid="u", attempt="a", rate_micros_per_hour=1, window_millis=1
            ),
        ),
    ]:
        assert tailing.decode(subject, {}, _enc(msg), NOW).type == type(msg).__name__
    assert subjects.RPC_TYPES["nodus.rpc.scheduler.estimate"][1] is EstimateRequest
    assert subjects.RPC_TYPES["nodus.rpc.billing.quote"][1] is QuoteRequest


@pytest.mark.slow
async def test_tail_reads_with_the_operator_credential_on_a_secured_bus(
    tmp_path: Path, tails: list[Running]
) -> None:
    """On a bus with credentials (ADR-0026) the operator's may only receive replies at its own inbox
    prefix: the ordered consumer's JetStream requests must use it, or they time out."""
    creds = permitting.generate(tmp_path / "credentials")
    with NatsServer(extra_config=creds.accounts.read_text()) as server:
        await permitting.declare(server.url, creds.seed("admin"))
        events = await _tail(
            server.url, "nodus.events.>", "--all", "--nkey-seed", str(creds.seed("operator"))
        )
        tails.append(events)
        await events.following()
        publisher = await connect(server.url, "tail-test", nkey_seed=creds.seed("scheduler"))
        try:
            event = ObjectEvent(
                namespace="default", kind="Job", name="j", uid="u", reason="Running", message="placed",
                time=now_rfc3339(),
            )  # fmt: skip
            await messaging.publish(publisher.jetstream(), "nodus.events.default.jobs.j", event, msg_id="e:1")
        finally:
            await publisher.close()
        await events.line(lambda line: "default/j" in line and "Running" in line, "the event was not printed")
        assert await events.stop() == 0
        assert not any("violation" in line.lower() for line in events.err), events.err
