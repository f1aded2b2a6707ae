"""OpenTelemetry across the bus and the store: one trace from the gateway to the agent (ADR-0032).

The W3C ``traceparent``/``tracestate`` headers carry the span context on every message, so a span started
in the gateway continues in the scheduler and the agent. ``Nodus-Request-Id`` follows a request from the
gateway to the agent and into every error the user sees.

A message is not the whole path: a Job reaches the scheduler through a KV write and a watch, and its
reconciles run from a work queue that coalesces events. So the trace context of an object's creation is
stored **on the object**, as the annotation ``nodus.dev/traceparent``: the gateway writes it on create
(:func:`stamp`), the sweep controller on each cell Job, and every controller starts its spans for an
object as children of it (:func:`object_span`), whatever queue or watch brought the object there.

Export: :func:`setup` installs an OTLP/HTTP exporter when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (the standard variables; the exporter reads the rest, such
as headers and timeouts, itself), and nothing at all otherwise: then no span is recorded, no object is
annotated, and the spans below cost a flag check.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Final, Protocol, TypeVar

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from nodus_schema.meta import ObjectMeta

log = logging.getLogger(__name__)

REQUEST_ID = "Nodus-Request-Id"
TRACEPARENT_ANNOTATION: Final = "nodus.dev/traceparent"
"""The W3C traceparent of the span that created the object; written by the server only."""
ENDPOINT_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SHUTDOWN_TIMEOUT_S: Final = 3.0
"""How long a stopping process waits for its last spans to leave (a collector that is gone must not
hold the exit up past an orchestrator's grace)."""

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("nodus_request_id", default=None)
_w3c = TraceContextTextMapPropagator()
_provider: TracerProvider | None = None

tracer = trace.get_tracer("nodus")

T = TypeVar("T", bound="HasMeta")


class HasMeta(Protocol):
    """Any stored object: Sweep, Job, Attempt, ..."""

    @property
    def metadata(self) -> ObjectMeta: ...


# -- the provider ------------------------------------------------------------------------------------
def setup(
    service: str, exporter: SpanExporter | None = None, environ: Mapping[str, str] | None = None
) -> TracerProvider | None:
    """Install this process's tracer provider (once), named ``service``: with ``exporter`` (tests pass
    one), or an OTLP/HTTP exporter when an endpoint variable is set; with neither, none (returns None)."""
    global _provider
    env = os.environ if environ is None else environ
    endpoint = next((env[v] for v in ENDPOINT_VARIABLES if env.get(v)), None)
    if exporter is None and endpoint is None:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        # Imported only here: the exporter brings protobuf and requests, which a process without an
        # endpoint does not need to load.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("exporting traces", extra={"endpoint": endpoint})
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def enabled() -> bool:
    """Whether this process records spans (:func:`setup` installed a provider)."""
    return _provider is not None


def shutdown(timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Send the spans still queued, for at most ``timeout_s``; the stop path of every process."""
    provider = _provider
    if provider is None:
        return
    # The SDK's shutdown waits up to 30 s per processor, and the exporter retries an unreachable
    # collector for its own timeout: bounded here by a daemon thread the exit does not wait for.
    done = threading.Thread(target=provider.shutdown, name="tracing-shutdown", daemon=True)
    done.start()
    done.join(timeout_s)
    if done.is_alive():
        log.warning("traces not all exported within %ss of the stop", timeout_s)


# -- the request id ----------------------------------------------------------------------------------
def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def current_request_id() -> str | None:
    return _request_id.get()


def set_request_id(value: str | None) -> contextvars.Token[str | None]:
    return _request_id.set(value)


# -- headers -----------------------------------------------------------------------------------------
def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add the current trace context and request id to outgoing headers."""
    propagate.inject(headers)
    rid = _request_id.get()
    if rid and REQUEST_ID not in headers:
        headers[REQUEST_ID] = rid
    return headers


def extract(headers: Mapping[str, str] | None) -> otel_context.Context:
    return propagate.extract(dict(headers or {}))


# -- the trace context on objects --------------------------------------------------------------------
def current_traceparent() -> str | None:
    """The current span's context as a W3C traceparent; None without a valid one (tracing off)."""
    carrier: dict[str, str] = {}
    _w3c.inject(carrier)
    return carrier.get("traceparent")


def traceparent_of(obj: HasMeta) -> str | None:
    return obj.metadata.annotations.get(TRACEPARENT_ANNOTATION)


def context_of(traceparent: str | None) -> otel_context.Context:
    """A context whose parent is ``traceparent``; an empty one (a new trace) when it is None or not a
    valid traceparent (a user cannot set the annotation, but an object may predate it)."""
    if not traceparent:
        return otel_context.Context()
    return _w3c.extract({"traceparent": traceparent}, context=otel_context.Context())


def with_traceparent(annotations: Mapping[str, str], traceparent: str | None) -> dict[str, str]:
    """``annotations`` with the trace annotation set to ``traceparent`` (removed when None), whatever they
    said: the gateway drops a user's value on create and keeps the stored one on update."""
    out = {k: v for k, v in annotations.items() if k != TRACEPARENT_ANNOTATION}
    if traceparent is not None:
        out[TRACEPARENT_ANNOTATION] = traceparent
    return out


def stamp(obj: T) -> T:
    """``obj`` (about to be created) annotated with the current span's context; unchanged without one."""
    traceparent = current_traceparent()
    if traceparent is None:
        return obj
    annotations = with_traceparent(obj.metadata.annotations, traceparent)
    meta = msgspec.structs.replace(obj.metadata, annotations=annotations)
    return msgspec.structs.replace(obj, metadata=meta)  # type: ignore[type-var]


def attributes_of(obj: HasMeta, kind: str | None = None) -> dict[str, str]:
    """The span attributes that name an object."""
    meta = obj.metadata
    out = {"nodus.namespace": meta.namespace or "", "nodus.name": meta.name or ""}
    kind = kind or getattr(obj, "kind", None)
    if kind:
        out["nodus.kind"] = kind
    return out


@contextlib.contextmanager
def continued(traceparent: str | None) -> Iterator[None]:
    """Run in the trace of ``traceparent`` (one kept on disk or on an object): what is published meanwhile
    carries it on. Unchanged when it is None."""
    if not traceparent:
        yield
        return
    token = otel_context.attach(context_of(traceparent))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def object_span(
    name: str,
    obj: HasMeta,
    attributes: Mapping[str, Any] | None = None,
    *,
    tracer_: trace.Tracer | None = None,
) -> Iterator[Span]:
    """A span about ``obj``, a child of the context stored on it: every reconcile of a Job joins the Job's
    trace, whichever event, resync or coalesced queue entry started it. Does nothing with tracing off
    (``tracer_``: tests pass their own provider's)."""
    if tracer_ is None:
        if _provider is None:
            yield trace.INVALID_SPAN
            return
        tracer_ = tracer
    attrs = {**attributes_of(obj), **_set(attributes)}
    ctx = context_of(traceparent_of(obj))
    with tracer_.start_as_current_span(name, context=ctx, attributes=attrs) as span:
        yield span


@contextlib.contextmanager
def server_span(
    name: str,
    headers: Mapping[str, str],
    attributes: Mapping[str, Any] | None = None,
    *,
    tracer_: trace.Tracer | None = None,
) -> Iterator[Span]:
    """The span of one request a server handles: a child of the caller's ``traceparent`` header if it
    sent one, else a new trace's root. Does nothing with tracing off."""
    if tracer_ is None:
        if _provider is None:
            yield trace.INVALID_SPAN
            return
        tracer_ = tracer
    ctx = propagate.extract(dict(headers))
    attrs = _set(attributes)
    with tracer_.start_as_current_span(name, context=ctx, kind=SpanKind.SERVER, attributes=attrs) as span:
        yield span


def set_attributes(attributes: Mapping[str, Any]) -> None:
    """Add attributes to the current span (none, or one that records nothing, ignores them)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(_set(attributes))


def _set(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """The attributes that have a value (OpenTelemetry refuses None)."""
    return {k: v for k, v in (attributes or {}).items() if v is not None}
