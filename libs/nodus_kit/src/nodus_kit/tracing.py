"""OpenTelemetry across the bus: trace context and the request id ride in NATS headers.

The W3C ``traceparent``/``tracestate`` headers carry the span context, so a span started in the gateway
continues in the scheduler and the agent. ``Nodus-Request-Id`` follows a request from the gateway to the
agent and into every error the user sees.
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

REQUEST_ID = "Nodus-Request-Id"
_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("nodus_request_id", default=None)

tracer = trace.get_tracer("nodus")


def setup(service: str, exporter: SpanExporter | None = None) -> TracerProvider:
    """Install a tracer provider for this process (once); an exporter is optional (tests pass one)."""
    from opentelemetry.sdk.resources import Resource

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def current_request_id() -> str | None:
    return _request_id.get()


def set_request_id(value: str | None) -> contextvars.Token[str | None]:
    return _request_id.set(value)


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add the current trace context and request id to outgoing headers."""
    propagate.inject(headers)
    rid = _request_id.get()
    if rid and REQUEST_ID not in headers:
        headers[REQUEST_ID] = rid
    return headers


def extract(headers: Mapping[str, str] | None) -> otel_context.Context:
    return propagate.extract(dict(headers or {}))
