"""Many payloads at once, through the client: one ``POST {node}/v1/blobs:batch-get`` per
data node for a batch of tasks' small payloads, instead of one ``GET`` per task.

The tasks are split into groups that the client's own batch read
(``Client.read_payloads``) serves with one request each: the small payloads (up to
``BATCH_BLOB_BYTES``) by their first replica (and read token), each large payload alone.
The groups are read in parallel on the caller's pool. The client checks every payload
against the size and CRC32C the master recorded, reads what a batch did not deliver whole
from the other replicas (asking the master where the copies are now if none has it), and
uses the same TLS settings, credential, retries and node penalties as every other request
of the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

from squall.client import Client, Forbidden, LeasedTask, SquallError, Unauthorized
from squall.client._blobs import BATCH_BLOB_BYTES, BATCH_BODY_BYTES, BATCH_GET_IDS
from squall.common.wire.models import PayloadRef
from squall.common.wire.payload import batch_groups


def _groups(refs: Sequence[PayloadRef | None]) -> list[tuple[str, list[int]]]:
    """(node, indexes) of the small payloads, each group within the batch-get limits."""
    return batch_groups(((i, r.replicas[0], r.token, r.size) for i, r in enumerate(refs)
                         if r is not None and r.size <= BATCH_BLOB_BYTES and r.replicas
                         and r.token), BATCH_GET_IDS, BATCH_BODY_BYTES)


def _read(client: Client, tasks: list[LeasedTask]) -> list[bytes | SquallError]:
    """The payloads of `tasks`; where no replica delivers one, its error (the others are
    still read: a payload the batch read loaded is kept on its task)."""
    try:
        return list(client.read_payloads(tasks))
    except (Unauthorized, Forbidden):
        raise  # the credential or the read token is wrong for every payload alike
    except SquallError:
        pass
    out: list[bytes | SquallError] = []
    for t in tasks:
        try:
            out.append(t.payload())
        except SquallError as e:
            out.append(e)
    return out


def fetch_many(client: Client, tasks: Sequence[LeasedTask], pool: Executor | None = None
               ) -> list[bytes | SquallError | None]:
    """The payload of every task, in order: None where a task has none, the error where no
    replica could deliver it (the caller decides: fail the task, or the whole read)."""
    refs = [t.payload_ref for t in tasks]
    chunks = [idx for _, idx in _groups(refs)]
    grouped = {i for idx in chunks for i in idx}
    chunks += [[i] for i, r in enumerate(refs) if r is not None and i not in grouped]

    def read(idx: list[int]) -> list[bytes | SquallError]:
        return _read(client, [tasks[i] for i in idx])

    if pool is not None and len(chunks) > 1:
        parts = list(pool.map(read, chunks))
    else:
        parts = [read(idx) for idx in chunks]
    out: list[bytes | SquallError | None] = [None] * len(tasks)
    for idx, datas in zip(chunks, parts, strict=True):
        for i, d in zip(idx, datas, strict=True):
            out[i] = d
    return out
