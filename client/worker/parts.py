"""Pieces of the worker runtime (``runtime.py``): its counters, its event loop, the async
twin of a sync client, the blocking face of the async client for sync handlers, the daemon
thread pool they run in, the reading of a handler's return value as follow-up tasks, the
renewal of a batch of leases and burst mode's check for remaining tasks."""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from squall.client._tasks import NewTask, TaskBase
from squall.common.errors import Conflict, NotFound, SquallError
from squall.common.wire.names import split_queue

if TYPE_CHECKING:
    from squall.client._async import AsyncClient
    from squall.client._sync import Client

Handler = Callable[[Any], Any]
log = logging.getLogger("squall.worker")


@dataclass
class WorkerStats:
    """What happened to the tasks a worker leased.

    - ``done``: the handler returned and the dequeue (with its follow-ups) is durable.
    - ``failed``: the handler raised; the task was released with the error (it counts
      toward the queue's ``max_attempts``). Only the handler's own failures count here: a
      dequeue that the master could not take (restarting, unreachable) is retried while
      the lease lasts and is never reported as a failure.
    - ``lost``: the result was dropped because the lease was lost (expired and leased
      again, reset) or ran out while the master was unreachable; the task runs again.
    - ``released``: given back unfinished at shutdown.
    """

    leased: int = 0
    done: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0


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


async def renew(client: AsyncClient, tasks: list[TaskBase], lease_secs: float, now: float,
                lost: set[int]) -> None:
    """Renew the leases of `tasks` in one update; when it is refused, one task at a time,
    so one lost lease (added to `lost` by id) does not keep the others from being renewed.
    Other failures (the master away) are logged: the next pass tries again."""
    try:
        await client._run(client._core.renew(tasks, lease_secs))
    except SquallError as e:
        if len(tasks) > 1:
            for t in tasks:
                await renew(client, [t], lease_secs, now, lost)
            return
        t = tasks[0]
        if isinstance(e, NotFound | Conflict):
            if not t.finished:
                log.warning("task %s %r: lease lost (%s)", t.queue, t.pid, e)
                lost.add(id(t))
        else:
            log.warning("renewing %s %r failed, will retry: %s", t.queue, t.pid, e)
        return
    for t in tasks:
        t.leased_at = now


def is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None))  # noqa: B004 - callable objects


def describe_error(e: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception(e))
    head = f"{type(e).__name__}: {e}"
    return (head + "\n" + text[-(limit - len(head) - 1):]) if len(text) > limit else text


def followups(task: TaskBase, result: Any) -> list[NewTask]:
    """A handler's return value as follow-up tasks: None, a NewTask, a (queue, payload)
    tuple, or a list of those. Queues are in the task's group (atomic with its dequeue)."""
    if result is None:
        return []
    items = [result] if isinstance(result, NewTask | tuple) else list(result)
    out = []
    for r in items:
        if isinstance(r, tuple):
            r = NewTask(r[1] if len(r) > 1 else None, queue=r[0])
        if not isinstance(r, NewTask) or not r.queue:
            raise TypeError("a handler returns None, NewTask(queue=...), (queue, payload) or a "
                            f"list of those, not {r!r}")
        if "#" in r.queue and split_queue(r.queue)[0] != task.group:
            raise ValueError(f"follow-up queue {r.queue} is not in group {task.group!r}: only "
                             "queues of the task's group can be updated atomically with it")
        out.append(r)
    return out


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

    t = c.transport
    if t is not None and not hasattr(t, "handle_async_request"):
        t = ThreadTransport(t)
    return AsyncClient(c.master, transport=t, **c.options)  # type: ignore[arg-type]


async def queues_empty(client: AsyncClient, names: Callable[[], Awaitable[list[str]]],
                       pattern: bool) -> bool:
    """Burst mode's end: none of the queues holds a task (available, leased or delayed);
    with a pattern, none matches any more."""
    try:
        found = await names()
        if pattern:
            return not found
        for q in found:
            try:
                if (await client.stats(q)).total:
                    return False
            except NotFound:
                continue
    except SquallError as e:
        log.warning("checking for remaining tasks failed: %s", e)
        return False
    return True
