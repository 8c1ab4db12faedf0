"""W3C trace context across the queue, through OpenTelemetry when it is installed.

``opentelemetry-api`` is optional (the ``otel`` extra). Without it, nothing here does
anything: no context is taken at enqueue, no span is started around a handler.

- :func:`current` gives the ``traceparent``/``tracestate`` of the current context (what
  ``put`` stores with a task unless it is given one).
- :func:`consumer_span` wraps a Worker's handler in a CONSUMER span ``process <queue>``
  with the OpenTelemetry messaging attributes, linked to the producer's span. The first
  attempt is a child of the producer's span (one trace from enqueue to work); a retry
  (``attempts > 1``) starts a new trace, linked to the producer's, as the messaging
  conventions ask, so a task retried for days does not stretch one trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:  # optional: the `otel` extra
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - exercised where the extra is absent
    trace = None  # type: ignore[assignment]


def enabled() -> bool:
    return trace is not None


def current() -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of the current span's context, or (None, None)."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None, None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate") or None


@contextlib.contextmanager
def consumer_span(queue: str, pid: str, attempts: int, traceparent: str | None,
                  tracestate: str | None) -> Iterator[Any]:
    """The span a Worker runs one task's handler in (see the module doc); a no-op
    without OpenTelemetry."""
    if trace is None:
        yield None
        return
    links = []
    parent = otel_context.Context()  # a new trace, unless this is the first attempt
    if traceparent:
        carrier = {"traceparent": traceparent}
        if tracestate:
            carrier["tracestate"] = tracestate
        producer = propagate.extract(carrier, context=otel_context.Context())
        sc = trace.get_current_span(producer).get_span_context()
        if sc.is_valid:
            links.append(trace.Link(sc))
            if attempts <= 1:
                parent = producer
    attrs: dict[str, str | int] = {
        "messaging.system": "squall", "messaging.operation.type": "process",
        "messaging.operation.name": "process", "messaging.destination.name": queue,
        "messaging.message.id": pid, "messaging.squall.attempts": attempts}
    tracer = trace.get_tracer("squall.worker")
    with tracer.start_as_current_span(f"process {queue}", context=parent,
                                      kind=trace.SpanKind.CONSUMER, links=links,
                                      attributes=attrs) as span:
        yield span
