"""Batches (fan-in): members, and a callback enqueued when every member is done.

A batch is created by one request (``POST /v1/groups/{g}/batches``): its record and its
members' enqueues are one WAL record. Each member carries the batch id in its extras
(``Task.ext["b"]``). The dequeue of a member counts it done *in the plan of that dequeue*:
the batch's new record, the member's result and — for the last member — the callback's
enqueue are ops of the same WAL record as the dequeue, so a callback is enqueued exactly
once, after its last member, whatever crashes: there is no counter apart from the WAL and
nothing to reconcile on replay.

Dead-lettered members (and cancelled ones) are counted in ``failed``; what they do is the
batch's ``on_dead``: ``fail`` marks the batch failed and enqueues its ``error_callback``
(if any; the callback then never runs), ``ignore`` lets the callback run once every
member is done or failed. A dead letter leaves its batch (its copy in the dead-letter
queue carries no batch id), so redriving it does not count it twice.

Nesting: a callback may name a ``batch`` (the parent); it is a member of the parent from
the moment the child batch is created (the parent's ``total`` grows then), so the parent
cannot finish before the child's callback has run. A failed child counts as a failed
member of its parent. A member's handler may create batches, or add tasks to an open
batch with an enqueue's ``batch``.

Results: a member's dequeue may carry a result (text, at most 64 KiB), kept with the batch
until its callback is dequeued, so the callback can read every member's result
(``GET .../batches/{id}/results``). The results of one batch are bounded (8 MiB in all);
beyond, results are dropped and counted (the ack is never refused for its result).

Lifetime: a batch's record and results are deleted with the dequeue of its callback (or
error callback): a batch that is not found is finished and its callback done, or never
existed. A failed batch without an error callback is kept until ``DELETE``.

Storage (LMDB, the master's index environment)::

    batches   group \\0 id             -> msgpack record (see ``new_record``)
    bresults  group \\0 id \\0 queue \\0 pid -> result (UTF-8)

WAL ops (plain puts and deletes: a record is applied exactly once, live or on replay)::

    ("B", group, id, record | None)           put a batch's record, or delete it and its
                                              results (releasing its callbacks' payloads)
    ("BR", group, id, queue, pid, result)     keep a member's result
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import lmdb
import msgpack

from squall.common.errors import BadRequest, Conflict, NotFound
from squall.common.wire.models import BatchRequest, EnqueueItem
from squall.common.wire.names import check_name

if TYPE_CHECKING:
    from squall.master.storage.index import Index
    from squall.master.storage.records import QueueRec, Task
    from squall.master.tasks.engine import Engine
    from squall.master.tasks.view import Plan, View

RESULTS_MAX_BYTES = 8 * 1024 * 1024  # a batch's kept results, in all
LIST_MAX = 1000


def bkey(group: str, bid: str) -> bytes:
    return f"{group}\x00{bid}".encode()


def rkey(group: str, bid: str, queue: str, pid: str) -> bytes:
    return f"{group}\x00{bid}\x00{queue}\x00".encode() + pid.encode()


# -- reading ---------------------------------------------------------------------------------
def get(v: View, bid: str) -> dict[str, Any] | None:
    """The batch's record as this request sees it (read it, never change it)."""
    if bid in v.batches:
        return v.batches[bid]
    raw = v.txn.get(bkey(v.group, bid), db=v.e.index.batch_db)
    rec = None if raw is None else cast(dict[str, Any], msgpack.unpackb(raw))
    v.batches[bid] = rec
    return rec


def _set(v: View, bid: str, rec: dict[str, Any] | None) -> None:
    v.batches[bid] = rec
    v.batches_dirty.add(bid)


def flush(v: View) -> None:
    """The ops of every batch this request changed (View.finish calls it)."""
    for bid in sorted(v.batches_dirty):
        v.plan.ops.append(("B", v.group, bid, v.batches[bid]))
    v.batches_dirty.clear()


# -- creating --------------------------------------------------------------------------------
def _stored(e: Engine, item: EnqueueItem | None) -> dict[str, Any] | None:
    if item is None:
        return None
    d = item.model_dump(exclude_none=True, exclude={"payload"})
    check_name("queue", item.queue)
    if item.payload is not None:
        d["payload"] = e.store_payload(item.payload)  # checks its write receipts now
    return d


def plan_create(v: View, req: BatchRequest) -> Plan:
    """Create a batch and enqueue its members (`v`: a new view of the write txn)."""
    e, group = v.e, v.group
    now = e.now_ms()
    if req.id is None:
        v.auto_pid = max(now * 1000, v.auto_pid + 1)
        bid = f"b{v.auto_pid}"
    else:
        bid = check_name("batch", req.id)
    if get(v, bid) is not None:
        raise Conflict(f"batch {bid!r} exists in group {group!r}: give another id (or none)")
    parent = req.callback.batch
    if parent is not None:
        join(v, parent)  # the callback is the parent's member from now on
    rec: dict[str, Any] = {
        "total": 0, "done": 0, "failed": 0, "state": "open", "on_dead": req.on_dead,
        "callback": _stored(e, req.callback), "error_callback": _stored(e, req.error_callback),
        "parent": parent or "", "created": now, "finished": 0, "results": 0,
        "result_bytes": 0, "dropped": 0}
    if req.traceparent is not None:
        rec["tp"] = req.traceparent
        if req.tracestate is not None:
            rec["ts"] = req.tracestate
    _set(v, bid, rec)
    enqueued = []
    for item in req.tasks:
        r = e.enqueue(v, item.queue, item, now, ext={"b": bid})
        enqueued.append(r)
    rec = dict(get(v, bid) or rec)
    rec["total"] = sum(1 for r in enqueued if not r["collapsed"])
    _set(v, bid, rec)
    if rec["total"] == 0:
        _finish(v, bid, rec, ok=True, now=now)
    return v.finish({"batch": bid, "enqueued": enqueued})


def join(v: View, bid: str) -> None:
    """One more member of open batch `bid` (an enqueue's ``batch``, a child's callback)."""
    rec = get(v, check_name("batch", bid))
    if rec is None:
        raise NotFound(f"batch {bid!r} does not exist in group {v.group!r} (finished and its "
                       "callback done, deleted, or never created)")
    if rec["state"] != "open":
        raise Conflict(f"batch {bid!r} is {rec['state']}: it takes no more members")
    rec = dict(rec)
    rec["total"] += 1
    _set(v, bid, rec)


# -- members finishing ---------------------------------------------------------------------
def dequeued(v: View, q: QueueRec, ext: dict[str, Any], pid: str, result: str | None) -> None:
    """A task with extras was dequeued (acked): count a member done, drop a finished batch
    whose callback this was."""
    bid = ext.get("b")
    if bid is not None:
        rec = get(v, bid)
        if rec is not None:
            rec = dict(rec)
            rec["done"] += 1
            if result is not None:
                n = len(result.encode())
                if rec["result_bytes"] + n > RESULTS_MAX_BYTES:
                    rec["dropped"] += 1
                else:
                    rec["result_bytes"] += n
                    rec["results"] += 1
                    v.plan.ops.append(("BR", v.group, bid, q.name, pid, result))
            _set(v, bid, rec)
            if rec["state"] == "open" and rec["done"] + rec["failed"] >= rec["total"]:
                _finish(v, bid, rec, ok=True, now=v.e.now_ms())
    cb = ext.get("cb")
    if cb is not None and get(v, cb) is not None:
        _set(v, cb, None)  # its callback is done: the batch and its results go


def failed(v: View, t: Task) -> None:
    """Member `t` was dead-lettered or cancelled: it leaves its batch (``t.ext`` loses
    the batch id), counted as failed, and the batch's ``on_dead`` says what follows."""
    assert t.ext is not None
    t.ext = dict(t.ext)  # its own copy: the dict may be a pending op's
    bid = t.ext.pop("b", None)
    if bid is not None:
        _count_failed(v, bid)


def _count_failed(v: View, bid: str) -> None:
    rec = get(v, bid)
    if rec is None:
        return
    rec = dict(rec)
    rec["failed"] += 1
    _set(v, bid, rec)
    if rec["state"] != "open":
        return
    if rec["on_dead"] == "fail":
        _finish(v, bid, rec, ok=False, now=v.e.now_ms())
    elif rec["done"] + rec["failed"] >= rec["total"]:
        _finish(v, bid, rec, ok=True, now=v.e.now_ms())


def _finish(v: View, bid: str, rec: dict[str, Any], *, ok: bool, now: int) -> None:
    """Batch `bid` is done (ok) or failed: enqueue its callback or error callback, in this
    plan (so in the WAL record of what finished it)."""
    rec = dict(rec)
    rec["state"], rec["finished"] = ("done" if ok else "failed"), now
    _set(v, bid, rec)
    spec = rec["callback"] if ok else rec["error_callback"]
    parent = rec["parent"]
    if spec is None:  # a failed batch without an error callback
        if parent:
            _count_failed(v, parent)
        return
    ext: dict[str, Any] = {"cb": bid}
    if ok and parent:
        ext["b"] = parent  # joined the parent when this batch was created
    elif parent:
        _count_failed(v, parent)
    if "tp" in rec and "traceparent" not in spec:
        ext["tp"] = rec["tp"]
        if "ts" in rec:
            ext["ts"] = rec["ts"]
    fields = {k: val for k, val in spec.items() if k not in ("payload", "batch")}
    item = EnqueueItem.model_validate(fields)
    r = v.e.enqueue(v, spec["queue"], item, now, stored_payload=spec.get("payload"), ext=ext)
    if r["collapsed"]:  # its pid was queued already: that task is not the callback
        rec = dict(get(v, bid) or rec)
        rec["collapsed_callback"] = r["pid"]
        _set(v, bid, rec)
        if ok and parent:
            rec_p = get(v, parent)
            if rec_p is not None:  # the parent's slot for it counts as done
                p = dict(rec_p)
                p["done"] += 1
                _set(v, parent, p)
                if p["state"] == "open" and p["done"] + p["failed"] >= p["total"]:
                    _finish(v, parent, p, ok=True, now=now)


def plan_delete(v: View, bid: str) -> Plan:
    if get(v, check_name("batch", bid)) is None:
        raise NotFound(f"batch {bid!r} does not exist in group {v.group!r}")
    _set(v, bid, None)
    return v.finish({"deleted": bid})


# -- applying (live and on replay) ---------------------------------------------------------
def _payload_ids(rec: dict[str, Any] | None) -> set[str]:
    out = set()
    for k in ("callback", "error_callback"):
        spec = (rec or {}).get(k) or {}
        if spec.get("payload"):
            out.add(spec["payload"]["blob_id"])
    return out


def apply_op(index: Index, txn: lmdb.Transaction, op: tuple[Any, ...]) -> None:
    if op[0] == "BR":
        _, group, bid, queue, pid, result = op
        txn.put(rkey(group, bid, queue, pid), result.encode(), db=index.bresults)
        return
    _, group, bid, rec = op
    k = bkey(group, bid)
    raw = txn.get(k, db=index.batch_db)
    old = None if raw is None else msgpack.unpackb(raw)
    before, after = _payload_ids(old), _payload_ids(rec)
    for b in after - before:
        index.ref_blob(txn, b, +1)
    for b in before - after:
        index.ref_blob(txn, b, -1)
    if rec is not None:
        txn.put(k, msgpack.packb(rec), db=index.batch_db)
        return
    txn.delete(k, db=index.batch_db)
    prefix = k + b"\x00"
    cur = txn.cursor(db=index.bresults)
    if cur.set_range(prefix):
        while bytes(cur.key()).startswith(prefix):
            if not cur.delete():
                break


# -- reads for the routes --------------------------------------------------------------------
def info(group: str, bid: str, rec: dict[str, Any]) -> dict[str, Any]:
    return {
        "batch": bid, "group": group, "state": rec["state"], "total": rec["total"],
        "done": rec["done"], "failed": rec["failed"],
        "pending": max(0, rec["total"] - rec["done"] - rec["failed"]),
        "on_dead": rec["on_dead"], "callback_queue": rec["callback"]["queue"],
        "parent": rec["parent"] or None, "created_at": rec["created"] / 1000,
        "finished_at": rec["finished"] / 1000 if rec["finished"] else None,
        "results": rec["results"], "results_dropped": rec["dropped"]}


def read_info(index: Index, group: str, bid: str) -> dict[str, Any]:
    check_name("group", group)
    check_name("batch", bid)
    with index.env.begin() as txn:
        raw = txn.get(bkey(group, bid), db=index.batch_db)
    if raw is None:
        raise NotFound(f"batch {bid!r} is not in group {group!r} (finished and its callback "
                       "done, deleted, or never created)")
    return info(group, bid, msgpack.unpackb(raw))


def list_batches(index: Index, group: str, after: str | None, limit: int) -> dict[str, Any]:
    check_name("group", group)
    if after is not None:
        check_name("batch", after)
    limit = max(1, min(limit, LIST_MAX))
    prefix = f"{group}\x00".encode()
    out: list[dict[str, Any]] = []
    nxt = None
    with index.env.begin() as txn:
        cur = txn.cursor(db=index.batch_db)
        start = prefix + (after.encode() + b"\x00" if after else b"")
        if cur.set_range(start):
            for k, raw in cast(Iterator[tuple[bytes, bytes]], cur):
                if not k.startswith(prefix):
                    break
                if len(out) >= limit:
                    nxt = out[-1]["batch"]
                    break
                bid = bytes(k[len(prefix):]).decode()
                out.append(info(group, bid, msgpack.unpackb(raw)))
    return {"batches": out, "next": nxt}


def overview(index: Index, limit: int = 20, scan: int = 1000) -> list[dict[str, Any]]:
    """Up to `limit` batches of any group for the dashboard, open ones first, from the
    first `scan` records (bounded work per refresh)."""
    rows: list[dict[str, Any]] = []
    with index.env.begin() as txn:
        for i, (k, raw) in enumerate(cast(Iterator[tuple[bytes, bytes]],
                                          txn.cursor(db=index.batch_db))):
            if i >= scan:
                break
            group, _, bid = bytes(k).decode().partition("\x00")
            rows.append(info(group, bid, msgpack.unpackb(raw)))
    rows.sort(key=lambda r: (r["state"] != "open", -r["created_at"]))
    return rows[:limit]


def read_results(index: Index, group: str, bid: str, after: str | None, limit: int
                 ) -> dict[str, Any]:
    """Up to `limit` results of batch `bid`, by queue then pid; `after` is a page's
    ``next`` (hex)."""
    read_info(index, group, bid)  # 404 for a batch that is gone
    limit = max(1, min(limit, LIST_MAX))
    prefix = bkey(group, bid) + b"\x00"
    try:
        start = bytes.fromhex(after) if after else b""
    except ValueError:
        raise BadRequest("after: not a page cursor (pass a page's `next`)") from None
    if len(start) > 2048:
        raise BadRequest("after: not a page cursor (too long)")
    out: list[dict[str, Any]] = []
    nxt = None
    out_key = b""
    with index.env.begin() as txn:
        cur = txn.cursor(db=index.bresults)
        if cur.set_range(prefix + start):
            for k, raw in cast(Iterator[tuple[bytes, bytes]], cur):
                if not k.startswith(prefix):
                    break
                rest = bytes(k[len(prefix):])
                if start and rest == start:
                    continue
                if len(out) >= limit:
                    nxt = out_key.hex()
                    break
                queue, _, pid = rest.partition(b"\x00")
                out.append({"queue": queue.decode(), "pid": pid.decode(),
                            "result": bytes(raw).decode()})
                out_key = rest
    return {"results": out, "next": nxt}
