"""Prometheus metrics: one registry per process, served as ``GET /metrics`` by the kit's health server.

Every metric is defined here, once, at import (docs/observability.md lists them). The registry is this
module's own rather than prometheus_client's global one, so that nothing a library registers by
accident is served, and so that tests that start several services in one process share one set of
metrics instead of defining the same names twice (which the client refuses). Labels are bounded:
controller, consumer, bucket, lease and endpoint names come from code, never from objects or users.

Hot paths pay a counter increment at most: the store and the consumers take their labelled children
once, and what can be read when scraped (queue depths, the bus connection) is read then, by collectors.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sized
from typing import Any, Final, Protocol, TypeVar

from nats.aio.client import Client as NATS
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from nodus_kit.errors import NodusError

K = TypeVar("K")
T = TypeVar("T")

# No ``*_created`` series beside each counter and histogram: Prometheus' text format has no use for them
# and they double what is scraped (a setting of the client for the whole process).
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY: Final = CollectorRegistry()
# Version 0.0.4, which every Prometheus reads; our names and labels are plain, so the body is the same.
CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)


def exposition() -> bytes:
    """The text exposition format of every metric of this process."""
    return generate_latest(REGISTRY)


# -- controller runtime ---------------------------------------------------------------------------------
RECONCILES: Final = Counter(
    "nodus_controller_reconciles",
    "Reconciles by outcome: ok, requeue (asked to look again later), retry (retryable error), "
    "error (permanent error or crash)",
    ["controller", "outcome"],
    registry=REGISTRY,
)
RECONCILE_SECONDS: Final = Histogram(
    "nodus_controller_reconcile_duration_seconds",
    "How long one reconcile took, whatever its outcome",
    ["controller"],
    registry=REGISTRY,
)


def metered_reconcile(
    controller: str, reconcile: Callable[[K], Awaitable[float | None]]
) -> Callable[[K], Awaitable[float | None]]:
    """``reconcile``, counted by outcome and timed; the outcomes are the controller runtime's own."""
    ok, requeue = RECONCILES.labels(controller, "ok"), RECONCILES.labels(controller, "requeue")
    retry, error = RECONCILES.labels(controller, "retry"), RECONCILES.labels(controller, "error")
    seconds = RECONCILE_SECONDS.labels(controller)

    async def metered(key: K) -> float | None:
        began = time.perf_counter()
        try:
            after = await reconcile(key)
        except NodusError as e:
            (retry if e.retryable else error).inc()
            raise
        except Exception:
            error.inc()  # a crash: requeued with backoff, but a bug all the same
            raise
        finally:
            seconds.observe(time.perf_counter() - began)
        (ok if after is None else requeue).inc()
        return after

    return metered


class _Queued(Protocol):
    name: str

    @property
    def queue(self) -> Sized: ...


class _QueueDepths(Collector):
    """Work queue depth per controller name, read when scraped (replicas of one controller in one
    process, as in tests, add up)."""

    def __init__(self) -> None:
        self.controllers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "nodus_controller_queue_depth", "Keys waiting in a controller's work queue", labels=["controller"]
        )
        depths: dict[str, int] = {}
        for controller in list(self.controllers.values()):
            depths[controller.name] = depths.get(controller.name, 0) + len(controller.queue)
        for name, depth in sorted(depths.items()):
            family.add_metric([name], depth)
        yield family


_queue_depths = _QueueDepths()
REGISTRY.register(_queue_depths)


def watch_queue(controller: _Queued) -> None:
    """Report ``controller.queue``'s length while the controller lives (it is not kept alive for it)."""
    _queue_depths.controllers[id(controller)] = controller


# -- consumers and endpoints ----------------------------------------------------------------------------
CONSUMED: Final = Counter(
    "nodus_consumer_messages",
    "Messages a durable consumer handled, by outcome: ack, retry (nak, redelivered later), dead "
    "(dead-lettered: undecodable, a permanent error, or out of deliveries)",
    ["stream", "consumer", "outcome"],
    registry=REGISTRY,
)
HANDLER_SECONDS: Final = Histogram(
    "nodus_consumer_handler_duration_seconds",
    "How long a consumer's handler took with one message, whatever its outcome",
    ["stream", "consumer"],
    registry=REGISTRY,
)
RPC_REQUESTS: Final = Counter(
    "nodus_rpc_requests",
    "Requests a served endpoint answered, by outcome: ok, forwarded (passed on to the service that"
    " answers), or the reason it answered (Nats-Service-Error)",
    ["endpoint", "outcome"],
    registry=REGISTRY,
)


def consumed(stream: str, consumer: str, outcome: str) -> None:
    CONSUMED.labels(stream, consumer, outcome).inc()


def timed_handler(
    stream: str, consumer: str, handler: Callable[[T], Awaitable[None]]
) -> Callable[[T], Awaitable[None]]:
    seconds = HANDLER_SECONDS.labels(stream, consumer)

    async def timed(delivery: T) -> None:
        began = time.perf_counter()
        try:
            await handler(delivery)
        finally:
            seconds.observe(time.perf_counter() - began)

    return timed


def served(endpoint: str, outcome: str) -> None:
    RPC_REQUESTS.labels(endpoint, outcome).inc()


# -- billing ---------------------------------------------------------------------------------------
BOOK_REPAIRS: Final = Counter(
    "nodus_billing_book_repairs",
    "Values billing found beyond a book's bounds (written by an older version) and repaired on read",
    registry=REGISTRY,
)


# -- node restriction (nodus_kit.vouching) ----------------------------------------------------------
REFUSED_FROM_NODES: Final = Counter(
    "nodus_node_messages_refused",
    "Reports, log lines and requests of a node agent about an Attempt that is not bound to that node "
    "(dropped: a compromised or misconfigured GPU host), by the service and what it refused",
    ["service", "what"],
    registry=REGISTRY,
)


# -- the object store and leases ------------------------------------------------------------------------
STORE_WRITES: Final = Counter(
    "nodus_store_writes",
    "Writes the object store made (acknowledged by the stream), by bucket and op (create, update, delete)",
    ["bucket", "op"],
    registry=REGISTRY,
)
STORE_CONFLICTS: Final = Counter(
    "nodus_store_conflicts",
    "Compare-and-set writes refused because the key changed since the revision read",
    ["bucket"],
    registry=REGISTRY,
)
STORE_OPS: Final = ("create", "update", "delete")


def store_meters(bucket: str) -> tuple[dict[str, Any], Any]:
    """The children an ObjectStore increments: writes by op, and conflicts (taken once per store)."""
    return {op: STORE_WRITES.labels(bucket, op) for op in STORE_OPS}, STORE_CONFLICTS.labels(bucket)


LEADER: Final = Gauge(
    "nodus_leader",
    "1 while a replica in this process holds the lease (leads), else 0",
    ["lease"],
    registry=REGISTRY,
)


# -- the bus connection ---------------------------------------------------------------------------------
class _BusConnections(Collector):
    """Read from nats-py's own statistics when scraped, so connecting needs no hooks of ours."""

    def __init__(self) -> None:
        self.connections: dict[int, tuple[str, NATS]] = {}

    def collect(self) -> Iterator[Metric]:
        connected = GaugeMetricFamily(
            "nodus_bus_connected", "1 while the service's NATS connection is up", labels=["service"]
        )
        reconnects = CounterMetricFamily(
            "nodus_bus_reconnects", "Times the NATS connection was re-established", labels=["service"]
        )
        msgs_in = CounterMetricFamily(
            "nodus_bus_messages_in", "Messages received on the NATS connection", labels=["service"]
        )
        msgs_out = CounterMetricFamily(
            "nodus_bus_messages_out", "Messages published on the NATS connection", labels=["service"]
        )
        by_service: dict[str, list[NATS]] = {}
        for service, nc in list(self.connections.values()):
            by_service.setdefault(service, []).append(nc)
        for service, ncs in sorted(by_service.items()):
            connected.add_metric([service], min(int(nc.is_connected) for nc in ncs))
            reconnects.add_metric([service], sum(nc.stats["reconnects"] for nc in ncs))
            msgs_in.add_metric([service], sum(nc.stats["in_msgs"] for nc in ncs))
            msgs_out.add_metric([service], sum(nc.stats["out_msgs"] for nc in ncs))
        yield from (connected, reconnects, msgs_in, msgs_out)


_bus = _BusConnections()
REGISTRY.register(_bus)


def track_bus(service: str, nc: NATS) -> None:
    _bus.connections[id(nc)] = (service, nc)


def untrack_bus(nc: NATS) -> None:
    _bus.connections.pop(id(nc), None)


# -- the gateway's HTTP API -----------------------------------------------------------------------------
HTTP_REQUESTS: Final = Counter(
    "nodus_http_requests",
    "HTTP requests the API answered, by verb (method), resource (plural, or other) and status code",
    ["verb", "resource", "code"],
    registry=REGISTRY,
)
HTTP_SECONDS: Final = Histogram(
    "nodus_http_request_duration_seconds",
    "How long an API request took, to its last byte (a watch: its whole life)",
    ["verb", "resource"],
    registry=REGISTRY,
)
HTTP_VERBS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class HttpMeter:
    """Counts and times requests; ``resources`` bounds the resource label (any other path is "other")."""

    def __init__(self, resources: Iterable[str]) -> None:
        self.resources = frozenset(resources)
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def resource_of(self, path: str) -> str:
        """The plural of ``/apis/<group>/<version>/namespaces/<ns>/<plural>/...`` or of
        ``/apis/<group>/<version>/<plural>/...`` when it is a known one; else "other"."""
        parts = path.strip("/").split("/")
        if len(parts) < 4 or parts[0] != "apis":
            return "other"
        rest = parts[3:]
        if rest[0] == "namespaces" and len(rest) >= 3:
            rest = rest[2:]
        return rest[0] if rest[0] in self.resources else "other"

    def observe(self, method: str, path: str, code: int, seconds: float) -> None:
        verb = method if method in HTTP_VERBS else "OTHER"
        resource = self.resource_of(path)
        # The labelled children, looked up once per (verb, resource, code): labels() validates and locks
        # on every call, a few µs on the gateway's hot path. The sets are small (verbs x kinds x codes).
        key = (verb, resource, code)
        children = self._children.get(key)
        if children is None:
            children = (HTTP_REQUESTS.labels(verb, resource, str(code)), HTTP_SECONDS.labels(verb, resource))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)


# -- services' own --------------------------------------------------------------------------------------
BILLING_HOLDS: Final = Counter(
    "nodus_billing_holds",
    "Hold requests billing answered: placed, or refused with the reason (InsufficientCredits, ...)",
    ["outcome", "reason"],
    registry=REGISTRY,
)
SCHEDULER_ATTEMPTS_CREATED: Final = Counter(
    "nodus_scheduler_attempts_created", "Attempts the scheduler created (placed on a node)", registry=REGISTRY
)
SCHEDULER_PLACEMENT_FAILURES: Final = Counter(
    "nodus_scheduler_placement_failures",
    "Jobs in line that could not be placed, by reason: Unschedulable (no node fits; counted when the "
    "Job's reason to wait changes, not on every pass), Unfunded (billing refused a hold), "
    "BillingUnavailable (billing did not answer)",
    ["reason"],
    registry=REGISTRY,
)
SWEEP_CELLS_CREATED: Final = Counter(
    "nodus_sweep_cells_created", "Cell Jobs the sweep controller created", registry=REGISTRY
)
AGENT_ATTEMPTS_STARTED: Final = Counter(
    "nodus_agent_attempts_started", "AttemptStarted reports the node agent sent", registry=REGISTRY
)
AGENT_ATTEMPTS_FINISHED: Final = Counter(
    "nodus_agent_attempts_finished",
    "AttemptFinished reports the node agent sent, by reason (Completed, Error, OOMKilled, ...)",
    ["reason"],
    registry=REGISTRY,
)
