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

import functools
import platform
import re
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

T = TypeVar("T")

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


class WorkTimes:
    """How long each kind of synchronous work held the event loop (requests wait behind
    it), one :class:`Hist` per kind; :meth:`timed` wraps a method of an object that has one
    as ``self.work``."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self.hists = {k: Hist() for k in kinds}

    @staticmethod
    def timed(kind: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def wrap(f: Callable[..., T]) -> Callable[..., T]:
            @functools.wraps(f)
            def timed_call(self: Any, *args: Any, **kwargs: Any) -> T:
                t0 = time.perf_counter()
                try:
                    return f(self, *args, **kwargs)
                finally:
                    self.work.hists[kind].observe(time.perf_counter() - t0)
            return timed_call
        return wrap


def _le(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(b)


def hist_text(name: str, doc: str, items: Iterable[tuple[dict[str, str], Hist]]) -> str:
    """A histogram family in Prometheus text, one series per (labels, Hist)."""
    out = [f"# HELP {name} {doc}\n# TYPE {name} histogram\n"]
    for labels, h in items:
        acc = 0
        for b, c in zip((*h.bounds, float("inf")), h.counts, strict=True):
            acc += c
            out.append(f"{name}_bucket{label_set(**labels, le=_le(b))} {value_text(acc)}\n")
        lab = label_set(**labels) if labels else ""
        out.append(f"{name}_count{lab} {value_text(acc)}\n{name}_sum{lab} "
                   f"{value_text(h.total)}\n")
    return "".join(out)


def histogram(name: str, doc: str, hist: Hist) -> str:
    return hist_text(name, doc, [({}, hist)])


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

    def collect(self, prefix: str) -> Iterator[Metric | str]:
        c = CounterMetricFamily(f"{prefix}_http_requests", "HTTP requests by route template "
                                "and status class", labels=["method", "route", "status"])
        for (method, route, st), n in sorted(self.requests.copy().items()):
            c.add_metric([method, route, st], n)
        yield c
        yield hist_text(f"{prefix}_http_request_duration_seconds",
                        "time to answer an HTTP request, by route template",
                        [({"method": m, "route": r}, h)
                         for (m, r), h in sorted(self.latency.copy().items())])


class HttpMetrics:
    """ASGI middleware recording every HTTP request into `stats` (time to the end of the
    answer). Routes label themselves (``scope["route"]``, set by FastAPI's router and by the
    fast dispatcher); `fallbacks` name the others (static files) by regex."""

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


@functools.cache
def _version() -> str:
    try:
        return version("squall")
    except PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "unknown"


def build_info(prefix: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily(f"{prefix}_build_info", "squall version and Python (always 1)",
                          labels=["version", "python"])
    g.add_metric([_version(), platform.python_version()], 1)
    return g


def value_text(v: float) -> str:
    """A sample value as Prometheus writes it (1.0, +Inf, NaN)."""
    f = float(v)
    if f != f:
        return "NaN"
    if f in (float("inf"), float("-inf")):
        return "+Inf" if f > 0 else "-Inf"
    return repr(f)


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_set(**labels: str) -> str:
    """``{k="v",...}`` with values escaped, names sorted (as prometheus_client writes)."""
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items())) + "}"


def render(families: Iterable[Metric | str]) -> str:
    """Prometheus text format (0.0.4) of `families`, as prometheus_client writes it, in a
    fraction of its time (its generic writer validates and escapes every name per sample;
    ours are fixed names, so only label values are escaped). A ``str`` item is text
    already in that format (for many series sharing label sets, built once)."""
    out: list[str] = []
    for fam in families:
        if isinstance(fam, str):
            out.append(fam)
            continue
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        doc = fam.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {fam.type}\n")
        for smp in fam.samples:
            if smp.labels:
                labels = ",".join(f'{k}="{_label(str(v))}"' for k, v in sorted(smp.labels.items()))
                out.append(f"{smp.name}{{{labels}}} {value_text(smp.value)}\n")
            else:
                out.append(f"{smp.name} {value_text(smp.value)}\n")
    return "".join(out)


class Exposition:
    """A component's ``/metrics`` body: its own families (`collect`, rendered by
    :func:`render`) and the standard ``process_*`` and ``python_*`` collectors."""

    def __init__(self, collect: Callable[[], Iterator[Metric | str]]) -> None:
        self.collect = collect
        self.std = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.std)
        PlatformCollector(registry=self.std)
        GCCollector(registry=self.std)

    def body(self) -> bytes:
        return render(self.collect()).encode() + generate_latest(self.std)
