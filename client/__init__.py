"""squall's Python client: ``Client`` (blocking) and ``AsyncClient`` (asyncio) over httpx,
from one sans-I/O implementation of the protocol, and the ``Worker`` runtime.

    from squall.client import Client, Worker

    with Client("http://127.0.0.1:7070") as c:
        c.put("crawl#fetch", b"https://example.com", pid="0001")
        for task in c.lease("crawl#fetch", max_tasks=10, lease_secs=60):
            data = task.payload()            # from a live replica, CRC32C-checked
            with c.transaction() as tx:      # one atomic update
                tx.dequeue(task)
                tx.put("crawl#parse", data.upper())

Errors are the tree of ``squall.common.errors`` (re-exported here); raw httpx errors never
escape. See ``docs/client.md``.
"""

from squall.client._ahead import AsyncBatches, Batches
from squall.client._async import AsyncClient, AsyncLeasedTask, AsyncTransaction
from squall.client._effects import ConnectError, Retry, may_have_applied
from squall.client._sync import Client, LeasedTask, Transaction
from squall.client._tasks import NewTask, fifo_pid
from squall.client.worker.runtime import Worker
from squall.common.errors import (
    BadRequest,
    Conflict,
    DataCorrupt,
    Forbidden,
    InsufficientStorage,
    LeaseError,
    LeaseLost,
    NotFound,
    OutcomeUnknown,
    Overloaded,
    PayloadTooLarge,
    ServerError,
    SquallError,
    StatusError,
    TransportError,
    Unauthorized,
    Unavailable,
)
from squall.common.security.tls import TLSConfig
from squall.common.wire.models import Backoff, Policy, Schedule

__all__ = [
    "AsyncBatches",
    "AsyncClient",
    "AsyncLeasedTask",
    "AsyncTransaction",
    "Backoff",
    "BadRequest",
    "Batches",
    "Client",
    "Conflict",
    "ConnectError",
    "DataCorrupt",
    "Forbidden",
    "InsufficientStorage",
    "LeaseError",
    "LeaseLost",
    "LeasedTask",
    "NewTask",
    "NotFound",
    "OutcomeUnknown",
    "Overloaded",
    "PayloadTooLarge",
    "Policy",
    "Retry",
    "Schedule",
    "ServerError",
    "SquallError",
    "StatusError",
    "TLSConfig",
    "Transaction",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Worker",
    "fifo_pid",
    "may_have_applied",
]
