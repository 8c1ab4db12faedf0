"""The blocking client's driver: it runs the protocol core's generators (``_protocol.Core``)
and performs their effects (HTTP calls, sleeps, stream reads, gathers) over
``httpx.Client`` or, on the direct path, the engine's transport (``common/transport``).
``_async.py`` has the same driver written with ``await``."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import httpx

from squall.client import _http
from squall.client._direct import Shortcut
from squall.client._effects import Call, Close, Emit, Gather, Join, Read, Reply, Sleep, Spawn
from squall.client._protocol import MAX_IN_FLIGHT, first_failure
from squall.common.errors import SquallError
from squall.common.masters import Masters
from squall.common.transport.adapters import SyncTransport
from squall.common.transport.http1 import Broken

T = TypeVar("T")
_GATHERED = threading.local()  # .on: this thread runs a verb of a Gather


class Driver:
    """Runs protocol generators over an ``httpx.Client``.

    A ``Gather`` runs its verbs on a thread pool kept for the client's life (made on first
    use, up to ``MAX_IN_FLIGHT`` threads), not on new threads each time: starting a thread
    waits for the GIL while the others are busy, which held up every wave of ``put_many``
    batches. A Gather inside a gathered verb gets threads of its own, so the pool never
    waits on itself. A ``Spawn`` runs its verb on the same pool (a ``Future`` to ``Join``)."""

    def __init__(self, http: httpx.Client, lean: SyncTransport | None = None,
                 token: str | None = None, masters: Masters | None = None) -> None:
        self.http = http
        masters = masters or Masters(str(http.base_url))
        self.masters = masters  # where a master's path goes (the leader of a master set)
        self.lean = lean  # the engine's transport (the default): calls may go direct
        self.shortcut = Shortcut(http, token, lean is not None, masters)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def run(self, gen: Generator[Any, Any, T]) -> T:
        out: list[T] = []
        for _ in self.iterate(gen, out):
            pass
        return out[0]

    def iterate(self, gen: Generator[Any, Any, Any], out: list[Any] | None = None
                ) -> Iterator[Any]:
        streams: list[httpx.Response] = []
        try:
            eff = next(gen)
            while True:
                if type(eff) is Emit:
                    yield eff.value
                    eff = gen.send(None)
                    continue
                try:
                    val = self._do(eff, streams)
                except SquallError as e:
                    eff = gen.throw(e)
                else:
                    eff = gen.send(val)
        except StopIteration as stop:
            if out is not None:
                out.append(stop.value)
        finally:
            gen.close()
            for r in streams:
                r.close()

    def _do(self, eff: Any, streams: list[httpx.Response]) -> Any:
        t = type(eff)
        if t is Call:
            return self._call(eff, streams)
        if t is Sleep:
            time.sleep(eff.secs)
            return None
        if t is Read:
            _resp, parts, c = eff.reply.stream
            try:
                return next(parts, b"")
            except httpx.HTTPError as e:
                raise _http.transport_error(e, c, self.masters.current) from e
        if t is Close:
            eff.reply.stream[0].close()
            return None
        if t is Gather:
            return self._gather(eff.gens)
        if t is Spawn:
            return self._shared_pool().submit(self._run_gathered, eff.gen)
        if t is Join:
            return eff.handle.result()
        raise TypeError(f"unknown effect {eff!r}")  # pragma: no cover

    def _gather(self, gens: list[Generator[Any, Any, Any]]) -> list[Any]:
        futures: list[Future[Any]]
        if getattr(_GATHERED, "on", False) or len(gens) > MAX_IN_FLIGHT:
            with ThreadPoolExecutor(len(gens), thread_name_prefix="squall-gather") as ex:
                futures = [ex.submit(self.run, g) for g in gens]
        else:
            pool = self._shared_pool()
            futures = [pool.submit(self._run_gathered, g) for g in gens]
            wait(futures)
        return first_failure([f.exception() or f.result() for f in futures])

    def _shared_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_IN_FLIGHT,
                                                thread_name_prefix="squall-gather")
            return self._pool

    def _run_gathered(self, gen: Generator[Any, Any, Any]) -> Any:
        _GATHERED.on = True
        try:
            return self.run(gen)
        finally:
            _GATHERED.on = False

    def _call(self, c: Call, streams: list[httpx.Response]) -> Any:
        if not c.url.startswith("/"):  # a data node's URL
            return self._send(c, streams, "")
        hops = 0
        while True:  # a master's path: to the leader (see common/masters.py)
            base = self.masters.current
            try:
                return self._send(c, streams, base)
            except SquallError as e:
                if not _http.resend_elsewhere(self.masters, base, e, e.__cause__, c, hops):
                    raise
            hops += 1

    def _send(self, c: Call, streams: list[httpx.Response], base: str) -> Any:
        direct = self.shortcut.prepare(c, base)  # None unless the default transport may take it
        try:
            if direct is not None:
                assert self.lean is not None
                return _http.result(c, self.lean.exchange(direct), base)
            args = _http.request_args(c)
            if base:
                args["url"] = base + c.url
            if not c.stream:
                return _http.result(c, self.http.request(**args), base)
            r = self.http.send(self.http.build_request(**args), stream=True)
            streams.append(r)
            if r.status_code >= 400:
                r.read()
                raise _http.status_error(r, c, base)
            return Reply(r.status_code, dict(r.headers), stream=(r, r.iter_bytes(), c))
        except (httpx.HTTPError, httpx.InvalidURL, Broken) as e:
            raise _http.transport_error(e, c, base) from e
