"""Least-privilege bus credentials (issue #9, ADR-0026) on a real nats-server with the generated accounts.

For every credential: (a) every publish and subscribe of a long probe list that it has no business
making is refused by the server (nats-py reports each through its error callback, which
``nodus_kit.connecting`` logs); (b) what it needs works, through the kit's own classes (ObjectStore,
Lease, Consumer, serve/request), with no violation at all. The expected rights below are written out by
hand from docs/bus.md, not computed from ``permitting``: they are the policy the table must meet.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import stat
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from nodus_kit import declaring, errors, messaging, permitting
from nodus_kit.connecting import connect
from nodus_kit.leasing import Lease
from nodus_kit.permitting import Generated
from nodus_kit.storing import ObjectStore
from nodus_schema.billing import ACCOUNT_SUBJECT, FUNDING_BUCKET, GRANT_SUBJECT, HOLD_SUBJECT, USAGE_SUBJECT
from nodus_schema.estimating import ESTIMATE_SUBJECT, QUOTE_SUBJECT
from nodus_schema.meta import ObjectMeta
from nodus_testing.localstack import Stack, agent
from nodus_testing.waiting import eventually

from .conftest import NODES

USERS = ("gateway", "sweeps", "scheduler", "billing", "agent-n1", "agent-n2", "fleet", "operator", "admin")
BUCKETS = tuple(b.name for b in declaring.BUCKETS)
STREAMS = tuple(s.name for s in declaring.STREAMS)
ALL_STREAMS = tuple(f"KV_{b}" for b in BUCKETS) + STREAMS
RPC = (ESTIMATE_SUBJECT, QUOTE_SUBJECT, HOLD_SUBJECT, ACCOUNT_SUBJECT, GRANT_SUBJECT, USAGE_SUBJECT)
LEASES = ("scheduler", "billing", "sweep-controller", "agent-retention")
DURABLES = (
    ("NODUS_ASSIGNMENTS", "agent-n1", "nodus.assign.n1"),
    ("NODUS_ASSIGNMENTS", "agent-n2", "nodus.assign.n2"),
    ("NODUS_REPORTS", "scheduler", "nodus.report.>"),
    ("NODUS_REPORTS", "billing", "nodus.report.>"),
)
API = "$JS.API"
VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"')


# -- the probes and the policy -------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    verb: str  # "pub" or "sub"
    subject: str
    labels: frozenset[str]  # the rights that would allow it; empty: nobody may


def P(verb: str, subject: str, *labels: str) -> Probe:
    return Probe(verb, subject, frozenset(labels))


def probes(keys: dict[str, str]) -> list[Probe]:
    """Every publish and subscribe worth refusing: buckets, streams, other nodes, other inboxes, the
    JetStream API's destructive calls, $SYS."""
    out: list[Probe] = []
    for b in BUCKETS:
        s = f"KV_{b}"
        out += [
            P("pub", f"$KV.{b}.ns.probe", f"write:{b}"),
            P("pub", f"{API}.DIRECT.GET.{s}.$KV.{b}.ns.probe", f"get:{b}"),
            P("pub", f"{API}.DIRECT.GET.{s}", f"scan:{b}"),  # by sequence: every key
            # The leader read of a replicated bucket (storing._get_last) has no per-key form: only
            # credentials that may read the whole bucket have it; key-scoped readers read directly.
            P("pub", f"{API}.STREAM.MSG.GET.{s}", f"leader:{b}"),
            P("pub", f"{API}.CONSUMER.CREATE.{s}", f"scan:{b}"),  # an ordered consumer: list, watch
            P("pub", f"{API}.STREAM.INFO.{s}", f"info:{s}"),
            P("sub", f"$KV.{b}.>", f"tap:$KV.{b}"),
        ]
    for s in ALL_STREAMS:
        out += [
            P("pub", f"{API}.STREAM.CREATE.{s}", "declare"),
            P("pub", f"{API}.STREAM.UPDATE.{s}", "declare"),
            P("pub", f"{API}.STREAM.DELETE.{s}"),
            P("pub", f"{API}.STREAM.PURGE.{s}"),
            P("pub", f"{API}.STREAM.MSG.DELETE.{s}"),
            P("pub", f"{API}.STREAM.SNAPSHOT.{s}"),
            P("pub", f"{API}.CONSUMER.CREATE.{s}.probe.>", f"consumers:{s}"),
            P("pub", f"{API}.CONSUMER.DURABLE.CREATE.{s}.probe"),
            P("pub", f"{API}.CONSUMER.DELETE.{s}.probe", f"consumers:{s}"),
            P("pub", f"{API}.CONSUMER.LIST.{s}", f"consumers:{s}"),
        ]
    for s in STREAMS:
        out += [
            P("pub", f"{API}.CONSUMER.CREATE.{s}", f"read:{s}"),
            P("pub", f"{API}.STREAM.INFO.{s}", f"info:{s}"),
            P("pub", f"{API}.STREAM.MSG.GET.{s}", f"read:{s}"),
            P("pub", f"{API}.DIRECT.GET.{s}", f"read:{s}"),
        ]
    for name in LEASES:
        out += [
            P("pub", f"$KV.leases.{name}", f"lease:{name}", "write:leases"),
            P("pub", f"{API}.DIRECT.GET.KV_leases.$KV.leases.{name}", f"lease:{name}", "get:leases"),
        ]
    for n in NODES:
        out += [
            P("pub", f"$KV.nodes._.{n}", f"node:{n}", "write:nodes"),
            P("pub", f"{API}.DIRECT.GET.KV_nodes.$KV.nodes._.{n}", f"node:{n}", "get:nodes"),
            P("pub", f"nodus.assign.{n}", "assign"),
            P("pub", f"nodus.report.{n}.ns.a1", f"report:{n}"),
            P("pub", f"nodus.logs.{n}.ns.job.a1", f"logs:{n}"),
            # The Node authorizer's requests (nodus_schema.noding): only the node's own, served by the
            # gateway alone (the subject names who asks).
            P("pub", f"nodus.rpc.node.{n}.secrets", f"ask-node:{n}"),
            P("pub", f"nodus.rpc.node.{n}.retention", f"ask-node:{n}"),
            P("pub", f"nodus.rpc.node.{n}.commit", f"ask-node:{n}"),
            P("sub", f"nodus.rpc.node.{n}.secrets", "serve:node", "tap:nodus"),
            P("sub", f"nodus.rpc.node.{n}.commit", "serve:node", "tap:nodus"),
            P("sub", f"nodus.assign.{n}", "tap:nodus"),
            P("sub", f"nodus.report.{n}.>", "tap:nodus"),
        ]
    out += [
        P("pub", "nodus.logs.ns.job.a1.x", "logs:ns"),  # a node named like a project: its own only
        P("pub", "nodus.events.ns.jobs.x", "events"),
        P("pub", "nodus.billing.probe"),
        P("pub", "nodus.dead.NODUS_EVENTS.probe"),
        P("sub", "nodus.>", "tap:nodus"),
        P("sub", "nodus.logs.>", "tap:nodus"),
    ]
    for stream, name, filt in DURABLES:
        extra = f"consumers:{stream}"
        out += [
            P("pub", f"{API}.CONSUMER.CREATE.{stream}.{name}.{filt}", f"durable:{name}", extra),
            P("pub", f"{API}.CONSUMER.MSG.NEXT.{stream}.{name}", f"durable:{name}", extra),
            P("pub", f"{API}.CONSUMER.INFO.{stream}.{name}", f"durable:{name}", extra, f"read:{stream}"),
            P("pub", f"$JS.ACK.{stream}.{name}.1.1.1.1.0", f"durable:{name}", extra),
            P("pub", f"nodus.dead.{stream}.{name}", f"durable:{name}", extra),
        ]
    # A node's durable over another node's subject, or over every node's: the hijack of assignments.
    assign = "consumers:NODUS_ASSIGNMENTS"
    out += [
        P("pub", f"{API}.CONSUMER.CREATE.NODUS_ASSIGNMENTS.agent-n1.nodus.assign.n2", assign),
        P("pub", f"{API}.CONSUMER.CREATE.NODUS_ASSIGNMENTS.agent-n1.nodus.assign.>", assign),
        P("pub", f"{API}.CONSUMER.CREATE.NODUS_ASSIGNMENTS.agent-n1", assign),
    ]
    for subject in RPC:
        out += [P("pub", subject, f"ask:{subject}"), P("sub", subject, f"serve:{subject}", "tap:nodus")]
    for user, key in keys.items():
        out += [P("sub", f"_INBOX_{key}.>", f"inbox:{user}"), P("pub", f"_INBOX_{key}.probe")]
    out += [
        P("sub", "_INBOX.>"),
        P("pub", "_INBOX.probe"),
        P("sub", ">"),
        P("sub", "$JS.API.>"),  # everybody's API requests
        P("sub", "$JS.ACK.>"),
        P("sub", "$JS.EVENT.>"),
        P("pub", f"{API}.STREAM.NAMES", "names"),
        P("pub", f"{API}.STREAM.LIST"),
        P("pub", f"{API}.INFO"),
        P("pub", f"{API}.META.LEADER.STEPDOWN"),
        P("pub", f"{API}.SERVER.REMOVE"),
        P("pub", f"{API}.ACCOUNT.PURGE.NODUS"),
        P("pub", "$SYS.REQ.SERVER.PING"),
        P("pub", "$SYS.REQ.ACCOUNT.NODUS.CONNZ"),
        P("sub", "$SYS.>"),
    ]
    return out


def _rights(verb: str, *names: str) -> set[str]:
    return {f"{verb}:{n}" for n in names}


def _reader(*buckets: str) -> set[str]:
    """Reads whole buckets: key by key, through the leader, by sequence, ordered consumers, stream info."""
    return (
        _rights("get", *buckets)
        | _rights("leader", *buckets)
        | _rights("scan", *buckets)
        | _rights("info", *(f"KV_{b}" for b in buckets))
    )


GATEWAY_WRITES = (
    "sweeps",
    "jobs",
    "secrets",
    "connections",
    "budgets",
    "tokens",
    "projects",
    "volumes",
    "workspaces",
    "blobs",
    "serviceaccounts",
    "pipelines",
)
OPERATOR_BUCKETS = tuple(b for b in BUCKETS if b not in ("secrets", "tokens"))
OPERATOR_STREAMS = tuple(s for s in STREAMS if s != "NODUS_ASSIGNMENTS")
BILLING_RPC = (QUOTE_SUBJECT, HOLD_SUBJECT, ACCOUNT_SUBJECT, GRANT_SUBJECT, USAGE_SUBJECT)


def expected(user: str) -> set[str]:
    """The policy (docs/bus.md, "Credentials and permissions"), by hand."""
    own = {f"inbox:{user}"}
    if user == "gateway":
        return (
            own
            | _rights("write", *GATEWAY_WRITES)
            | _reader(*GATEWAY_WRITES, "attempts", "nodes", "offerings")
            # Every Node's key (the cluster admin's delete), and no other key of the nodes bucket.
            | _rights("node", *NODES)
            | {"read:NODUS_LOGS", "info:NODUS_LOGS", "names"}
            # No quote: the scheduler passes a priced estimate on to billing (ADR-0031).
            | _rights("ask", ESTIMATE_SUBJECT, ACCOUNT_SUBJECT, GRANT_SUBJECT, USAGE_SUBJECT)
            | {"serve:node"}
        )
    # A key of leases (and of nodes, for agents) is read by key only (direct gets), never through the
    # bucket's leader, which would read every key.
    lease = {"info:KV_leases"}
    if user == "sweeps":
        return (
            own
            | _rights("write", "sweeps", "jobs", "pipelines")
            | _reader("sweeps", "jobs", "pipelines")
            | {"lease:sweep-controller", "names", "events"}
            | lease
        )
    if user == "scheduler":
        writes = ("jobs", "attempts", "nodes", "offerings")
        return (
            own
            | _rights("write", *writes)
            | _reader(*writes, "funding")
            | {"lease:scheduler", "names", "assign", "events", "durable:scheduler"}
            | lease
            | {f"ask:{HOLD_SUBJECT}", f"ask:{QUOTE_SUBJECT}", f"serve:{ESTIMATE_SUBJECT}"}
        )
    if user == "billing":
        writes = ("accounts", "history", "funding", "budgets", "jobs")
        return (
            own
            | _rights("write", *writes)
            | _reader(*writes, "sweeps", "attempts", "pipelines")
            | {"lease:billing", "names", "durable:billing", "events"}
            | lease
            | _rights("serve", *BILLING_RPC)
        )
    if user.startswith("agent-"):
        node = user.removeprefix("agent-")
        # Node restriction: no bucket of tenants' data at all (not even a Secret, Connection or Job by
        # key, nor their stream info, whose subjects filter lists keys); its own node's subjects only.
        return (
            own
            | _rights("info", "KV_nodes")
            | lease
            | {
                f"node:{node}",
                "lease:agent-retention",
                f"report:{node}",
                f"logs:{node}",
                f"ask-node:{node}",
                f"durable:agent-{node}",
            }
        )
    if user == "fleet":
        return (
            own
            | _rights("node", *NODES)
            | _rights("report", *NODES)
            | _rights("logs", *NODES, "ns")
            | {"consumers:NODUS_ASSIGNMENTS", "info:KV_nodes"}
        )
    if user == "operator":
        return (
            own
            | _reader(*OPERATOR_BUCKETS)
            | _rights("read", *OPERATOR_STREAMS)
            | _rights("info", *OPERATOR_STREAMS)
            | _rights("tap", "nodus", *(f"$KV.{b}" for b in OPERATOR_BUCKETS))
            | {"names"}
        )
    if user == "admin":
        return own | {"declare"} | _rights("info", *ALL_STREAMS)
    raise AssertionError(user)


# -- the server, the credentials, the violations -------------------------------------------------------
class Violations(logging.Handler):
    """The permissions violations each connection (by name) was told of, from the kit's error log."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: dict[str, set[tuple[str, str]]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        m = VIOLATION.search(record.getMessage())
        if m:
            verb = "pub" if m.group(1) == "publish" else "sub"
            # nats-py lowercases the server's -ERR line: subjects are compared in lower case.
            self.seen.setdefault(str(getattr(record, "service", "")), set()).add((verb, m.group(2)))

    def of(self, name: str) -> set[tuple[str, str]]:
        return self.seen.get(name, set())


@pytest.fixture
def violations() -> Iterator[Violations]:
    handler = Violations()
    logger = logging.getLogger("nodus_kit.connecting")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@dataclass
class Bus:
    """Connections as given users, each named uniquely; closed at the end of the test."""

    url: str
    creds: Generated
    violations: Violations
    conns: dict[str, NATS] = field(default_factory=dict)

    async def as_(self, user: str) -> NATS:
        if user not in self.conns:
            name = f"{user}-{uuid.uuid4().hex[:6]}"
            nc = await connect(self.url, name, nkey_seed=self.creds.seed(user))
            nc._nodus_name = name  # type: ignore[attr-defined]
            self.conns[user] = nc
        return self.conns[user]

    async def barrier(self, nc: NATS) -> None:
        """Return once the server has handled everything ``nc`` sent before. nats-py 2.16's ``flush`` is
        no such barrier: its PING goes straight to the socket, ahead of commands still in the client's
        pending buffer (a SUB flushed that way was not yet seen by a publisher on another connection).
        A request is queued behind them: a stream info every credential may ask."""
        user = next(u for u, c in self.conns.items() if c is nc)
        await nc.jetstream().stream_info(
            "KV_nodes" if user.startswith("agent-") or user == "fleet" else "KV_jobs"
        )

    async def each(self, *users: str) -> list[NATS]:
        return [await self.as_(u) for u in users]

    async def assert_clean(self) -> None:
        """No connection was refused anything: a flush round trip first, so every error the server sent
        before it has been handled."""
        for nc in self.conns.values():
            await self.barrier(nc)
        refused = {u: self.violations.of(nc._nodus_name) for u, nc in self.conns.items()}  # type: ignore[attr-defined]
        assert {u: v for u, v in refused.items() if v} == {}


@pytest_asyncio.fixture(loop_scope="session")
async def bus(declared: str, creds: Generated, violations: Violations) -> AsyncIterator[Bus]:
    b = Bus(declared, creds, violations)
    try:
        yield b
    finally:
        for nc in b.conns.values():
            await nc.close()


# -- (a) everything forbidden is refused ---------------------------------------------------------------
def test_the_policy_names_every_credential(creds: Generated) -> None:
    assert set(creds.public_keys) == set(USERS)
    for user in USERS:
        seed = creds.seed(user)
        assert stat.S_IMODE(os.stat(seed).st_mode) == 0o600
        assert seed.read_bytes().startswith(b"SU")
        assert creds.public_keys[user] in creds.accounts.read_text()
        assert seed.read_bytes().strip().decode() not in creds.accounts.read_text()


@pytest.mark.parametrize("user", USERS)
async def test_every_forbidden_publish_and_subscribe_is_refused(user: str, bus: Bus) -> None:
    allowed = expected(user)
    forbidden = [p for p in probes(bus.creds.public_keys) if not (p.labels & allowed)]
    assert len(forbidden) > 150  # the list covers every bucket, stream, node, inbox
    nc = await bus.as_(user)
    for p in forbidden:
        if p.verb == "pub":
            await nc.publish(p.subject, b"")
        else:
            await nc.subscribe(p.subject)
    await nc.flush(timeout=5)
    want = {(p.verb, p.subject.lower()) for p in forbidden}
    name = nc._nodus_name  # type: ignore[attr-defined]

    def refused_all() -> bool:
        missing = want - bus.violations.of(name)
        assert not missing, f"{user} was not refused {sorted(missing)}"
        return True

    await eventually(refused_all, deadline_s=10, message=f"{user}: forbidden probes went through")
    # And nothing that is allowed was refused (the probes sent were all forbidden ones).
    assert bus.violations.of(name) == want


# -- (b) what each needs works ----------------------------------------------------------------------------
class Thing(msgspec.Struct, rename="camel"):
    metadata: ObjectMeta
    spec: dict[str, str] = msgspec.field(default_factory=dict)


def thing(name: str, namespace: str | None) -> Thing:
    return Thing(ObjectMeta(name=name, namespace=namespace), {"probe": "yes"})


def ns() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


async def kv_round_trip(nc: NATS, bucket: str, namespace: str | None, *, listed: bool = True) -> None:
    """Create, read, update (compare-and-set), list and watch one object."""
    store = ObjectStore(nc, bucket, Thing)
    made = await store.create(thing(f"x{uuid.uuid4().hex[:6]}", namespace))
    assert (await store.get(namespace, made.metadata.name or "")).spec == {"probe": "yes"}
    changed = await store.update(msgspec.structs.replace(made, spec={"probe": "changed"}))
    if listed:
        page = await store.list(namespace)
        assert [o.metadata.name for o in page.items] == [made.metadata.name]
        async with store.watch(namespace, resource_version=int(made.metadata.resource_version or 0)) as w:
            event = await w.next(timeout=5)
        assert (event.type, event.object.spec, event.revision) == (
            "MODIFIED",
            {"probe": "changed"},
            int(changed.metadata.resource_version or 0),
        )


async def lease_round_trip(nc: NATS, name: str) -> None:
    lease = Lease(nc, name, f"probe-{uuid.uuid4().hex[:6]}", ttl_s=5)
    assert await lease.try_acquire()
    assert await lease.renew()
    await lease.release()


async def rpc(bus: Bus, server: NATS, client: NATS, subject: str, queue: str) -> None:
    """``client`` asks ``subject``; ``server`` answers it (its reply goes to the client's own inbox)."""

    async def answer(req: dict[str, Any]) -> dict[str, Any]:
        return {"echo": req["n"]}

    sub = await messaging.serve(server, subject, dict, answer, queue=queue)
    try:
        await bus.barrier(server)  # serving before the first request comes
        reply = await messaging.request(client, subject, {"n": 7}, dict, timeout=5)
        assert reply == {"echo": 7}
    finally:
        await sub.unsubscribe()


async def consume_one(
    nc: NATS, publisher: NATS, *, stream: str, durable: str, subject: str, publish_to: str
) -> None:
    """The kit's Consumer on ``durable`` gets what ``publisher`` publishes, acks it, and dead-letters a
    message that does not decode."""
    got: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def handle(d: messaging.Delivery[dict[str, Any]]) -> None:
        await got.put(d.data)

    js = nc.jetstream()
    consumer = await messaging.Consumer(
        js, stream=stream, durable=durable, subject=subject, typ=dict, handler=handle
    ).start()
    try:
        marker = uuid.uuid4().hex
        await messaging.publish(publisher.jetstream(), publish_to, {"marker": marker}, msg_id=marker)
        await publisher.jetstream().publish(publish_to, b"not json", headers={"Nats-Msg-Id": "bad" + marker})
        while (await asyncio.wait_for(got.get(), 10)) != {"marker": marker}:
            pass  # a message an earlier test left on the subject: also consumed
        info = await js.consumer_info(stream, durable)

        async def all_settled() -> bool:
            i = await js.consumer_info(stream, durable)
            return i.num_ack_pending == 0 and i.num_pending == 0

        await eventually(all_settled, deadline_s=10, message=f"{durable} did not ack and dead-letter")
        assert info.config.filter_subject == subject
    finally:
        await consumer.stop()


async def test_gateway_does_its_work(bus: Bus) -> None:
    gw, billing, scheduler, agent = await bus.each("gateway", "billing", "scheduler", "agent-n1")
    space = ns()
    for bucket in GATEWAY_WRITES:
        await kv_round_trip(gw, bucket, None if bucket in ("tokens", "projects") else space)
    for bucket in ("attempts", "nodes", "offerings"):  # read-only for it
        await ObjectStore(gw, bucket, Thing).list(space)
    # But for the cluster admin's delete of a Node (an agent's record, gone for good).
    left = await ObjectStore(scheduler, "nodes", Thing).create(thing(f"left-{space}", None))
    await ObjectStore(gw, "nodes", Thing).delete(None, left.metadata.name or "")
    # Logs: an agent ships a batch, the gateway finds the last one and reads the Job's subjects.
    subject = f"nodus.logs.n1.{space}.job.a1"
    await agent.jetstream().publish(subject, b'{"lines":[]}')
    js = gw.jetstream()
    last = await js.get_last_msg("NODUS_LOGS", f"nodus.logs.*.{space}.job.*")
    sub = await js.subscribe(
        f"nodus.logs.*.{space}.job.*",
        stream="NODUS_LOGS",
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    msg = await sub.next_msg(timeout=5)
    await sub.unsubscribe()
    assert (msg.subject, msg.metadata.sequence.stream) == (subject, last.seq)
    await rpc(bus, scheduler, gw, ESTIMATE_SUBJECT, "scheduler")
    for subject in (ACCOUNT_SUBJECT, GRANT_SUBJECT, USAGE_SUBJECT):
        await rpc(bus, billing, gw, subject, "billing")
    await bus.assert_clean()


async def test_sweep_controller_does_its_work(bus: Bus) -> None:
    nc = await bus.as_("sweeps")
    space = ns()
    await kv_round_trip(nc, "sweeps", space)
    await kv_round_trip(nc, "jobs", space)
    await lease_round_trip(nc, "sweep-controller")
    await bus.assert_clean()


async def test_scheduler_does_its_work(bus: Bus) -> None:
    nc, agent, billing, gw = await bus.each("scheduler", "agent-n1", "billing", "gateway")
    space = ns()
    for bucket in ("jobs", "attempts"):
        await kv_round_trip(nc, bucket, space)
    for bucket in ("nodes", "offerings"):
        await kv_round_trip(nc, bucket, None, listed=False)
        await ObjectStore(nc, bucket, Thing).list(None)
    await kv_round_trip(billing, FUNDING_BUCKET, space)  # billing writes funding, the scheduler watches
    assert len((await ObjectStore(nc, FUNDING_BUCKET, Thing).list(space)).items) == 1
    await lease_round_trip(nc, "scheduler")
    js = nc.jetstream()
    ack = await messaging.publish(js, "nodus.assign.n2", {"type": "StopAttempt"}, msg_id=uuid.uuid4().hex)
    assert ack.stream == "NODUS_ASSIGNMENTS"
    # Events are core publishes the stream stores; the stream's count says it did.
    await nc.publish(f"nodus.events.{space}.jobs.x", b"{}")
    await nc.flush()
    await consume_one(
        nc,
        agent,
        stream="NODUS_REPORTS",
        durable="scheduler",
        subject="nodus.report.>",
        publish_to=f"nodus.report.n1.{space}.a1",
    )
    await rpc(bus, nc, gw, ESTIMATE_SUBJECT, "scheduler")
    await rpc(bus, billing, nc, HOLD_SUBJECT, "billing")
    await bus.assert_clean()


async def test_billing_does_its_work(bus: Bus) -> None:
    nc, agent, scheduler, gw = await bus.each("billing", "agent-n1", "scheduler", "gateway")
    space = ns()
    for bucket in ("funding", "budgets", "jobs"):
        await kv_round_trip(nc, bucket, space)
    await kv_round_trip(nc, "accounts", None)
    for bucket in ("sweeps", "attempts"):
        await ObjectStore(nc, bucket, Thing).list(space)
    await lease_round_trip(nc, "billing")
    await consume_one(
        nc,
        agent,
        stream="NODUS_REPORTS",
        durable="billing",
        subject="nodus.report.>",
        publish_to=f"nodus.report.n1.{space}.a2",
    )
    await rpc(bus, nc, scheduler, HOLD_SUBJECT, "billing")
    await rpc(bus, nc, scheduler, QUOTE_SUBJECT, "billing")
    for subject in (ACCOUNT_SUBJECT, GRANT_SUBJECT, USAGE_SUBJECT):
        await rpc(bus, nc, gw, subject, "billing")
    await bus.assert_clean()


async def test_a_priced_estimate_goes_gateway_scheduler_billing_and_billing_answers_the_gateway(
    bus: Bus,
) -> None:
    """The estimate's one round trip (ADR-0031), each on its own credential: the scheduler passes the
    request on to billing with the gateway's reply subject (its right to ask the quote), and billing's
    answer reaches the gateway's inbox (allow_responses covers a reply subject another user set). With
    billing gone, a request passed on is lost: the server tells "no responders" only to the client that
    published, which is why the scheduler checks that billing serves (nodus_scheduler.forwarding)."""
    gw, scheduler, billing = await bus.each("gateway", "scheduler", "billing")

    async def plan(req: dict[str, Any]) -> messaging.Forward:
        return messaging.Forward(QUOTE_SUBJECT, {"n": req["n"], "by": "scheduler"})

    async def price(req: dict[str, Any]) -> dict[str, Any]:
        return {"priced": req["n"], "by": req["by"]}

    passing = await messaging.serve(scheduler, ESTIMATE_SUBJECT, dict, plan, queue="scheduler")
    pricing = await messaging.serve(billing, QUOTE_SUBJECT, dict, price, queue="billing")
    try:
        await bus.barrier(scheduler)
        await bus.barrier(billing)
        reply = await messaging.request(gw, ESTIMATE_SUBJECT, {"n": 7}, dict, timeout=5)
        assert reply == {"priced": 7, "by": "scheduler"}
        await pricing.unsubscribe()
        await bus.barrier(billing)
        with pytest.raises(errors.Timeout):
            await messaging.request(gw, ESTIMATE_SUBJECT, {"n": 8}, dict, timeout=0.5)
    finally:
        await passing.unsubscribe()
    await bus.assert_clean()


@pytest.mark.parametrize("node", NODES)
async def test_a_node_agent_does_its_work(node: str, bus: Bus) -> None:
    nc, scheduler, gw = await bus.each(f"agent-{node}", "scheduler", "gateway")
    space = ns()
    # Its own Node record: create, read, compare-and-set (no listing: it sees no other node).
    nodes = ObjectStore(nc, "nodes", Thing)
    try:
        mine = await nodes.create(thing(node, None))
    except Exception:  # the other test of this module may have created it: update instead
        mine = await nodes.get(None, node)
    await nodes.update(msgspec.structs.replace(mine, spec={"probe": "beat"}))
    await lease_round_trip(nc, "agent-retention")
    # Its own node's requests, answered by the gateway (tests/deploy/test_node_restriction.py asks the
    # real Node authorizer; here only the rights).
    await rpc(bus, gw, nc, f"nodus.rpc.node.{node}.secrets", "gateway-nodes")
    await rpc(bus, gw, nc, f"nodus.rpc.node.{node}.retention", "gateway-nodes")
    js = nc.jetstream()
    ack = await js.publish(
        f"nodus.report.{node}.{space}.a1", b"{}", headers={"Nats-Msg-Id": uuid.uuid4().hex}
    )
    assert ack.stream == "NODUS_REPORTS"
    ack = await js.publish(f"nodus.logs.{node}.{space}.job.a1", b"{}")
    assert ack.stream == "NODUS_LOGS"
    await consume_one(
        nc,
        scheduler,
        stream="NODUS_ASSIGNMENTS",
        durable=f"agent-{node}",
        subject=f"nodus.assign.{node}",
        publish_to=f"nodus.assign.{node}",
    )
    await bus.assert_clean()


async def test_the_simulated_fleet_does_its_work(bus: Bus) -> None:
    nc, scheduler = await bus.as_("fleet"), await bus.as_("scheduler")
    fleet = uuid.uuid4().hex[:6]
    names = [f"sim-{fleet}-{i}" for i in range(2)]
    nodes = ObjectStore(nc, "nodes", Thing)
    for name in names:
        await nodes.create(thing(name, None))
    # One durable over the chunk's subjects (simulating.py), listed, pulled, acked and deleted.
    js = nc.jetstream()
    durable = f"simfleet-{fleet}-0"
    await js.add_consumer(
        "NODUS_ASSIGNMENTS",
        ConsumerConfig(
            name=durable,
            durable_name=durable,
            filter_subjects=[f"nodus.assign.{n}" for n in names],
            ack_policy=AckPolicy.EXPLICIT,
        ),
    )
    listed = await js.consumers_info("NODUS_ASSIGNMENTS")
    assert durable in {c.name for c in listed}
    sub = await js.pull_subscribe_bind(durable=durable, stream="NODUS_ASSIGNMENTS")
    await messaging.publish(scheduler.jetstream(), f"nodus.assign.{names[1]}", {"n": 1}, msg_id=fleet)
    [msg] = await sub.fetch(1, timeout=5)
    await msg.ack_sync()
    await js.publish(f"nodus.dead.NODUS_ASSIGNMENTS.{durable}", b"{}")
    await js.publish(f"nodus.report.{names[0]}.ns.a1", b"{}")
    await sub.unsubscribe()
    assert await js.delete_consumer("NODUS_ASSIGNMENTS", durable)
    for name in names:
        await nodes.delete(None, name)
    await bus.assert_clean()


async def test_the_operator_reads_everything_it_may(bus: Bus) -> None:
    nc, scheduler, gw = await bus.each("operator", "scheduler", "gateway")
    space = ns()
    js = nc.jetstream()
    events = await js.subscribe(
        f"nodus.events.{space}.>",
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    tap = await nc.subscribe("nodus.>")
    kv_tap = await nc.subscribe("$KV.jobs.>")
    await bus.barrier(nc)
    await scheduler.publish(f"nodus.events.{space}.jobs.x", b"{}")
    made = await ObjectStore(gw, "jobs", Thing).create(thing("watched", space))
    assert (await events.next_msg(timeout=5)).subject == f"nodus.events.{space}.jobs.x"
    assert (await tap.next_msg(timeout=5)).subject == f"nodus.events.{space}.jobs.x"
    assert (await kv_tap.next_msg(timeout=5)).subject == f"$KV.jobs.{space}.watched"
    jobs = ObjectStore(nc, "jobs", Thing)
    assert [o.metadata.uid for o in (await jobs.list(space)).items] == [made.metadata.uid]
    for bucket in OPERATOR_BUCKETS:
        await ObjectStore(nc, bucket, Thing).list(space)
    for stream in OPERATOR_STREAMS:
        assert (await js.stream_info(stream)).config.name == stream
    await bus.assert_clean()


async def test_the_admin_declares_and_reads_nothing(bus: Bus) -> None:
    nc = await bus.as_("admin")
    js = nc.jetstream()
    await declaring.ensure(js)  # every stream again: an update to the same config
    for name in ALL_STREAMS:
        assert (await js.stream_info(name)).config.name == name
    await bus.assert_clean()


async def test_a_service_with_a_credential_waits_for_the_bootstrap(bus: Bus) -> None:
    """Nothing to wait for here (declared); a service name without a row checks nothing."""
    nc = await bus.as_("scheduler")
    await permitting.await_declared(nc.jetstream(), "nodus-scheduler", deadline_s=5)
    await permitting.await_declared(nc.jetstream(), "nodus-unknown", deadline_s=5)
    await bus.assert_clean()


# -- the generator ----------------------------------------------------------------------------------------
def test_generating_again_keeps_the_seeds_and_revokes_dropped_nodes(tmp_path: Path) -> None:
    first = permitting.generate(tmp_path, ["n1", "n2"])
    text = first.accounts.read_text()
    again = permitting.generate(tmp_path, ["n1", "n2"])
    assert again.public_keys == first.public_keys and again.accounts.read_text() == text
    fewer = permitting.generate(tmp_path, ["n1"])
    assert (
        "agent-n2" not in fewer.public_keys
        and first.public_keys["agent-n2"] not in fewer.accounts.read_text()
    )
    assert fewer.stale == ("agent-n2",)
    (tmp_path / "agent-n1.nk").unlink()  # rotation: a new seed for n1 only
    rotated = permitting.generate(tmp_path, ["n1"])
    assert rotated.public_keys["agent-n1"] != first.public_keys["agent-n1"]
    assert rotated.public_keys["scheduler"] == first.public_keys["scheduler"]


def test_the_cli_generates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert permitting.main(["generate", "--out", str(tmp_path), "--node", "gpu-a-1"]) == 0
    assert (tmp_path / "agent-gpu-a-1.nk").exists() and (tmp_path / "accounts.conf").exists()
    with pytest.raises(SystemExit):
        permitting.main(["generate", "--out", str(tmp_path), "--node", "Bad.Name"])


def test_the_tables_rpc_subjects_are_the_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table names what the services really use (their own constants)."""
    from nodus_agent.logshipping import STREAM as LOG_STREAM
    from nodus_agent.service import ASSIGNMENTS, assign_subject
    from nodus_billing.serving import QUEUE as BILLING_QUEUE
    from nodus_scheduler.answering import QUEUE as SCHEDULER_QUEUE

    assert (LOG_STREAM, ASSIGNMENTS, BILLING_QUEUE, SCHEDULER_QUEUE) == (
        "NODUS_LOGS",
        "NODUS_ASSIGNMENTS",
        "billing",
        "scheduler",
    )
    assert permitting.agent("n1").durables[0].filter == assign_subject("n1")
    assert set(permitting.SERVICE_KINDS) >= {"nodus-gateway", "nodus-scheduler", "nodus-agent"}


# -- (c) the real services, each on its own credential ----------------------------------------------------
def job_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "image": "python:3.11-slim",
            "command": [sys.executable, "-c", "print('hello from a least-privileged bus')"],
            "resources": {"gpu": "L4:1"},
            "backoffLimit": 0,
        },
    }


@pytest.mark.slow
async def test_the_stack_runs_a_job_with_every_process_on_its_own_credential(tmp_path: Path) -> None:
    """Gateway, sweep controller, scheduler, billing and two node agents as processes, each with its own
    seed, on a server that knows only the generated users; the streams declared by the admin. A dry run
    (scheduler and billing estimate), a Job to Succeeded (assignments, reports, holds, charges, logs),
    its log and the project's account: and not one permissions violation in any process's log."""
    stack = Stack(
        tmp_path / "stack",
        agents=[
            agent("h100-a", "h100-sxm-80g-x1-us", "us", "H100-SXM-80G", "80Gi"),
            agent("l4-a", "l4-x1-eu", "eu", "L4", "24Gi"),
        ],
        credentials=True,
    )
    base = "/apis/nodus.dev/v1/namespaces/creds"
    try:
        values = await asyncio.to_thread(stack.start, deadline_s=90)
        async with httpx.AsyncClient(
            base_url=values["NODUS_URL"],
            headers={"Authorization": f"Bearer {values['NODUS_TOKEN']}"},
            timeout=10,
            verify=ssl.create_default_context(cafile=values["NODUS_CA"]),
        ) as http:
            dry = await http.post(f"{base}/jobs", params={"dryRun": "All"}, json=job_body("hello"))
            assert dry.status_code in (200, 201), dry.text
            estimate = dry.json()["status"]["estimate"]
            # The scheduler's part (the rate of the capacity it would choose) and billing's (the hold).
            assert estimate["rateUSDPerHour"] and estimate["holdUSD"], estimate
            assert estimate.get("blockingReasons", []) == [], estimate
            assert (await http.post(f"{base}/jobs", json=job_body("hello"))).status_code == 201

            async def succeeded() -> dict[str, Any] | None:
                job: dict[str, Any] = (await http.get(f"{base}/jobs/hello")).json()
                return job if job.get("status", {}).get("phase") == "Succeeded" else None

            job = await eventually(succeeded, deadline_s=60, interval_s=0.25, message="the Job never ran")

            async def logged() -> str:
                text = (await http.get(f"{base}/jobs/hello/log")).text
                return text if "hello from a least-privileged bus" in text else ""

            await eventually(logged, deadline_s=30, interval_s=0.25, message="the Job's log never came")
            account = await http.get(f"{base}/account")
            assert account.status_code == 200, account.text
    finally:
        stack.stop()
        logs = {p.name: p.read_text() for p in (stack.root / "logs").glob("*.log")}
        for name, text in sorted(logs.items()):  # shown by pytest only if the test fails
            print(f"--- {name} (last lines)", *text.splitlines()[-15:], sep="\n")
    assert job["status"]["phase"] == "Succeeded"
    assert set(logs) == {
        "gateway.log",
        "sweeps.log",
        "scheduler.log",
        "billing.log",
        "h100-a.log",
        "l4-a.log",
    }
    refused = {
        name: [line for line in text.splitlines() if "permissions violation" in line]
        for name, text in logs.items()
    }
    assert {name: lines for name, lines in refused.items() if lines} == {}
    # Each used its own credential: the server has no other users, and nobody declared but the admin.
    assert all("service ready" in text for text in logs.values())
