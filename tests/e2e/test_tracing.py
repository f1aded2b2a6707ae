"""One trace from the gateway through every service to the agent (issue #9, ADR-0032).

The real stack runs as processes with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a tiny OTLP/HTTP
receiver in this test, which decodes what the services export. A Job created over HTTP crosses a KV
write, the scheduler's work queue and binder, billing's hold endpoint and meter, the assignment stream,
the agent and its on-disk outbox, and the report consumers: every span of it must arrive in ONE trace,
rooted at the gateway's request span, with every other span's parent in the trace too.
"""

from __future__ import annotations

import contextlib
import gzip
import ssl
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nodus_kit.tracing import TRACEPARENT_ANNOTATION
from nodus_testing.localstack import Stack, agent
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow

GATEWAY, SCHEDULER, BILLING, AGENT, SWEEPS = (
    "nodus-gateway",
    "nodus-scheduler",
    "nodus-billing",
    "nodus-agent",
    "nodus-sweeps",
)


# -- a tiny OTLP/HTTP receiver ------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    service: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    name: str
    attributes: dict[str, Any]


class Receiver(ThreadingHTTPServer):
    """POST /v1/traces with a protobuf ExportTraceServiceRequest; every span it held is kept. Serves from
    its own thread, so the stack's processes can export while the test blocks (starting the stack)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def keep(self, request: ExportTraceServiceRequest) -> None:
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    span = Span(
                        service=str(resource.get("service.name", "")),
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        name=s.name,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                    )
                    with self.lock:
                        self.spans.append(span)

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the exporter keeps its connection alive between batches
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        found = self.path == "/v1/traces"
        if found:
            self.server.keep(ExportTraceServiceRequest.FromString(body))
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per batch is noise in the test's output


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


# -- the stack ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield r
    finally:
        r.shutdown()
        r.server_close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[dict[str, str]]:
    root: Path = tmp_path_factory.mktemp("traced")
    s = Stack(
        root,
        agents=[agent("l4-t", "l4-x1-us", "us", "L4", "24Gi")],
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms between batches: the test waits less
        },
    )
    try:
        yield s.start(deadline_s=90)
    finally:
        s.stop()


@contextlib.asynccontextmanager
async def client(values: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=values["NODUS_URL"],
        headers={"Authorization": f"Bearer {values['NODUS_TOKEN']}"},
        timeout=10,
        verify=ssl.create_default_context(cafile=values["NODUS_CA"]),
    ) as http:
        yield http


def job_body(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "image": "python:3.11-slim",
            "command": [sys.executable, "-c", "print('traced')"],
            "resources": {"gpu": "L4:1"},
            "backoffLimit": 0,
        },
    }


def trace_id_of(obj: dict[str, Any]) -> str:
    traceparent = obj["metadata"]["annotations"][TRACEPARENT_ANNOTATION]
    version, trace_id, span_id, flags = traceparent.split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16), traceparent
    assert int(flags, 16) & 1, f"not sampled: {traceparent}"
    return str(trace_id)


def tree_problems(spans: list[Span]) -> list[str]:
    """Why ``spans`` are not one tree rooted at the gateway's request span (empty: they are)."""
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if not s.parent_id]
    problems = [f"orphan {s.service}/{s.name}" for s in spans if s.parent_id and s.parent_id not in ids]
    if len(roots) != 1 or roots[0].service != GATEWAY or not roots[0].name.startswith("POST "):
        problems.append(f"roots: {[(r.service, r.name) for r in roots]}")
    return problems


async def until_traced(
    receiver: Receiver, trace_id: str, services: AbstractSet[str], names: AbstractSet[str] = frozenset()
) -> list[Span]:
    """The trace once spans from every one of ``services`` arrived (and named ``names``), connected."""

    def ready() -> list[Span]:
        spans = receiver.trace(trace_id)
        seen = {s.service for s in spans}
        missing = services - seen
        assert not missing, f"no span yet from {sorted(missing)}; have {sorted(seen)}"
        assert names <= {s.name for s in spans}, f"spans so far: {sorted({s.name for s in spans})}"
        # Batches leave each process on its own schedule: a child may arrive before its parent.
        problems = tree_problems(spans)
        assert not problems, problems
        return spans

    return await eventually(ready, deadline_s=30, interval_s=0.1, message="the trace never became whole")


# -- the tests ----------------------------------------------------------------------------------------
async def test_a_job_is_one_trace_from_the_gateway_to_the_agent(
    stack: dict[str, str], receiver: Receiver
) -> None:
    rec = receiver
    base = "/apis/nodus.dev/v1/namespaces/traced"
    async with client(stack) as http:
        created = await http.post(f"{base}/jobs", json=job_body("one"))
        assert created.status_code == 201, created.text
        trace_id = trace_id_of(created.json())

        async def succeeded() -> bool:
            job = (await http.get(f"{base}/jobs/one")).json()
            return bool(job.get("status", {}).get("phase") == "Succeeded")

        await eventually(succeeded, deadline_s=60, interval_s=0.25, message="the Job never succeeded")
    start = "consume nodus.assign.l4-t"
    spans = await until_traced(
        rec,
        trace_id,
        {GATEWAY, SCHEDULER, BILLING, AGENT},
        {"reconcile Job", "assign", "fund", "meter Job", start},
    )
    by_id = {s.span_id: s for s in spans}
    root = next(s for s in spans if not s.parent_id)
    assert root.name == "POST /apis/nodus.dev/v1/namespaces/{namespace}/jobs"
    assert root.attributes["http.response.status_code"] == 201
    # The object's annotation is the request span: every reconcile hangs off it, whatever the queue did.
    assert trace_id_of(created.json()) == root.trace_id
    assert created.json()["metadata"]["annotations"][TRACEPARENT_ANNOTATION].split("-")[2] == root.span_id
    reconciles = [s for s in spans if s.name in ("reconcile Job", "meter Job")]
    assert {s.parent_id for s in reconciles} == {root.span_id}
    assert all(s.attributes["nodus.name"] == "one" for s in reconciles)
    # StartAttempt went out inside the Job's "assign" span, so the agent's consume span is its child ...
    agent_span = next(s for s in spans if s.name == start)
    assign = by_id[agent_span.parent_id]
    assert (assign.service, assign.name, assign.attributes["nodus.node"]) == (SCHEDULER, "assign", "l4-t")
    assert agent_span.attributes["nodus.attempt"] == assign.attributes["nodus.attempt"]
    # ... billing's hold was asked inside the Job's "fund" span ...
    hold = next(s for s in spans if s.name == "serve nodus.rpc.billing.hold")
    assert (by_id[hold.parent_id].service, by_id[hold.parent_id].name) == (SCHEDULER, "fund")
    # ... and the agent's reports, sent later from its on-disk outbox, carry the StartAttempt's context:
    # the scheduler's and billing's report consumers are children of the agent's span.
    report = f"nodus.report.l4-t.traced.{assign.attributes['nodus.attempt']}"

    def consumers() -> set[str]:
        spans = rec.trace(trace_id)
        got = {
            s.service for s in spans if s.name == f"consume {report}" and s.parent_id == agent_span.span_id
        }
        assert got == {SCHEDULER, BILLING}, got
        return got

    await eventually(consumers, deadline_s=30, interval_s=0.1, message="reports left the trace")


async def test_a_sweep_is_one_trace_through_its_cell_jobs(stack: dict[str, str], receiver: Receiver) -> None:
    rec = receiver
    base = "/apis/nodus.dev/v1/namespaces/traced-sweep"
    sweep = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": "sw"},
        "spec": {
            "matrix": {"params": {"N": ["1"]}},
            "template": {"kind": "Job", "spec": job_body("x")["spec"]},
        },
    }
    async with client(stack) as http:
        created = await http.post(f"{base}/sweeps", json=sweep)
        assert created.status_code == 201, created.text
        trace_id = trace_id_of(created.json())

        async def cell() -> dict[str, Any] | None:
            job = (await http.get(f"{base}/jobs/sw-0")).json()
            return job if job.get("status", {}).get("phase") == "Succeeded" else None

        job = await eventually(cell, deadline_s=60, interval_s=0.25, message="the cell never succeeded")
    # The cell Job carries the Sweep's trace, from the sweep controller's reconcile that created it.
    assert trace_id_of(job) == trace_id
    spans = await until_traced(
        rec, trace_id, {GATEWAY, SWEEPS, SCHEDULER, BILLING, AGENT}, {"reconcile Sweep", "assign"}
    )
    by_id = {s.span_id: s for s in spans}
    creator = by_id[job["metadata"]["annotations"][TRACEPARENT_ANNOTATION].split("-")[2]]
    assert (creator.service, creator.name, creator.attributes["nodus.name"]) == (
        SWEEPS,
        "reconcile Sweep",
        "sw",
    )
    assigns = [s for s in spans if s.name == "assign"]
    assert assigns and all(by_id[s.parent_id] is creator for s in assigns)


async def test_users_cannot_set_or_change_the_trace_annotation(stack: dict[str, str]) -> None:
    base = "/apis/nodus.dev/v1/namespaces/traced-rules"
    forged = "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"
    async with client(stack) as http:
        created = await http.post(f"{base}/jobs", json=job_body("forged", {TRACEPARENT_ANNOTATION: forged}))
        assert created.status_code == 201, created.text
        own = created.json()["metadata"]["annotations"][TRACEPARENT_ANNOTATION]
        assert own != forged  # the server's, from the request's span
        # A merge patch that changes it (and another annotation): the other change is kept, this one not.
        patched = await http.patch(
            f"{base}/jobs/forged",
            json={"metadata": {"annotations": {TRACEPARENT_ANNOTATION: forged, "team": "a"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert patched.status_code == 200, patched.text
        assert patched.json()["metadata"]["annotations"] == {TRACEPARENT_ANNOTATION: own, "team": "a"}

        async def put_without() -> dict[str, Any]:
            current = (await http.get(f"{base}/jobs/forged")).json()
            current["metadata"]["annotations"] = {}
            put = await http.put(f"{base}/jobs/forged", json=current)
            assert put.status_code == 200, put.text  # 409 while the scheduler writes the status: again
            return dict(put.json())

        # A PUT without it keeps it as well (as the stored rate ceiling is kept), and is no spec change.
        put = await eventually(put_without, deadline_s=10, interval_s=0.1, message="PUT never went in")
        assert put["metadata"]["annotations"] == {TRACEPARENT_ANNOTATION: own}
        assert put["metadata"]["generation"] == 1
