"""``Client``: the blocking client, a thin driver of the protocol core over ``httpx.Client``.

Every verb is one line: build the verb's generator (``_protocol.Core``) and run it. The
driver (``_syncdriver.py``) only performs effects (HTTP, sleep, stream reads);
``AsyncClient`` has the same driver written with ``await`` and the same one-line verbs (a
test checks that the two public surfaces match).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

import httpx

from squall.client import _http
from squall.client._ahead import Batches, ReadAhead
from squall.client._effects import Retry
from squall.client._protocol import (
    IN_FLIGHT,
    LEASE_VIA_NODE,
    Core,
    default_master,
    held_wire,
)
from squall.client._syncdriver import Driver
from squall.client._tasks import NewTask, Payload, TaskBase, Tasks, TxBuilder, as_list
from squall.common.masters import Masters
from squall.common.security.tls import TLSConfig
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


class LeasedTask(TaskBase):
    """A leased task (see ``TaskBase`` for its fields: queue, pid, token, attempts...)."""

    __slots__ = ()

    def payload(self) -> bytes:
        """The payload's bytes (b"" without one), checksum-verified, from a live replica."""
        held = self._held_payload()  # loaded already, or none: no trip through the client
        return held if held is not None else bytes(self._client.payload(self))

    def iter_payload(self, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The payload in chunks, for payloads too large to hold (verified at the end)."""
        return iter(self._client.iter_payload(self, chunk_bytes))

    def renew(self, lease_secs: float = 60.0) -> UpdateResponse:
        return self._client.renew(self, lease_secs)  # type: ignore[no-any-return]

    def release(self, *, delay: float | None = None, error: str | None = None
                ) -> UpdateResponse:
        return self._client.release(self, delay=delay, error=error)  # type: ignore[no-any-return]

    def done(self) -> UpdateResponse:
        return self._client.done(self)  # type: ignore[no-any-return]


class Transaction(TxBuilder):
    """``with client.transaction() as tx: tx.dequeue(task); tx.put("g#next", data)`` commits
    one atomic update when the block ends without an exception."""

    def __init__(self, client: Client, group: str | None) -> None:
        super().__init__(group)
        self._client = client
        self.result: UpdateResponse | None = None

    def commit(self) -> UpdateResponse:
        self.result = self._client.commit(self)
        return self.result

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if et is None and self.result is None:
            self.commit()


class Client:
    """A blocking squall client. ``master`` defaults to ``$SQUALL_MASTER``, else
    ``http://127.0.0.1:7070``; ``token`` (the bearer credential
    for the master) defaults to ``$SQUALL_TOKEN``; ``tls`` (a :class:`TLSConfig`: the CA to
    verify servers with, a certificate and key for mutual TLS) defaults to ``$SQUALL_TLS_CA``,
    ``$SQUALL_TLS_CERT`` and ``$SQUALL_TLS_KEY``. Thread-safe (one connection pool)."""

    def __init__(self, master: str | Sequence[str] | None = None, *,
                 transport: httpx.BaseTransport | None = None,
                 timeout: float = 30.0, blob_timeout: float = 300.0, retries: int = 30,
                 worker: str | None = None, max_connections: int = 100,
                 retry_budget_s: float = 30.0, front_door: bool = True,
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
        lean = None if transport else _http.sync_transport(limits, tls)
        self._http = httpx.Client(base_url=self.masters.current, timeout=timeout, limits=limits,
                                  transport=transport or lean, auth=auth,
                                  verify=_http.tls_verify(tls))
        self._driver = Driver(self._http, lean, auth.token, self.masters)
        self._run = self._driver.run
        self._iter = self._driver.iterate

    def _task(self, wire: WireTask, group: str) -> LeasedTask:
        return LeasedTask(self, wire, group)

    def close(self) -> None:
        self._driver.close()
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tasks ---------------------------------------------------------------------------
    def put(self, queue: str, payload: Payload = None, *, pid: str | None = None,
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
        return self._run(self._core.put(queue, payload, pid, not_before, delay,
                                         idempotency_key, key, unique=unique, debounce=debounce,
                                         debounce_max=debounce_max, batch=batch,
                                         traceparent=traceparent, tracestate=tracestate))

    def put_many(self, queue: str, items: Iterable[Payload | NewTask], *, batch_size: int = 100,
                 progress: Callable[[list[EnqueueResult]], Any] | None = None,
                 in_flight: int = IN_FLIGHT) -> int:
        """Enqueue many tasks, batch by batch; returns how many were new. `in_flight`
        batches are sent at once, fewer when they hold 64 MiB of payload bytes (pid-less
        tasks still get pids in the order of `items`; after a failure, later batches are
        not sent, but others of the same round may have been enqueued: sending everything
        again collapses them, by pid)."""
        return self._run(self._core.put_many(queue, items, batch_size, progress, in_flight))

    def lease(self, queue: str, max_tasks: int = 1, lease_secs: float | None = None,
              *, max_pid: str | None = None, payloads: bool = False,
              wait_secs: float | None = None, done: Tasks | None = ()) -> list[LeasedTask]:
        """Lease up to `max_tasks` tasks. `payloads=True`: small payloads come loaded (one
        batch read per data node; ``payload()`` then needs no request), large ones are read
        when asked. `wait_secs`: wait up to this long for a task (the master answers as
        soon as one is available; capped by the master, 20 s by default). `done`: tasks to
        dequeue in the same atomic update (ack a batch and lease the next in one round
        trip; all or nothing), then no waiting."""
        return self._run(self._core.lease(queue, max_tasks, lease_secs, max_pid,
                                         self._task, payloads, wait_secs, as_list(done)))

    def batches(self, queue: str, size: int = 100, lease_secs: float | None = None, *,
                payloads: bool = True, wait_secs: float | None = None, ahead: int = 2
                ) -> Batches[LeasedTask]:
        """Consume `queue` batch by batch in a ``with`` block: `ahead` batches are leased
        (their payloads read) while you work on one; each is acknowledged when you take
        the next (docs/client.md, "Consuming in batches")."""
        return Batches(self._run, ReadAhead(self._core, queue, size, lease_secs, payloads,
                                            wait_secs, self._task, ahead))

    def read_payloads(self, tasks: Sequence[TaskBase]) -> list[bytes]:
        """The payloads of `tasks` in order (b"" for none), small ones with one batch read
        per data node; each is kept on its task (``payload()`` then needs no request)."""
        return self._run(self._core.read_payloads(list(tasks)))

    def renew(self, tasks: Tasks, lease_secs: float = 60.0) -> UpdateResponse:
        return self._run(self._core.renew(as_list(tasks), lease_secs))

    def release(self, tasks: Tasks, *, delay: float | None = None, error: str | None = None
                ) -> UpdateResponse:
        return self._run(self._core.release(as_list(tasks), delay, error))

    def done(self, tasks: Tasks) -> UpdateResponse:
        return self._run(self._core.done(as_list(tasks)))

    def payload(self, task: TaskBase) -> bytes:
        return self._run(self._core.payload(task))

    def iter_payload(self, task: TaskBase, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        return self._iter(self._core.iter_payload(task, chunk_bytes))

    def transaction(self, group: str | None = None) -> Transaction:
        return Transaction(self, group)

    def commit(self, tx: TxBuilder) -> UpdateResponse:
        return self._run(self._core.commit(tx))

    # -- admin ---------------------------------------------------------------------------
    def queues(self, regex: str | None = None, *, group: str | None = None, min_tasks: int = 1,
               limit: int = 1000) -> list[QueueCounts]:
        return self._run(self._core.queues(regex, group, min_tasks, limit))

    @overload
    def stats(self, queue: str) -> QueueStats: ...
    @overload
    def stats(self, queue: None = None) -> ClusterStats: ...

    def stats(self, queue: str | None = None) -> QueueStats | ClusterStats:
        """A queue's counters and rates, or the cluster's without `queue`."""
        return self._run(self._core.stats(queue))

    def task(self, queue: str, pid: str) -> TaskInfo:
        return self._run(self._core.task(queue, pid))

    def tasks(self, queue: str, *, after: str | None = None, limit: int = 100
              ) -> list[TaskInfo]:
        return self._run(self._core.tasks(queue, after, limit))

    def iter_tasks(self, queue: str, *, after: str | None = None) -> Iterator[TaskInfo]:
        return self._iter(self._core.iter_tasks(queue, after))

    def cancel(self, queue: str, pid: str) -> CancelResponse:
        """Remove a queued (available or delayed) task by pid without leasing it."""
        return self._run(self._core.cancel(queue, pid))

    def held(self, queue: str, pid: str, token: str) -> LeasedTask:
        """A task leased elsewhere (e.g. by ``squall lease``), known by pid and lease token,
        to ``done()``, ``release()`` or ``renew()`` (its payload reference is not known)."""
        return self._task(*held_wire(queue, pid, token))

    def delete(self, queue: str) -> DeleteResponse:
        return self._run(self._core.delete(queue))

    def reset_leases(self, queue: str) -> ResetResponse:
        return self._run(self._core.reset_leases(queue))

    def pause(self, queue: str, key: str | None = None) -> PauseState:
        """Pause the queue, or one `key` in it: leases skip it, enqueues go on (persisted)."""
        return self._run(self._core.pause(queue, key, True))

    def resume(self, queue: str, key: str | None = None) -> PauseState:
        return self._run(self._core.pause(queue, key, False))

    def pause_state(self, queue: str) -> PauseState:
        return self._run(self._core.pause_state(queue))

    def batch(self, tasks: Sequence[NewTask], callback: NewTask, *,
              error_callback: NewTask | None = None, on_dead: str = "fail",
              batch_id: str | None = None) -> BatchResponse:
        """Enqueue a batch of `tasks` (``NewTask(payload, queue=...)``, at most 1,000, in one
        group) and a `callback` enqueued once every member is done (in the same WAL record
        as the last member's dequeue). `on_dead`: a dead-lettered member fails the batch
        (``"fail"``: `error_callback` runs instead) or is counted and ignored
        (``"ignore"``). The answer's ``batch`` is ``group#id``."""
        return self._run(self._core.batch(list(tasks), callback, error_callback, on_dead,
                                         batch_id))

    def batch_info(self, batch: str) -> BatchInfo:
        """Progress of batch ``group#id`` (NotFound once its callback is done)."""
        return self._run(self._core.batch_info(batch))

    def batch_results(self, batch: str) -> dict[tuple[str, str], Any]:
        """The results its members set (``task.set_result``), by (queue, pid): what a
        callback reads (``task.batch_id`` names its batch)."""
        return self._run(self._core.batch_results(batch))

    def list_batches(self, group: str = "default") -> list[BatchInfo]:
        return self._run(self._core.list_batches(group))

    def delete_batch(self, batch: str) -> None:
        self._run(self._core.delete_batch(batch))

    def redrive(self, queue: str, max_tasks: int = 1000) -> RedriveResponse:
        return self._run(self._core.redrive(queue, max_tasks))

    def dead_letter_queue(self, queue: str) -> str:
        """``group#name`` of the queue's dead-letter queue (policy, else ``name.dead``)."""
        return self._run(self._core.dead_letter_queue(queue))

    def dead_letters(self, queue: str, *, limit: int = 100) -> list[TaskInfo]:
        return self._run(self._core.dead_letters(queue, limit))

    def policy(self, target: str) -> Policy:
        return self._run(self._core.policy(target))

    def set_policy(self, target: str, policy: Policy | None = None, **fields: Any) -> Policy:
        return self._run(self._core.set_policy(target, policy or Policy(**fields)))

    def delete_policy(self, target: str) -> Policy:
        return self._run(self._core.set_policy(target, None))

    def schedules(self, group: str) -> list[ScheduleInfo]:
        return self._run(self._core.schedules(group))

    def set_schedule(self, name: str, schedule: Schedule | None = None, **fields: Any
                     ) -> ScheduleInfo:
        return self._run(self._core.set_schedule(name, schedule or Schedule(**fields)))

    def delete_schedule(self, name: str) -> None:
        self._run(self._core.delete_schedule(name))

    def cluster(self) -> ClusterInfo:
        return self._run(self._core.cluster())

    def node(self, node_id: str) -> NodeStatus:
        """One data node: health, usage and decommission progress."""
        return self._run(self._core.node(node_id))

    def decommission(self, node_id: str, *, cancel: bool = False) -> NodeStatus:
        """Start decommissioning a data node (or cancel it); poll :meth:`node` for progress."""
        return self._run(self._core.decommission(node_id, cancel))

    def forget(self, node_id: str) -> ForgetResponse:
        """Remove a dead or decommissioned node from the master's table."""
        return self._run(self._core.forget(node_id))

    def overview(self) -> dict[str, Any]:
        """What ``squall status`` shows (monitor role): data nodes, WAL state, totals, and
        on a master set ``master_set``: members, leader, epoch, each member's lag, the
        elector (None on a single master)."""
        return self._run(self._core.overview())

    def ready(self) -> dict[str, Any]:
        return self._run(self._core.ready())

    def mint_credential(self, *roles: str, groups: Iterable[str] | None = None,
                        node: str | None = None, ttl_secs: float = 30 * 86400.0,
                        note: str = "", sqs: bool = False,
                        sqs_key: tuple[str, str] | None = None) -> dict[str, Any]:
        """Mint a credential (needs an admin one): roles, optional groups, node id (for role
        node). The answer's ``credential`` is shown once; the master keeps only its claims.
        `sqs`: an SQS access key instead (``access_key_id``, ``secret_access_key``; see
        docs/sqs.md); `sqs_key`: import this (access key id, secret) as one."""
        return self._run(self._core.mint_credential(roles, groups, node, ttl_secs, note,
                                                        sqs, sqs_key))

    def credentials(self) -> list[dict[str, Any]]:
        """Credentials minted through the master (their claims), revoked or not."""
        return self._run(self._core.credentials())

    def revoke_credential(self, cred_id: str) -> dict[str, Any]:
        """Revoke a credential by its id: refused everywhere from now on."""
        return self._run(self._core.revoke_credential(cred_id))
