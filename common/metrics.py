"""Prometheus metrics shared by the master and the data node: request counts and latency
histograms per route template (an ASGI middleware), cheap latency histograms, and the
registry with the standard ``process_*`` and ``python_*`` collectors and ``*_build_info``.

Hot paths record into :class:`Hist` (a list of bucket counts and a sum: one bisect and two
additions, no lock: each histogram has one recording thread, the event loop or the WAL
writer); collectors turn them into metric families at scrape time, copying dicts first
(a scrape may run on another thread).
Labels stay bounded: routes are the app's route templates (never raw paths), plus
``other`` for paths no route matched.
"""

from __future__ import annotations

import platform
import re
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# seconds: 100 us .. 10 s
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Hist:
    """A histogram's bucket counts (non-cumulative; the last is +Inf) and sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.total += v

    def add_to(self, fam: HistogramMetricFamily, labels: list[str]) -> None:
        acc, buckets = 0, []
        for b, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += c
            buckets.append((_le(b), acc))
        fam.add_metric(labels, buckets, self.total)


def _le(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(b)


def histogram(name: str, doc: str, hist: Hist) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=[])
    hist.add_to(fam, [])
    return fam


class HttpStats:
    """Requests by method, route template and status class; latency by method and route."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.latency: dict[tuple[str, str], Hist] = {}

    def record(self, method: str, route: str, status: int, secs: float) -> None:
        key = (method, route, f"{status // 100}xx")
        self.requests[key] = self.requests.get(key, 0) + 1
        h = self.latency.get((method, route))
        if h is None:
            h = self.latency[(method, route)] = Hist()
        h.observe(secs)

    def collect(self, prefix: str) -> Iterator[Metric]:
        c = CounterMetricFamily(f"{prefix}_http_requests", "HTTP requests by route template "
                                "and status class", labels=["method", "route", "status"])
        for (method, route, st), n in sorted(self.requests.copy().items()):
            c.add_metric([method, route, st], n)
        yield c
        h = HistogramMetricFamily(f"{prefix}_http_request_duration_seconds",
                                  "time to answer an HTTP request, by route template",
                                  labels=["method", "route"])
        for (method, route), hist in sorted(self.latency.copy().items()):
            hist.add_to(h, [method, route])
        yield h


class HttpMetrics:
    """ASGI middleware recording every HTTP request into `stats` (time to the end of the
    answer). `fallbacks` name routes served below the router (fast paths) by regex."""

    def __init__(self, app: ASGIApp, stats: HttpStats,
                 fallbacks: list[tuple[re.Pattern[str], str]] | None = None) -> None:
        self.app = app
        self.stats = stats
        self.fallbacks = fallbacks or []

    def template(self, scope: Scope) -> str:
        route = scope.get("route")
        path = getattr(route, "path_format", None) or getattr(route, "path", None)
        if path:
            return str(path)
        raw = scope.get("path", "")
        for rx, name in self.fallbacks:
            if rx.match(raw):
                return name
        return "other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_wrapper(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.stats.record(scope.get("method", ""), self.template(scope), status,
                              time.perf_counter() - t0)


def build_info(prefix: str) -> GaugeMetricFamily:
    try:
        v = version("squall")
    except PackageNotFoundError:  # pragma: no cover - a bare checkout
        v = "unknown"
    g = GaugeMetricFamily(f"{prefix}_build_info", "squall version and Python (always 1)",
                          labels=["version", "python"])
    g.add_metric([v, platform.python_version()], 1)
    return g


class _Fn:
    def __init__(self, fn: Callable[[], Iterator[Metric]]) -> None:
        self.collect = fn


def registry(collect: Callable[[], Iterator[Metric]]) -> CollectorRegistry:
    """A registry with `collect` (the component's own metrics) and the standard process
    and Python collectors."""
    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)
    reg.register(_Fn(collect))  # type: ignore[arg-type]
    return reg
