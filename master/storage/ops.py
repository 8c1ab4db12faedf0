"""WAL ops, and the one function that applies them: :func:`apply`.

A WAL record's body is a msgpack list of ops. Ops are *outcomes*, not requests: a lease is
logged as the new records of the tasks it took, so replay never re-decides anything. The
same :func:`apply` runs live (inside the request's LMDB transaction) and on replay.

    ("Q", group, name, qid, created_ms)    create a queue
    ("P", qid, gen, task_wire, enqueue)    put a task record (insert or replace)
    ("D", qid, gen, pid, completed)        delete a task (completed: it was dequeued)
    ("M", lease_seq, auto_pid)             raise the token / auto-pid high-water marks
    ("G", qid, new_gen, now_ms)            delete a queue: new generation, old one reaped
    ("R", qid, gen)                        reset leases: every lease of the queue revoked
    ("C", kind, group, name, value|None)   set or clear a policy (kind "P"), a schedule
                                           (kind "S"; holds its last enqueued slot) or a
                                           data node's decommission mark (kind "N",
                                           group "", name = node id) or a master
                                           set's members (kind "H", name "members")
                                           or an SQS access key's claims (kind "A",
                                           group "", name = credential id) or a
                                           credential's revocation (kind "V", group
                                           "", name = credential id, {expires_at})
    ("K", group, key, queue, pid, exp_ms)  an enqueue's idempotency key (see dedup.py;
                                           a plain put: replays idempotently)
    ("B", group, id, record|None)          a batch's record (see batches.py)
    ("BR", group, id, queue, pid, result)  a batch member's result (batches.py)
    ("U", qid, gen, key, pid)              a unique/debounce key's holder (unique.py)

An op naming a generation that is no longer current does nothing, so a record that raced
with a queue deletion replays the same way it applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import lmdb
import msgpack

from squall.master.storage.index import Index
from squall.master.storage.records import AVAILABLE, LEASED, QueueRec, Task, qprefix
from squall.master.tasks import batches, dedup, unique

Op = tuple[Any, ...]


RESET_ERROR = "lease reset"


def reset_leases(index: Index, txn: lmdb.Transaction, q: QueueRec) -> int:
    """Revoke every lease of `q`: leased tasks become available, no token stays valid.
    Every revoked task ends the same way (available now, error "lease reset"), whether or
    not a sweep has run since its lease expired: replay runs no sweeps, and must end where
    the live run did."""
    prefix = qprefix(q.qid, q.gen)
    revoked: list[Task] = []
    cur = txn.cursor(db=index.tasks)
    if cur.set_range(prefix):
        for k, v in cast(Iterator[tuple[bytes, bytes]], cur):
            if not k.startswith(prefix):
                break
            t = Task.unpack(v)
            if t.live or t.state == LEASED:
                revoked.append(t)
    for t in revoked:
        t.state, t.expiry_ms, t.not_before_ms = AVAILABLE, 0, 0
        t.live, t.error = False, RESET_ERROR
        index.put_task(txn, q, t, enqueue=False)
    return len(revoked)


def apply(index: Index, txn: lmdb.Transaction, ops: Sequence[Op], ticket: int) -> bytes:
    """Apply `ops` in `txn`, record `ticket` as applied, and return the WAL record's body:
    exactly ``msgpack.packb(list(ops))``, built from the pieces applying packed anyway (a
    task record is packed once, for LMDB and for the WAL)."""
    touched: dict[int, QueueRec] = {}
    parts = [_array_header(len(ops))]
    _apply(index, txn, ops, touched, parts)
    _finish(index, txn, touched, ticket)
    return b"".join(parts)


def replay(index: Index, txn: lmdb.Transaction, records: Sequence[tuple[int, Sequence[Op]]]
           ) -> None:
    """Apply many records in one txn, saving queue records and meta once at the end."""
    touched: dict[int, QueueRec] = {}
    for _, ops in records:
        _apply(index, txn, ops, touched)
    if records:
        _finish(index, txn, touched, records[-1][0])


def _finish(index: Index, txn: lmdb.Transaction, touched: dict[int, QueueRec],
            ticket: int) -> None:
    for q in touched.values():
        index.save_queue(txn, q)
    index.applied = max(index.applied, ticket)
    index.save_meta(txn)


def _apply(index: Index, txn: lmdb.Transaction, ops: Sequence[Op],
           touched: dict[int, QueueRec], parts: list[bytes] | None = None) -> None:
    """Apply `ops`; with `parts`, append each op's msgpack encoding to it."""
    heads: dict[tuple[int, int], bytes] = {}  # packed ("P", qid, gen, ...) op heads
    for op in ops:
        raw = _apply_op(index, txn, op, touched)
        if parts is not None:
            parts.append(_packb(op) if raw is None else _p_op(heads, op, raw))


def _apply_op(index: Index, txn: lmdb.Transaction, op: Op, touched: dict[int, QueueRec]
              ) -> bytes | None:
    """Apply one op; for a "P" op that put its task, the task's packed record."""
    kind = op[0]
    if kind == "P" or kind == "D" or kind == "R":
        q = index.by_qid[op[1]]
        if q.gen != op[2]:
            return None
        touched[q.qid] = q
        if kind == "P":
            return index.put_wire(txn, q, op[3], enqueue=op[4])
        if kind == "D":
            index.delete_task(txn, q, op[3].encode(), completed=op[4])
        else:
            reset_leases(index, txn, q)
    elif kind == "Q":
        q = index.create_queue(txn, op[1], op[2], op[3], op[4])
        touched[q.qid] = q
    elif kind == "M":
        index.lease_seq = max(index.lease_seq, op[1])
        index.auto_pid = max(index.auto_pid, op[2])
    elif kind == "G":
        q = index.by_qid[op[1]]
        if op[2] > q.gen:
            txn.put(qprefix(q.qid, q.gen), b"", db=index.reap_db)
            index.clear_queue(q, op[2], op[3])
            touched[q.qid] = q
    elif kind == "C":
        index.set_conf(txn, op[1].encode(), op[2], op[3], op[4])
    elif kind in _PLAIN_OPS:
        _PLAIN_OPS[kind](index, txn, op)
    else:
        raise ValueError(f"unknown op {kind!r}")
    return None


# ops whose module applies them (plain puts and deletes of its own databases)
_PLAIN_OPS: dict[str, Callable[[Index, lmdb.Transaction, Op], None]] = {
    "K": dedup.apply_op, "B": batches.apply_op, "BR": batches.apply_op, "U": unique.apply_op}
_packb = msgpack.packb


def _array_header(n: int) -> bytes:
    """msgpack's header of an array of `n` items."""
    if n < 16:
        return bytes((0x90 | n,))
    return b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


_BOOLS = {True: b"\xc3", False: b"\xc2"}


def _p_op(heads: dict[tuple[int, int], bytes], op: Op, raw: bytes) -> bytes:
    """msgpack of a ("P", qid, gen, task_wire, enqueue) op whose task packed to `raw`."""
    enqueue = op[4]
    if len(op) != 5 or type(enqueue) is not bool:
        return _packb(op)  # not the shape the engine makes: encode it plainly
    head = heads.get((op[1], op[2]))
    if head is None:
        head = heads[(op[1], op[2])] = b"\x95\xa1P" + _packb(op[1]) + _packb(op[2])
    return head + raw + _BOOLS[enqueue]
