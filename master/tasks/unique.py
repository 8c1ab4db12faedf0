"""Unique tasks and debounce: at most one queued (or running) task per key.

An enqueue with ``unique`` or ``debounce_secs`` (both need the task's flow-control
``key``) registers its task as the *holder* of its key in its queue. A later enqueue of
the same key:

- ``unique: "queued"`` collapses into the holder while the holder is queued (available,
  delayed, or leased with its lease expired): it answers ``collapsed: true`` with the
  holder's pid and adds nothing. A holder under a live lease does not block: the new task
  is added and becomes the holder.
- ``unique: "active"`` collapses while the holder is queued *or leased* (running). We
  collapse rather than refuse (a 409), as pid dedupe does: a producer that retries or
  fires on every event needs no error handling, and the answer names the task that will
  do the work.
- ``debounce_secs: D`` replaces a queued holder's payload and pushes its not-before to
  ``now + D``, but never past ``debounce_max_secs`` (default ``10 * D``) after the enqueue
  that started the series; it answers ``collapsed: true`` with the holder's pid. Without a
  queued debounced holder (none, or it has been leased, even if that lease expired: its
  holder may still ack it), the enqueue adds a task held for ``D``, which becomes the
  holder.

The check is against the key's holder only: the newest task registered, while it exists.
A holder that leaves (dequeued, dead-lettered, cancelled, its queue deleted) frees its key.
Unique and debounce share a key's holder; use one or the other per key.

Storage: LMDB database ``uniq``: ``qid(u32) gen(u32) key`` -> holder pid (UTF-8), written by
the WAL op ``("U", qid, gen, key, pid)`` (a plain put). The holder's record carries
``ext["u"]`` (``q``, ``a`` or ``d``) and, debounced, ``ext["dl"]`` (its latest time, ms), so
a pid that was dequeued and enqueued again without ``unique`` does not hold the key.
Entries of a deleted queue generation are reaped with its tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lmdb

from squall.common.wire.models import TaskSpec
from squall.master.storage.records import (
    AVAILABLE,
    DELAYED,
    LEASED,
    QG,
    W_EXPIRY,
    W_EXT,
    W_KEY,
    W_NOT_BEFORE,
    W_PAYLOAD,
    W_STATE,
    QueueRec,
)

if TYPE_CHECKING:
    from squall.master.storage.index import Index
    from squall.master.tasks.view import View

DEBOUNCE_MAX_FACTOR = 10


def ukey(qid: int, gen: int, key: str) -> bytes:
    return QG.pack(qid, gen) + key.encode()


def holder(v: View, q: QueueRec, key: str) -> list[Any] | None:
    """The wire list of the task holding `key` in `q`, or None."""
    k = (q.qid, key)
    if k in v.uniq:
        pid: str | None = v.uniq[k]
    else:
        raw = v.txn.get(ukey(q.qid, q.gen, key), db=v.e.index.uniq)
        pid = None if raw is None else bytes(raw).decode()
    if pid is None:
        return None
    w = v.wire(q, pid.encode())
    if w is None or len(w) <= W_EXT or "u" not in w[W_EXT] or w[W_KEY] != key:
        return None
    return w


def check(v: View, q: QueueRec, s: TaskSpec, key: str, payload: dict[str, Any] | None,
          now: int) -> dict[str, Any] | None:
    """The answer of an enqueue that collapses into (or debounces) the key's holder, or
    None when the enqueue adds its task."""
    w = holder(v, q, key)
    if w is None:
        return None
    if s.debounce_secs is not None:
        if w[W_EXT]["u"] != "d" or w[W_STATE] == LEASED:
            return None
        new = list(w)
        ext = dict(w[W_EXT])
        nb = min(now + int(s.debounce_secs * 1000), int(ext["dl"]))
        new[W_PAYLOAD] = payload
        new[W_EXT] = ext
        if nb > now:
            new[W_STATE], new[W_NOT_BEFORE] = DELAYED, nb
        else:
            new[W_STATE], new[W_NOT_BEFORE] = AVAILABLE, 0
        v.put_wire(q, w[0].encode(), new, enqueue=False)
        v.plan.events[(q.group, q.name, "debounce")] += 1
        return {"queue": q.name, "pid": w[0], "collapsed": True}
    running = w[W_STATE] == LEASED and w[W_EXPIRY] > now  # an expired lease: queued
    if not running or s.unique == "active":
        return {"queue": q.name, "pid": w[0], "collapsed": True}
    return None


def register(v: View, q: QueueRec, s: TaskSpec, key: str, pid: str, ext: dict[str, Any],
             now: int) -> int | None:
    """Make the new task `pid` the holder of `key` (its extras in `ext`); for a debounced
    task, its not-before (ms)."""
    v.uniq[(q.qid, key)] = pid
    v.plan.ops.append(("U", q.qid, q.gen, key, pid))
    if s.debounce_secs is None:
        ext["u"] = "q" if s.unique == "queued" else "a"
        return None
    ext["u"] = "d"
    most = s.debounce_max_secs or s.debounce_secs * DEBOUNCE_MAX_FACTOR
    ext["dl"] = now + int(most * 1000)
    return now + int(s.debounce_secs * 1000)


def apply_op(index: Index, txn: lmdb.Transaction, op: tuple[Any, ...]) -> None:
    _, qid, gen, key, pid = op
    q = index.by_qid.get(qid)
    if q is None or q.gen != gen:
        return
    txn.put(ukey(qid, gen, key), pid.encode(), db=index.uniq)
