"""``AsyncClient``: the asyncio client, a thin driver of the protocol core over
``httpx.AsyncClient``; the twin of ``_sync.py`` (the same one-line verbs; a test checks
that the two public surfaces match). Sync payload iterables are sent as async streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

import httpx

from squall.client import _http
from squall.client._ahead import AsyncBatches, ReadAhead
from squall.client._direct import Shortcut
from squall.client._effects import Call, Close, Emit, Gather, Join, Read, Reply, Retry, Sleep, Spawn
from squall.client._protocol import (
    IN_FLIGHT,
    LEASE_VIA_NODE,
    Core,
    default_master,
    first_failure,
    held_wire,
)
from squall.client._tasks import NewTask, Payload, TaskBase, Tasks, TxBuilder, as_list
from squall.common.errors import SquallError
from squall.common.masters import Masters
from squall.common.security.tls import TLSConfig
from squall.common.transport.adapters import AsyncTransport
from squall.common.transport.http1 import Broken
from squall.common.wire.models import (
    BatchInfo,
    BatchResponse,
    CancelResponse,
    ClusterInfo,
    ClusterStats,
    DeleteResponse,
    EnqueueResult,
    ForgetResponse,
    NodeStatus,
    PauseState,
    Policy,
    QueueCounts,
    QueueStats,
    RedriveResponse,
    ResetResponse,
    Schedule,
    ScheduleInfo,
    TaskInfo,
    UpdateResponse,
)
from squall.common.wire.models import LeasedTask as WireTask

T = TypeVar("T")


async def _aiter(parts: Iterable[bytes]) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


class _AsyncDriver:
    """Runs protocol generators over an ``httpx.AsyncClient``."""

    def __init__(self, http: httpx.AsyncClient, lean: AsyncTransport | None = None,
                 token: str | None = None, masters: Masters | None = None) -> None:
        self.http = http
        masters = masters or Masters(str(http.base_url))
        self.masters = masters  # where a master's path goes (the leader of a master set)
        self.lean = lean  # the engine's transport (the default): calls may go direct
        self.shortcut = Shortcut(http, token, lean is not None, masters)

    async def run(self, gen: Generator[Any, Any, T]) -> T:
        out: list[T] = []
        async for _ in self.iterate(gen, out):
            pass
        return out[0]

    async def iterate(self, gen: Generator[Any, Any, Any], out: list[Any] | None = None
                      ) -> AsyncIterator[Any]:
        streams: list[httpx.Response] = []
        try:
            eff = next(gen)
            while True:
                if type(eff) is Emit:
                    yield eff.value
                    eff = gen.send(None)
                    continue
                try:
                    val = await self._do(eff, streams)
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
                await r.aclose()

    async def _do(self, eff: Any, streams: list[httpx.Response]) -> Any:
        t = type(eff)
        if t is Call:
            return await self._call(eff, streams)
        if t is Sleep:
            await asyncio.sleep(eff.secs)
            return None
        if t is Read:
            _resp, parts, c = eff.reply.stream
            try:
                return await anext(parts, b"")
            except httpx.HTTPError as e:
                raise _http.transport_error(e, c, self.masters.current) from e
        if t is Close:
            await eff.reply.stream[0].aclose()
            return None
        if t is Gather:
            return first_failure(await asyncio.gather(*(self.run(g) for g in eff.gens),
                                                      return_exceptions=True))
        if t is Spawn:
            return asyncio.ensure_future(self.run(eff.gen))
        if t is Join:
            return await eff.handle
        raise TypeError(f"unknown effect {eff!r}")  # pragma: no cover

    async def _call(self, c: Call, streams: list[httpx.Response]) -> Any:
        if not c.url.startswith("/"):  # a data node's URL
            return await self._send(c, streams, "")
        hops = 0
        while True:  # a master's path: to the leader (see common/masters.py)
            base = self.masters.current
            try:
                return await self._send(c, streams, base)
            except SquallError as e:
                if not _http.resend_elsewhere(self.masters, base, e, e.__cause__, c, hops):
                    raise
            hops += 1

    async def _send(self, c: Call, streams: list[httpx.Response], base: str) -> Any:
        direct = self.shortcut.prepare(c, base)  # None unless the default transport may take it
        if direct is not None:
            assert self.lean is not None
            try:
                return _http.result(c, await self.lean.exchange(direct), base)
            except Broken as e:
                raise _http.transport_error(e, c, base) from e
        args = _http.request_args(c)
        if base:
            args["url"] = base + c.url
        content = args.get("content")
        if content is not None and not isinstance(content, bytes | bytearray):
            args["content"] = _aiter(content)
        try:
            if not c.stream:
                return _http.result(c, await self.http.request(**args), base)
            r = await self.http.send(self.http.build_request(**args), stream=True)
            streams.append(r)
            if r.status_code >= 400:
                await r.aread()
                raise _http.status_error(r, c, base)
            return Reply(r.status_code, dict(r.headers), stream=(r, r.aiter_bytes(), c))
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise _http.transport_error(e, c, base) from e


class AsyncLeasedTask(TaskBase):
    """A leased task of an AsyncClient (fields in ``TaskBase``); its verbs are awaitable."""

    __slots__ = ()

    async def payload(self) -> bytes:
        """The payload's bytes (b"" without one), checksum-verified, from a live replica."""
        held = self._held_payload()  # loaded already, or none: no trip through the client
        return held if held is not None else bytes(await self._client.payload(self))

    def iter_payload(self, chunk_bytes: int = 1 << 20) -> AsyncIterator[bytes]:
        """The payload in chunks, for payloads too large to hold (verified at the end)."""
        return self._client.iter_payload(self, chunk_bytes)  # type: ignore[no-any-return]

    async def renew(self, lease_secs: float = 60.0) -> UpdateResponse:
        return await self._client.renew(self, lease_secs)  # type: ignore[no-any-return]

    async def release(self, *, delay: float | None = None, error: str | None = None
                      ) -> UpdateResponse:
        return await self._client.release(  # type: ignore[no-any-return]
            self, delay=delay, error=error)

    async def done(self) -> UpdateResponse:
        return await self._client.done(self)  # type: ignore[no-any-return]


class AsyncTransaction(TxBuilder):
    """``async with client.transaction() as tx: ...`` commits one atomic update when the
    block ends without an exception."""

    def __init__(self, client: AsyncClient, group: str | None) -> None:
        super().__init__(group)
        self._client = client
        self.result: UpdateResponse | None = None

    async def commit(self) -> UpdateResponse:
        self.result = await self._client.commit(self)
        return self.result

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        if et is None and self.result is None:
            await self.commit()


class AsyncClient:
    """An asyncio squall client. ``master`` defaults to ``$SQUALL_MASTER``, else
    ``http://127.0.0.1:7070``; ``token`` (the bearer credential
    for the master) defaults to ``$SQUALL_TOKEN``; ``tls`` (a :class:`TLSConfig`: the CA to
    verify servers with, a certificate and key for mutual TLS) defaults to ``$SQUALL_TLS_CA``,
    ``$SQUALL_TLS_CERT`` and ``$SQUALL_TLS_KEY``."""

    def __init__(self, master: str | Sequence[str] | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None, timeout: float = 30.0,
                 blob_timeout: float = 300.0, retries: int = 30, worker: str | None = None,
                 max_connections: int = 100, retry_budget_s: float = 30.0,
                 front_door: bool = True,
                 token: str | None = None, tls: TLSConfig | None = None,
                 lease_via_node: bool | None = None) -> None:
        self.masters = Masters(master, default_master())
        self.master = ",".join(self.masters.configured)
        self.transport = transport
        self.options = {"timeout": timeout, "blob_timeout": blob_timeout, "retries": retries,
                        "worker": worker, "max_connections": max_connections,
                        "retry_budget_s": retry_budget_s, "front_door": front_door,
                        "token": token, "tls": tls, "lease_via_node": lease_via_node}
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        auth = _http.MasterAuth(self.masters, token)
        self.token = auth.token
        self._core = Core(Retry(attempts=retries, budget_s=retry_budget_s), blob_timeout,
                          worker, timeout, front_door, auth.token,
                          LEASE_VIA_NODE if lease_via_node is None else lease_via_node)
        lean = None if transport else _http.async_transport(limits, tls)
        self._http = httpx.AsyncClient(base_url=self.masters.current, transport=transport or lean,
                                       timeout=timeout, limits=limits, auth=auth,
                                       verify=_http.tls_verify(tls))
        driver = _AsyncDriver(self._http, lean, auth.token, self.masters)
        self._run = driver.run
        self._iter = driver.iterate

    def _task(self, wire: WireTask, group: str) -> AsyncLeasedTask:
        return AsyncLeasedTask(self, wire, group)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- tasks ---------------------------------------------------------------------------
    async def put(self, queue: str, payload: Payload = None, *, pid: str | None = None,
                  not_before: float | None = None, delay: float | None = None,
                  idempotency_key: str | None = None, key: str | None = None,
                  unique: str | None = None, debounce: float | None = None,
                  debounce_max: float | None = None, batch: str | None = None,
                  traceparent: str | None = None, tracestate: str | None = None
                  ) -> EnqueueResult:
        """Enqueue one task (its payload goes to data nodes first). `idempotency_key`: apply
        it at most once per group and key within the master's window (5 min by default),
        even if the task was dequeued since. `key`: its flow-control key (a tenant, a
        domain), which the queue's policy may limit, rate or lease fairly. With the key:
        `unique` ("queued" or "active": collapse into the key's queued, or queued or
        leased, task), `debounce` (seconds: replace the key's queued debounced task's
        payload and push it back, up to `debounce_max` after the first). `batch`: join
        that open batch (its id in the queue's group). `traceparent`/`tracestate`: W3C
        trace context (default: the current OpenTelemetry context, if installed)."""
        return await self._run(self._core.put(queue, payload, pid, not_before, delay,
                                              idempotency_key, key, unique=unique,
                                              debounce=debounce, debounce_max=debounce_max,
                                              batch=batch,
                                              traceparent=traceparent, tracestate=tracestate))

    async def put_many(self, queue: str, items: Iterable[Payload | NewTask], *,
                       batch_size: int = 100,
                       progress: Callable[[list[EnqueueResult]], Any] | None = None,
                       in_flight: int = IN_FLIGHT) -> int:
        """Enqueue many tasks, batch by batch; returns how many were new. `in_flight`
        batches are sent at once, fewer when they hold 64 MiB of payload bytes (pid-less
        tasks still get pids in the order of `items`; after a failure, later batches are
        not sent, but others of the same round may have been enqueued: sending everything
        again collapses them, by pid)."""
        return await self._run(self._core.put_many(queue, items, batch_size, progress,
                                                   in_flight))

    async def lease(self, queue: str, max_tasks: int = 1, lease_secs: float | None = None,
                    *, max_pid: str | None = None, payloads: bool = False,
                    wait_secs: float | None = None, done: Tasks | None = ()
                    ) -> list[AsyncLeasedTask]:
        """Lease up to `max_tasks` tasks. `payloads=True`: small payloads come loaded (one
        batch read per data node; ``payload()`` then needs no request), large ones are read
        when asked. `wait_secs`: wait up to this long for a task (the master answers as
        soon as one is available; capped by the master, 20 s by default). `done`: tasks to
        dequeue in the same atomic update (ack a batch and lease the next in one round
        trip; all or nothing), then no waiting."""
        return await self._run(self._core.lease(queue, max_tasks, lease_secs, max_pid,
                                         self._task, payloads, wait_secs, as_list(done)))

    def batches(self, queue: str, size: int = 100, lease_secs: float | None = None, *,
                payloads: bool = True, wait_secs: float | None = None, ahead: int = 2
                ) -> AsyncBatches[AsyncLeasedTask]:
        """Consume `queue` batch by batch in an ``async with`` block (see Client.batches)."""
        return AsyncBatches(self._run, ReadAhead(self._core, queue, size, lease_secs,
                                                 payloads, wait_secs, self._task, ahead))

    async def read_payloads(self, tasks: Sequence[TaskBase]) -> list[bytes]:
        """The payloads of `tasks` in order (b"" for none), small ones with one batch read
        per data node; each is kept on its task (``payload()`` then needs no request)."""
        return await self._run(self._core.read_payloads(list(tasks)))

    async def renew(self, tasks: Tasks, lease_secs: float = 60.0) -> UpdateResponse:
        return await self._run(self._core.renew(as_list(tasks), lease_secs))

    async def release(self, tasks: Tasks, *, delay: float | None = None,
                      error: str | None = None) -> UpdateResponse:
        return await self._run(self._core.release(as_list(tasks), delay, error))

    async def done(self, tasks: Tasks) -> UpdateResponse:
        return await self._run(self._core.done(as_list(tasks)))

    async def payload(self, task: TaskBase) -> bytes:
        return await self._run(self._core.payload(task))

    def iter_payload(self, task: TaskBase, chunk_bytes: int = 1 << 20) -> AsyncIterator[bytes]:
        return self._iter(self._core.iter_payload(task, chunk_bytes))

    def transaction(self, group: str | None = None) -> AsyncTransaction:
        return AsyncTransaction(self, group)

    async def commit(self, tx: TxBuilder) -> UpdateResponse:
        return await self._run(self._core.commit(tx))

    # -- admin ---------------------------------------------------------------------------
    async def queues(self, regex: str | None = None, *, group: str | None = None,
                     min_tasks: int = 1, limit: int = 1000) -> list[QueueCounts]:
        return await self._run(self._core.queues(regex, group, min_tasks, limit))

    @overload
    async def stats(self, queue: str) -> QueueStats: ...
    @overload
    async def stats(self, queue: None = None) -> ClusterStats: ...

    async def stats(self, queue: str | None = None) -> QueueStats | ClusterStats:
        """A queue's counters and rates, or the cluster's without `queue`."""
        return await self._run(self._core.stats(queue))

    async def task(self, queue: str, pid: str) -> TaskInfo:
        return await self._run(self._core.task(queue, pid))

    async def tasks(self, queue: str, *, after: str | None = None, limit: int = 100
                    ) -> list[TaskInfo]:
        return await self._run(self._core.tasks(queue, after, limit))

    def iter_tasks(self, queue: str, *, after: str | None = None) -> AsyncIterator[TaskInfo]:
        return self._iter(self._core.iter_tasks(queue, after))

    async def cancel(self, queue: str, pid: str) -> CancelResponse:
        """Remove a queued (available or delayed) task by pid without leasing it."""
        return await self._run(self._core.cancel(queue, pid))

    def held(self, queue: str, pid: str, token: str) -> AsyncLeasedTask:
        """A task leased elsewhere (e.g. by ``squall lease``), known by pid and lease token,
        to ``done()``, ``release()`` or ``renew()`` (its payload reference is not known)."""
        return self._task(*held_wire(queue, pid, token))

    async def delete(self, queue: str) -> DeleteResponse:
        return await self._run(self._core.delete(queue))

    async def reset_leases(self, queue: str) -> ResetResponse:
        return await self._run(self._core.reset_leases(queue))

    async def pause(self, queue: str, key: str | None = None) -> PauseState:
        """Pause the queue, or one `key` in it: leases skip it, enqueues go on (persisted)."""
        return await self._run(self._core.pause(queue, key, True))

    async def resume(self, queue: str, key: str | None = None) -> PauseState:
        return await self._run(self._core.pause(queue, key, False))

    async def pause_state(self, queue: str) -> PauseState:
        return await self._run(self._core.pause_state(queue))

    async def batch(self, tasks: Sequence[NewTask], callback: NewTask, *,
              error_callback: NewTask | None = None, on_dead: str = "fail",
              batch_id: str | None = None) -> BatchResponse:
        """Enqueue a batch of `tasks` (``NewTask(payload, queue=...)``, at most 1,000, in one
        group) and a `callback` enqueued once every member is done (in the same WAL record
        as the last member's dequeue). `on_dead`: a dead-lettered member fails the batch
        (``"fail"``: `error_callback` runs instead) or is counted and ignored
        (``"ignore"``). The answer's ``batch`` is ``group#id``."""
        return await self._run(self._core.batch(list(tasks), callback, error_callback, on_dead,
                                         batch_id))

    async def batch_info(self, batch: str) -> BatchInfo:
        """Progress of batch ``group#id`` (NotFound once its callback is done)."""
        return await self._run(self._core.batch_info(batch))

    async def batch_results(self, batch: str) -> dict[tuple[str, str], Any]:
        """The results its members set (``task.set_result``), by (queue, pid): what a
        callback reads (``task.batch_id`` names its batch)."""
        return await self._run(self._core.batch_results(batch))

    async def list_batches(self, group: str = "default") -> list[BatchInfo]:
        return await self._run(self._core.list_batches(group))

    async def delete_batch(self, batch: str) -> None:
        await self._run(self._core.delete_batch(batch))

    async def redrive(self, queue: str, max_tasks: int = 1000) -> RedriveResponse:
        return await self._run(self._core.redrive(queue, max_tasks))

    async def dead_letter_queue(self, queue: str) -> str:
        """``group#name`` of the queue's dead-letter queue (policy, else ``name.dead``)."""
        return await self._run(self._core.dead_letter_queue(queue))

    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[TaskInfo]:
        return await self._run(self._core.dead_letters(queue, limit))

    async def policy(self, target: str) -> Policy:
        return await self._run(self._core.policy(target))

    async def set_policy(self, target: str, policy: Policy | None = None, **fields: Any
                         ) -> Policy:
        return await self._run(self._core.set_policy(target, policy or Policy(**fields)))

    async def delete_policy(self, target: str) -> Policy:
        return await self._run(self._core.set_policy(target, None))

    async def schedules(self, group: str) -> list[ScheduleInfo]:
        return await self._run(self._core.schedules(group))

    async def set_schedule(self, name: str, schedule: Schedule | None = None, **fields: Any
                           ) -> ScheduleInfo:
        return await self._run(self._core.set_schedule(name, schedule or Schedule(**fields)))

    async def delete_schedule(self, name: str) -> None:
        await self._run(self._core.delete_schedule(name))

    async def cluster(self) -> ClusterInfo:
        return await self._run(self._core.cluster())

    async def node(self, node_id: str) -> NodeStatus:
        """One data node: health, usage and decommission progress."""
        return await self._run(self._core.node(node_id))

    async def decommission(self, node_id: str, *, cancel: bool = False) -> NodeStatus:
        """Start decommissioning a data node (or cancel it); poll :meth:`node` for progress."""
        return await self._run(self._core.decommission(node_id, cancel))

    async def forget(self, node_id: str) -> ForgetResponse:
        """Remove a dead or decommissioned node from the master's table."""
        return await self._run(self._core.forget(node_id))

    async def overview(self) -> dict[str, Any]:
        """What ``squall status`` shows: see :meth:`squall.client.Client.overview`."""
        return await self._run(self._core.overview())

    async def ready(self) -> dict[str, Any]:
        return await self._run(self._core.ready())

    async def mint_credential(self, *roles: str, groups: Iterable[str] | None = None,
                        node: str | None = None, ttl_secs: float = 30 * 86400.0,
                        note: str = "", sqs: bool = False,
                        sqs_key: tuple[str, str] | None = None) -> dict[str, Any]:
        """Mint a credential (needs an admin one): roles, optional groups, node id (for role
        node). The answer's ``credential`` is shown once; the master keeps only its claims.
        `sqs`: an SQS access key instead (``access_key_id``, ``secret_access_key``; see
        docs/sqs.md); `sqs_key`: import this (access key id, secret) as one."""
        return await self._run(self._core.mint_credential(roles, groups, node, ttl_secs, note,
                                                        sqs, sqs_key))

    async def credentials(self) -> list[dict[str, Any]]:
        """Credentials minted through the master (their claims), revoked or not."""
        return await self._run(self._core.credentials())

    async def revoke_credential(self, cred_id: str) -> dict[str, Any]:
        """Revoke a credential by its id: refused everywhere from now on."""
        return await self._run(self._core.revoke_credential(cred_id))

