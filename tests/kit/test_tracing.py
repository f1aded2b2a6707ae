"""The trace context on objects (ADR-0032): stamping, continuing, and the spans controllers start.

These tests use a provider of their own, never the process-wide one: installing that would make every
later test in the session record spans (and the gateway annotate objects).
"""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NATS
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nodus_kit import messaging, tracing
from nodus_kit.tracing import TRACEPARENT_ANNOTATION
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def job(annotations: dict[str, str] | None = None) -> Job:
    meta = ObjectMeta(name="train", namespace="team-a", annotations=annotations or {})
    return Job(metadata=meta, spec=JobSpec(image="img", command=["python"]))


def test_tracing_is_off_without_an_endpoint_and_costs_nothing() -> None:
    assert tracing.setup("nodus-test", environ={}) is None
    assert not tracing.enabled()
    j = job({TRACEPARENT_ANNOTATION: PARENT})
    with tracing.object_span("reconcile Job", j) as span:
        assert span is trace.INVALID_SPAN
        assert tracing.current_traceparent() is None  # nothing attached: nothing to publish
    assert tracing.stamp(job()) == job()


def test_stamp_writes_the_current_span_and_replaces_what_was_there(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, _ = spans
    with tracer.start_as_current_span("POST jobs") as span:
        stamped = tracing.stamp(job({TRACEPARENT_ANNOTATION: PARENT, "team": "a"}))
        ctx = span.get_span_context()
    want = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    assert stamped.metadata.annotations == {TRACEPARENT_ANNOTATION: want, "team": "a"}
    assert tracing.traceparent_of(stamped) == want
    assert stamped.spec == job().spec


def test_with_traceparent_sets_or_removes_only_that_annotation() -> None:
    assert tracing.with_traceparent({"a": "1", TRACEPARENT_ANNOTATION: "x"}, None) == {"a": "1"}
    assert tracing.with_traceparent({"a": "1"}, PARENT) == {"a": "1", TRACEPARENT_ANNOTATION: PARENT}


def test_every_span_about_an_object_is_a_child_of_its_annotation(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    j = job({TRACEPARENT_ANNOTATION: PARENT})
    # Whatever runs around it (another object's span, a coalesced queue): the object's trace wins.
    with tracer.start_as_current_span("unrelated"):
        for _ in range(2):
            with tracing.object_span(
                "reconcile Job", j, {"nodus.attempt": "a1", "skip": None}, tracer_=tracer
            ):
                assert tracing.current_traceparent() is not None
    reconciles = [s for s in exporter.get_finished_spans() if s.name == "reconcile Job"]
    assert len(reconciles) == 2
    for s in reconciles:
        assert s.context is not None and s.parent is not None
        assert f"{s.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
        assert f"{s.parent.span_id:016x}" == "b7ad6b7169203331"
        assert dict(s.attributes or {}) == {
            "nodus.namespace": "team-a",
            "nodus.name": "train",
            "nodus.kind": "Job",
            "nodus.attempt": "a1",
        }


@pytest.mark.parametrize(
    "annotation", [None, "", "not-a-traceparent", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"]
)
def test_an_object_without_a_valid_annotation_starts_a_trace_of_its_own(
    spans: tuple[trace.Tracer, InMemorySpanExporter], annotation: str | None
) -> None:
    tracer, exporter = spans
    j = job({} if annotation is None else {TRACEPARENT_ANNOTATION: annotation})
    with tracer.start_as_current_span("unrelated"), tracing.object_span("reconcile Job", j, tracer_=tracer):
        pass
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "reconcile Job"]
    assert span.parent is None  # a root: not the unrelated span it ran under


def test_server_span_continues_the_callers_trace_or_starts_one(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    with tracing.server_span("POST /x", {"traceparent": PARENT}, {"url.path": "/x"}, tracer_=tracer):
        pass
    with tracing.server_span("POST /y", {}, tracer_=tracer):
        pass
    x, y = exporter.get_finished_spans()
    assert x.parent is not None and f"{x.parent.span_id:016x}" == "b7ad6b7169203331"
    assert x.kind == trace.SpanKind.SERVER and dict(x.attributes or {}) == {"url.path": "/x"}
    assert y.parent is None


async def test_continued_puts_a_stored_context_on_what_is_published(nc: NATS, unique: str) -> None:
    """The agent's path after a restart: a report sent from the attempt's record joins the run's trace."""
    js = nc.jetstream()
    subject = f"nodus.report.n1.{unique}.a1"
    sub = await nc.subscribe(subject)
    with tracing.continued(PARENT):
        await messaging.publish(js, subject, {"type": "AttemptStarted"}, msg_id=f"{unique}:started")
    with tracing.continued(None):
        await messaging.publish(js, subject, {"type": "AttemptFinished"}, msg_id=f"{unique}:finished")
    first = await sub.next_msg(timeout=5)
    second = await sub.next_msg(timeout=5)
    await sub.unsubscribe()
    assert (first.headers or {}).get("traceparent") == PARENT
    assert "traceparent" not in (second.headers or {})
    assert otel_context.get_current() == otel_context.Context()  # detached again


async def test_a_task_started_inside_a_span_keeps_its_context(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    """Why the agent's reports join the trace without more code: an attempt's supervising task is
    created inside the StartAttempt's consume span, and asyncio copies the context into it."""
    tracer, _ = spans
    with tracer.start_as_current_span("consume nodus.assign.n1") as span:
        inside = asyncio.create_task(_traceparent_later())
        ctx = span.get_span_context()
    assert await inside == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


async def _traceparent_later() -> str | None:
    await asyncio.to_thread(lambda: None)  # runs after the span has ended
    return tracing.current_traceparent()
