"""Prometheus metrics, read as Prometheus reads them: a real Service on the session's nats-server, with a
controller, a consumer, an endpoint and a lease, does some work; then ``GET /metrics`` on its health port."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from prometheus_client.parser import text_string_to_metric_families

from nodus_kit import errors, leasing, measuring, messaging
from nodus_kit.controlling import Controller, Key
from nodus_kit.informing import Informer
from nodus_kit.servicing import Service, Settings
from nodus_kit.storing import ObjectStore
from nodus_schema.billing import AccountRequest, AccountView, Funding
from nodus_schema.messages import AttemptStarted, Report
from nodus_schema.meta import ObjectMeta
from nodus_testing.waiting import eventually

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(port: int) -> Samples:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"text/plain; version=0.0.4" in head
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


class Probe(Service):
    """A service with one of each part the kit meters; what its parts do is chosen by object name."""

    name = "nodus-probe"

    def __init__(self, settings: Settings, unique: str) -> None:
        super().__init__(settings)
        self.unique = unique
        self.handled: list[str] = []
        self.tasks: list[asyncio.Task[Any]] = []

    async def reconcile(self, key: Key) -> float | None:
        name = key[1]
        if name.startswith("later"):
            return 60.0  # requeue
        if name.startswith("busy"):
            raise errors.Unavailable("try again")  # retry
        if name.startswith("broken"):
            raise errors.Invalid("never")  # error
        return None  # ok

    async def handle(self, delivery: messaging.Delivery[Any]) -> None:
        attempt = delivery.data.attempt
        self.handled.append(attempt)
        if attempt.startswith("flaky") and delivery.attempt == 1:
            raise errors.TemporaryError("once more", delay=0.05)
        if attempt.startswith("bad"):
            raise errors.PermanentError("never")

    async def account(self, req: AccountRequest) -> AccountView:
        if req.project == "missing":
            raise errors.NotFound("no such project")
        return AccountView(project=req.project)

    async def start(self) -> None:
        u = self.unique
        self.funding = ObjectStore(self.bus, "funding", Funding)
        self.controller = Controller(f"probe-{u}", self.reconcile, Informer(self.funding, namespace=u))
        self.tasks.append(asyncio.create_task(self.controller.run()))
        self.consumer = await messaging.Consumer(
            self.bus.jetstream(),
            stream="NODUS_REPORTS",
            durable=f"probe-{u}",
            subject=f"nodus.report.n{u}.>",
            typ=Report,
            handler=self.handle,
            max_deliver=3,
        ).start()
        self.endpoint = await messaging.serve(self.bus, f"nodus.rpc.probe.{u}", AccountRequest, self.account)
        lease = leasing.Lease(self.bus, f"probe-{u}", "me", ttl_s=10)
        self.lease_stop = asyncio.Event()
        self.tasks.append(
            asyncio.create_task(leasing.run_as_leader(lease, asyncio.Event().wait, stop=self.lease_stop))
        )

    async def stop(self) -> None:
        self.lease_stop.set()
        await self.controller.stop()
        await self.controller.for_.stop()
        await self.consumer.stop()
        await self.endpoint.unsubscribe()
        await asyncio.wait_for(asyncio.gather(*self.tasks), 10)


@pytest_asyncio.fixture
async def probe(nats_url: str, nats_seed: Path, nc: NATS, unique: str) -> AsyncIterator[Probe]:
    # nc: with a credential a service declares nothing itself; the session's connection declared.
    threshold = gc.get_threshold()
    service = Probe(Settings(service="nodus-probe", nats_url=nats_url, nats_nkey_seed=str(nats_seed)), unique)
    task = asyncio.create_task(service.run())
    await eventually(lambda: service.health is not None and service.health.port, deadline_s=10)
    yield service
    service.stopping.set()
    await asyncio.wait_for(task, 20)
    # Service.run tunes the collector for a long-lived process; the rest of the session is not one.
    gc.unfreeze()
    gc.set_threshold(*threshold)


async def test_metrics_count_reconciles_messages_requests_writes_and_leadership(
    probe: Probe, nc: NATS, unique: str
) -> None:
    assert probe.health is not None
    port = probe.health.port
    u = unique
    before = await scrape(port)

    # Store writes (and a lost compare-and-set) through the controller's own bucket.
    store = ObjectStore(nc, "funding", Funding)
    for name in ("fine", "later", "busy", "broken"):
        await store.create(Funding(metadata=ObjectMeta(name=f"{name}-{u}", namespace=u)))
    first = await store.get(u, f"fine-{u}")
    await store.update(first)
    with pytest.raises(errors.Conflict):
        await store.update(first)  # its revision is gone: a conflict

    # Consumer: acked, retried then acked, dead-lettered (a handler's refusal, and a body that is no Report).
    js = nc.jetstream()
    for attempt in ("good", "flaky", "bad"):
        msg = AttemptStarted(namespace="default", attempt=f"{attempt}-{u}", node=f"n{u}", time="t")
        await messaging.publish(js, f"nodus.report.n{u}.default.{attempt}", msg, msg_id=f"{u}:{attempt}")
    await js.publish(f"nodus.report.n{u}.default.junk", b"not a report", headers={"Nats-Msg-Id": f"{u}:junk"})

    # Endpoint: one answer, one error.
    subject = f"nodus.rpc.probe.{u}"
    await messaging.request(nc, subject, AccountRequest(project="p"), AccountView)
    with pytest.raises(errors.NotFound):
        await messaging.request(nc, subject, AccountRequest(project="missing"), AccountView)

    async def counted() -> Samples:
        now = await scrape(port)
        c = f"probe-{u}"
        assert value(now, "nodus_controller_reconciles_total", controller=c, outcome="ok") >= 1
        assert value(now, "nodus_controller_reconciles_total", controller=c, outcome="requeue") >= 1
        assert value(now, "nodus_controller_reconciles_total", controller=c, outcome="retry") >= 1
        assert value(now, "nodus_controller_reconciles_total", controller=c, outcome="error") >= 1
        labels = {"stream": "NODUS_REPORTS", "consumer": c}
        assert value(now, "nodus_consumer_messages_total", **labels, outcome="ack") == 2
        assert value(now, "nodus_consumer_messages_total", **labels, outcome="retry") == 1
        assert value(now, "nodus_consumer_messages_total", **labels, outcome="dead") == 2
        assert value(now, "nodus_leader", lease=c) == 1
        return now

    after = await eventually(counted, deadline_s=15, message="the metrics never counted the work")
    c = f"probe-{u}"
    assert value(after, "nodus_rpc_requests_total", endpoint=subject, outcome="ok") == 1
    assert value(after, "nodus_rpc_requests_total", endpoint=subject, outcome="NotFound") == 1
    # Three handled messages were timed (the undecodable one never reached the handler).
    timed = value(after, "nodus_consumer_handler_duration_seconds_count", stream="NODUS_REPORTS", consumer=c)
    assert timed == 4  # good, flaky twice, bad
    assert value(after, "nodus_controller_reconcile_duration_seconds_count", controller=c) >= 4

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("nodus_store_writes_total", bucket="funding", op="create") >= 4
    assert moved("nodus_store_writes_total", bucket="funding", op="update") >= 1
    assert moved("nodus_store_conflicts_total", bucket="funding") >= 1
    assert value(after, "nodus_bus_connected", service="nodus-probe") == 1
    assert ("nodus_bus_reconnects_total", frozenset({("service", "nodus-probe")})) in after
    assert ("nodus_controller_queue_depth", frozenset({("controller", c)})) in after
    assert any(name == "process_resident_memory_bytes" for name, _ in after)


async def test_leadership_drops_to_0_when_the_lease_is_given_up(probe: Probe, unique: str) -> None:
    assert probe.health is not None
    port = probe.health.port
    c = f"probe-{unique}"
    await eventually(lambda: _leads(port, c), deadline_s=10, message="never led")
    probe.lease_stop.set()
    await eventually(lambda: _follows(port, c), deadline_s=10, message="still leads after stepping down")


async def _leads(port: int, lease: str) -> bool:
    return value(await scrape(port), "nodus_leader", lease=lease) == 1


async def _follows(port: int, lease: str) -> bool:
    samples = await scrape(port)
    return ("nodus_leader", frozenset({("lease", lease)})) in samples and value(
        samples, "nodus_leader", lease=lease
    ) == 0


def test_the_gateway_resource_label_is_bounded() -> None:
    meter = measuring.HttpMeter(["jobs", "nodes"])
    assert meter.resource_of("/apis/nodus.dev/v1/namespaces/default/jobs/x/log") == "jobs"
    assert meter.resource_of("/apis/nodus.dev/v1/nodes") == "nodes"
    assert meter.resource_of("/apis/nodus.dev/v1/namespaces/default/made-up-123") == "other"
    assert meter.resource_of("/apis/nodus.dev/v1/namespaces") == "other"
    assert meter.resource_of("/healthz") == "other"


def test_every_metric_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    names = {
        family.name
        for family in text_string_to_metric_families(measuring.exposition().decode())
        if family.name.startswith("nodus_")
    }
    assert names, "no metric exposed"
    missing = sorted(n for n in names if f"`{n}" not in doc)
    assert not missing, f"docs/observability.md lacks {missing}"


async def test_the_gateway_counts_requests_by_verb_resource_and_code(nc: NATS) -> None:
    import httpx

    from nodus_gateway.app import build_app
    from nodus_gateway.resources import stores_for

    def count() -> float:
        families = text_string_to_metric_families(measuring.exposition().decode())
        samples: Samples = {
            (s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples
        }
        return value(samples, "nodus_http_requests_total", verb="GET", resource="jobs", code="401")

    before = count()
    app = build_app(stores_for(nc), admin_token="metrics-test-token-0123456789")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        r = await client.get(
            "/apis/nodus.dev/v1/namespaces/default/jobs", headers={"Authorization": "Bearer no"}
        )
    assert r.status_code == 401
    assert count() == before + 1
