"""Sync code on the worker's event loop: the blocking face of its async client for handlers
that run in threads, the daemon thread pool they run in, a sync client's transport seen as an
async one, and the loop itself (uvloop where installed)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any

import httpx

from squall.client._tasks import TaskBase

if TYPE_CHECKING:
    from squall.client._async import AsyncClient
    from squall.client._sync import Client


class Bridge:
    """The blocking face of the worker's AsyncClient, for tasks handled in threads."""

    def __init__(self, client: AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.loop = client, loop

    def _wait(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def payload(self, task: TaskBase) -> bytes:
        return bytes(self._wait(self.client.payload(task)))

    def iter_payload(self, task: TaskBase, chunk_bytes: int) -> Iterator[bytes]:
        agen = self.client.iter_payload(task, chunk_bytes)

        async def nxt() -> bytes | None:
            return await anext(agen, None)

        try:
            while (part := self._wait(nxt())) is not None:
                yield part
        finally:
            self._wait(_aclose(agen))

    def renew(self, task: TaskBase, lease_secs: float) -> Any:
        return self._wait(self.client.renew(task, lease_secs))

    def release(self, task: TaskBase, delay: float | None = None, error: str | None = None
                ) -> Any:
        return self._wait(self.client.release(task, delay=delay, error=error))

    def done(self, task: TaskBase) -> Any:
        return self._wait(self.client.done(task))


class ThreadTransport(httpx.AsyncBaseTransport):
    """A sync httpx transport (a ``Client``'s custom one) seen as an async one: each
    request runs in a thread, its body read whole (the worker runs on asyncio)."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()

        def send() -> httpx.Response:
            req = httpx.Request(request.method, request.url, headers=request.headers,
                                content=body, extensions=request.extensions)
            resp = self.inner.handle_request(req)
            try:
                content = resp.read()
            finally:
                resp.close()
            headers = [(k, v) for k, v in resp.headers.multi_items()
                       if k.lower() not in ("content-encoding", "transfer-encoding",
                                                      "content-length")]
            return httpx.Response(resp.status_code, headers=headers, content=content,
                                  extensions={k: v for k, v in resp.extensions.items()
                                              if k == "http_version"})

        return await asyncio.to_thread(send)

    async def aclose(self) -> None:
        pass  # the sync client owns its transport


class DaemonPool(Executor):
    """A fixed pool of daemon threads for sync handlers: a handler stuck past the grace
    period (its task already given back) does not keep the process from exiting, as a
    ThreadPoolExecutor's threads would."""

    def __init__(self, n: int) -> None:
        self._q: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]
                                   | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"squall-worker-{i}",
                                          daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._q.put((fut, lambda: fn(*args, **kwargs), ()))
        return fut

    def _work(self) -> None:
        while (item := self._q.get()) is not None:
            fut, fn, _ = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:
                    fut.set_exception(e)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._q.put(None)


async def _aclose(agen: AsyncIterator[bytes]) -> None:
    close = getattr(agen, "aclose", None)
    if close is not None:
        await close()


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The worker's own event loop: uvloop's where it is installed (with the servers)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with the servers' dependencies
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def async_twin(c: Client) -> AsyncClient:
    """An async client like `c`, on its transport (a sync one runs on threads)."""
    from squall.client._async import AsyncClient

    t: httpx.BaseTransport | httpx.AsyncBaseTransport | None = c.transport
    if t is not None and not hasattr(t, "handle_async_request"):
        t = ThreadTransport(t)
    return AsyncClient(c.master, transport=t, **c.options)  # type: ignore[arg-type]
