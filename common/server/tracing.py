"""Server spans (OpenTelemetry), only when asked for and installed.

A server emits spans for enqueue, lease and ack when an exporter is configured through
OpenTelemetry's standard variables — ``OTEL_TRACES_EXPORTER`` (``console``, or ``otlp`` with
``opentelemetry-exporter-otlp`` installed and ``OTEL_EXPORTER_OTLP_ENDPOINT``), and
``OTEL_SERVICE_NAME``, ``OTEL_BSP_*`` — and ``opentelemetry-sdk`` is installed. Otherwise
(the default; also ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``) nothing is
imported, :attr:`Spans.tracer` is None and callers skip :meth:`Spans.record`: one
attribute test per request.

Each span links to the trace context its tasks carry (at most :data:`MAX_LINKS`), so a
trace backend shows the server's work on a task next to the producer's and the worker's
spans. The server's own spans start new traces: a request may carry many tasks of many
traces.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("squall.tracing")
MAX_LINKS = 32


class Spans:
    """Where a server's spans go (nowhere unless configured, see the module doc)."""

    def __init__(self, service: str, env: dict[str, str] | None = None) -> None:
        self.tracer: Any = None
        self._provider: Any = None
        env = dict(os.environ) if env is None else env
        kind = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        if not kind or kind == "none" or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
            return
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import (
                BatchSpanProcessor,
                ConsoleSpanExporter,
            )
        except ImportError:
            log.warning("OTEL_TRACES_EXPORTER=%s but opentelemetry-sdk is not installed: "
                        "no spans", kind)
            return
        exporter: Any
        if kind == "console":
            exporter = ConsoleSpanExporter()
        elif kind == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError:
                log.warning("OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp: "
                            "no spans")
                return
            exporter = OTLPSpanExporter()
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported (console, otlp): no spans",
                        kind)
            return
        name = env.get("OTEL_SERVICE_NAME") or service
        self._provider = TracerProvider(resource=Resource.create({"service.name": name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self._provider.get_tracer("squall." + service)
        log.info("tracing: %s spans of %s", kind, name)

    def record(self, name: str, start_ns: int, attributes: dict[str, Any],
               traceparents: Iterable[str | None] = (), error: str | None = None) -> None:
        """Emit a finished span for work that began at `start_ns` (``time.time_ns()``),
        linked to the W3C trace contexts of its tasks. Call only when :attr:`tracer` is
        set (``if spans.tracer is not None``)."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )
        from opentelemetry.trace.status import Status, StatusCode

        links: list[Any] = []
        prop = TraceContextTextMapPropagator()
        for tp in traceparents:
            if tp and len(links) < MAX_LINKS:
                sc = trace.get_current_span(prop.extract({"traceparent": tp})
                                            ).get_span_context()
                if sc.is_valid:
                    links.append(trace.Link(sc))
        span = self.tracer.start_span(
            name, kind=trace.SpanKind.SERVER, links=links, start_time=start_ns,
            attributes={"messaging.system": "squall", **attributes})
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def close(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self.tracer = None
