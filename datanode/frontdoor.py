"""The front door for small payloads: one client request enqueues many tasks *with* their
payloads (docs/design.md, "The front door").

    client --POST {node}/v1/groups/{g}/queues/{q}/tasks (msgpack)--> front-door node
      1. blob ids from a block the master granted this node ahead of time (no allocation
         round trip; see master/http/routes/frontdoor.py)
      2. store the payloads here (one transaction, synced) and on the block's peers
         (``/v1/replicate:batch-put?receipt=batch``) at once; every node signs one batch
         receipt for the request's blobs (the master checks one MAC per node, not per blob)
      3. the write quorum holds every payload: hand the enqueue (payload refs, and the
         replicas and batch receipts they share, once per request) to the committer, which
         sends everything waiting at that moment to the master in one
         ``POST /v1/nodes/commit`` (each client request is its own update, all or nothing;
         the master group-commits them under one fsync)
      4. answer the client with the master's answer

Invariants (docs/design.md): an enqueue is answered only after the master answered, i.e. its
metadata is in the fsynced WAL and its payload on the write quorum; the master accepts a
payload reference only with a write quorum of receipts, so a task is never leasable before
its payload is durable; a crash between 2 and 3 leaves blobs no task references, which the
master's orphan collection deletes after ``orphan_grace_s``; a crash between 3 and 4 leaves
an enqueue the client does not know about: its retry (to any node) carries the same pids and
collapses into it (the client makes a pid for every task).

The parallel put (``SQUALL_FRONT_DOOR_PARALLEL=1``, or ``auto`` for a request that finds
no other front-door request in progress here; off by default; for requests of up to
``PARALLEL_MAX_TASKS`` tasks): the blob ids,
sizes and checksums are known before anything is stored, so steps 2 and 3 run at once:
the enqueue goes to the master marked *pending* (the master logs the tasks, never leases
them; master/tasks/pending.py) while the payloads are stored and
replicated. The client is answered once both are durable. The receipts then go to the
master in this node's next grouped commit (a *settle* that confirms the tasks, after which
they are leasable; it waits up to ``CONFIRM_LINGER_S`` for other commits to ride along).
If the payloads did not reach the write quorum, the node abandons the pending tasks (a
settle that removes them) before it answers the refusal; if that cannot be committed
either, the answer is 502 ``outcome_unknown``. A node that dies in between leaves pending
tasks the master's housekeeping settles from the nodes' block reports.

Test hooks: ``SQUALL_TEST_CRASH=after_store|after_commit`` makes the node SIGKILL itself at
that point of the next front-door request; ``pending_first`` (parallel put): after the
pending enqueue is durable, before storing anything; ``before_confirm``: once both are
durable, before answering and confirming; ``SQUALL_TEST_NO_CONFIRM=1``: never send
confirmations (crash tests only).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from squall.common.checksum import crc32c
from squall.common.errors import OutcomeUnknown, StatusError, Unavailable, from_response
from squall.common.masters import standby_error
from squall.common.wire import nodecommit
from squall.common.wire.cluster import BlockGrant, PeerError
from squall.common.wire.payload import Frame, encode_frame
from squall.datanode import masterlink
from squall.datanode.replication.coalesce import Coalescer
from squall.datanode.replication.peers import PeerUnreachable
from squall.datanode.replication.pipeline import forward_batch, quorum_message
from squall.datanode.store.blobstore import BlobMeta

if TYPE_CHECKING:
    from squall.datanode.service import DataNode

log = logging.getLogger("squall.datanode.frontdoor")
# requests and their answers: ("u", an update) or ("s", a settle of pending tasks)
_Batch = list[tuple[str, dict[str, Any], asyncio.Future[dict[str, Any]]]]
BLOCK_IDS = 1000  # the first block's size; it doubles while blocks run out fast
BLOCK_IDS_MAX = 1_000_000  # BlockRequest's bound
BLOCK_MARGIN_S = 5.0  # stop using a block this long before it expires
COMMIT_UPDATES_MAX = 500  # client requests per node-to-master commit
COMMIT_PENDING_MAX = 5000  # client requests waiting for a commit (503 beyond)
# node-to-master commits in flight at once: a request that arrives while one is in flight
# goes at once instead of waiting for it (under D's load a commit took ~8 ms, and waiting
# for the one ahead made a front-door put ~1.5 commits long); beyond this they batch up
COMMITS_IN_FLIGHT = 4
# the parallel put for requests of at most this many tasks: it costs the master two records
# per task (pending, confirmed) to take the master's commit off a put's latency, which is
# what a client putting one task at a time waits for; a large batch is bound by CPU, not
# by its latency (its client keeps several in flight), and goes the serial way
PARALLEL_MAX_TASKS = 16
_EXTRAS = {"key", "unique", "debounce_secs", "debounce_max_secs", "traceparent", "tracestate"}
# a confirmation of pending tasks waits at most this long for a commit to ride along with
# (a confirmation sent alone costs the master a WAL group of its own, whose sync the next
# put's pending enqueue would wait behind)
CONFIRM_LINGER_S = 0.02
_UNKNOWN = ("the master may have applied this enqueue, but its answer did not reach this data "
            "node ({}); resend it: its pids make the resend collapse into it while its tasks "
            "are queued (give idempotency keys to cover tasks dequeued meanwhile)")


@dataclass
class _Block:
    prefix: str
    count: int
    expires_at: float
    replicas: list[str]
    quorum: int
    granted_at: float
    used: int = 0


def next_block_ids(size: int, b: _Block, n: int, now: float) -> int:
    """The size of the next block after `b`. The master grants a node at most 8 unexpired
    blocks (each lives 60 s): blocks of a fixed 1000 ids capped a node's front door at
    ~130 tasks/s. A block that ran out within half its life doubles the next; one that
    ended (expired, or its placement dropped) a quarter used halves it; never below
    BLOCK_IDS. Ids cost nothing until used (a prefix and a counter)."""
    life = b.expires_at - BLOCK_MARGIN_S - b.granted_at
    if b.used + n > b.count and now - b.granted_at < life / 2:
        return min(BLOCK_IDS_MAX, 2 * size)
    if b.used < b.count / 4:
        return max(BLOCK_IDS, size // 2)
    return size


class FrontDoor:
    def __init__(self, node: DataNode) -> None:
        self.node = node
        s = node.settings
        self.master = (s.master_url or "").rstrip("/")
        self._block: _Block | None = None
        self._block_ids = BLOCK_IDS  # the size of the next block asked for
        self._block_lock = asyncio.Lock()
        self._pending: _Batch = []
        self._wake = asyncio.Event()
        self._committer: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(COMMITS_IN_FLIGHT)
        self._in_flight: dict[asyncio.Task[None], _Batch] = {}  # commits and their requests
        self.commits = self.committed = 0
        self.puts_in_progress = 0  # front-door requests being handled (the "auto" mode)
        self.confirmed = self.abandoned = self.confirm_failures = 0
        self.crash = os.environ.get("SQUALL_TEST_CRASH", "")
        self.no_confirm = os.environ.get("SQUALL_TEST_NO_CONFIRM", "") == "1"
        self._linger: asyncio.TimerHandle | None = None
        self._confirms: set[asyncio.Future[dict[str, Any]]] = set()
        # forwards of requests that arrive together share a replicate request per peer
        self.coalescer: Coalescer | None = Coalescer(node)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": "Bearer " + (self.node.settings.node_credential or
                                              self.node.node_token("heartbeat",
                                                                   [self.node.node_id]))}

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        """The master's answer; its error as such; Unavailable if the request never
        reached it; OutcomeUnknown if it may have and no answer came back. A commit
        (``/v1/nodes/commit``) goes in its compact binary form (common/wire/nodecommit.py)."""
        if not self.master:
            raise Unavailable("this data node has no master (--master): no front door")
        # the lean keep-alive client (datanode/replication/peers.py)
        assert self.node.peers is not None
        assert self.node.masters is not None
        if path == "/v1/nodes/commit" and not any(  # extras go in the JSON form
                e.keys() & _EXTRAS for u in body["updates"] for e in u["enqueue"]):
            path, ctype = path + ".msgpack", nodecommit.CONTENT_TYPE
            content = nodecommit.encode(body["node_id"], body["updates"],
                                        body.get("settles", []))
        else:
            ctype, content = "application/json", orjson.dumps(body)
        try:  # never resent once sent: a commit may have been applied
            r = await masterlink.post(self.node.peers, self.node.masters, path, content,
                                      {**self._auth(), "Content-Type": ctype})
        except PeerUnreachable as e:
            if e.sent:
                raise OutcomeUnknown(_UNKNOWN.format(e)) from e
            raise Unavailable(f"the master is unreachable from this node ({e}); nothing "
                              "was applied, retry", retry_after=1) from e
        if r.status_code >= 400:
            body = _json(r.content)
            raise (standby_error(r.status_code, r.headers, body, 1.0)
                   or from_response(r.status_code, body, None))
        return _json(r.content, unknown=True)

    # -- blob ids --------------------------------------------------------------------------
    async def take_ids(self, n: int) -> tuple[list[str], list[str], int]:
        """`n` fresh blob ids (one block), the peers to replicate them to, the quorum."""
        async with self._block_lock:
            b = self._block
            now = self.node.clock.now()
            if b is None or b.used + n > b.count or now > b.expires_at - BLOCK_MARGIN_S:
                if b is not None:
                    self._block_ids = next_block_ids(self._block_ids, b, n, now)
                try:
                    g = BlockGrant.model_validate(await self._post(
                        "/v1/nodes/blocks", {"node_id": self.node.node_id,
                                             "count": max(self._block_ids, n)}))
                except OutcomeUnknown as e:  # a grant lost: nothing of the request is done
                    raise Unavailable("this data node lost the master's answer to its "
                                      "request for blob ids; nothing was enqueued, retry",
                                      retry_after=1) from e
                b = self._block = _Block(g.prefix, g.count, g.expires_at, g.replicas,
                                         g.write_quorum, now)
            ids = [f"{b.prefix}{i}" for i in range(b.used, b.used + n)]
            b.used += n
            return ids, b.replicas, b.quorum

    def drop_block(self) -> None:
        """A peer of the block failed: ask the master for a new placement next time."""
        self._block = None

    # -- one client request ----------------------------------------------------------------
    async def enqueue(self, group: str, queue: str, tasks: list[dict[str, Any]]
                      ) -> dict[str, Any]:
        fields = ("pid", "not_before", "delay_secs", "idempotency_key", "key", "unique",
                  "debounce_secs", "debounce_max_secs", "traceparent", "tracestate")
        items = [{k: t[k] for k in fields if t.get(k) is not None} for t in tasks]
        update: dict[str, Any] = {"group": group, "enqueue": items}
        with_payload = [i for i, t in enumerate(tasks) if t.get("payload") is not None]
        # a pending task carries no flow key or extras (unique, debounce, trace): such
        # requests take the serial path
        parallel = bool(with_payload and self._parallel_now()
                    and len(tasks) <= PARALLEL_MAX_TASKS
                    and not any(it.keys() & _EXTRAS for it in items))
        self.puts_in_progress += 1
        try:
            if parallel:
                return await self._parallel(group, queue, tasks, items, with_payload)
            return await self._serial(group, queue, tasks, items, update, with_payload)
        finally:
            self.puts_in_progress -= 1

    def _parallel_now(self) -> bool:
        """Whether a small request takes the parallel put: "auto" when it finds no other
        front-door request on this node (a client waiting for each put, whose latency the
        parallel put shortens; under concurrent puts the serial path's one record per task
        costs less CPU, which they are bound by), "on" always, "off" never."""
        mode = self.node.settings.front_door_parallel
        return mode == "on" or (mode == "auto" and self.puts_in_progress == 0)

    async def _serial(self, group: str, queue: str, tasks: list[dict[str, Any]],
                      items: list[dict[str, Any]], update: dict[str, Any],
                      with_payload: list[int]) -> dict[str, Any]:
        """Store and replicate the payloads, then commit the enqueue."""
        if with_payload:
            refs, update["replicas"], update["receipts"] = await self._store(
                [tasks[i]["payload"] for i in with_payload])
            for i, ref in zip(with_payload, refs, strict=True):
                items[i]["payload"] = ref
        self._hook("after_store")
        for it in items:
            it["queue"] = queue
        res = await self._commit(update)
        self._hook("after_commit")
        return res

    async def _parallel(self, group: str, queue: str, tasks: list[dict[str, Any]],
                        items: list[dict[str, Any]], with_payload: list[int]
                        ) -> dict[str, Any]:
        """The parallel put: the pending enqueue and the payloads' store at once."""
        ids, peers, quorum = await self.take_ids(len(with_payload))
        frames = [Frame(b, d, crc32c(d))
                  for b, d in zip(ids, (tasks[i]["payload"] for i in with_payload),
                                  strict=True)]
        refs = [{"blob_id": f.blob_id, "size": len(f.data), "crc32c": f.crc32c}
                for f in frames]
        for i, ref in zip(with_payload, refs, strict=True):
            items[i]["payload"] = ref
        for it in items:
            it["queue"] = queue
        update = {"group": group, "enqueue": items, "pending": True,
                  "replicas": [self.node.address, *peers]}
        commit = asyncio.ensure_future(self._commit(update))
        if self.crash == "pending_first":
            await asyncio.wait([commit])
            self._hook("pending_first")
        store = asyncio.ensure_future(self._store_frames(frames, peers, quorum))
        await asyncio.wait([commit, store])
        failed = commit.exception()
        if failed is not None:
            if isinstance(failed, OutcomeUnknown) and not self.no_confirm and all(
                    items[i].get("pid") for i in with_payload):
                # the master may hold the tasks pending: settle them now rather than at
                # their deadline (a settle of tasks it does not hold changes nothing)
                self._settle_unknown(group, [items[i] for i in with_payload], store)
            elif not store.cancelled():
                store.exception()  # retrieved: the stored payloads are orphans
            raise failed
        res = commit.result()
        settle = {"group": group, "items": [
            {"queue": e["queue"], "pid": e["pid"], "payload": items[i]["payload"]}
            for i, e in zip(with_payload, (res["enqueued"][i] for i in with_payload),
                            strict=True)]}
        if store.exception() is not None:
            # the tasks are pending: remove them before answering the refusal
            try:
                await self._commit({**settle, "durable": False}, kind="s")
            except Exception as e:
                raise OutcomeUnknown(_UNKNOWN.format(
                    f"its payloads did not reach their write quorum ({store.exception()}) "
                    f"and their pending enqueue could not be withdrawn ({e})")) from e
            self.abandoned += 1
            raise store.exception()  # type: ignore[misc]
        self._hook("before_confirm")
        replicas, receipts = store.result()
        if not self.no_confirm:
            self._confirm({**settle, "durable": True, "replicas": replicas,
                           "receipts": receipts})
        self._hook("after_commit")
        return res

    def _settle_unknown(self, group: str, items: list[dict[str, Any]],
                        store: asyncio.Future[tuple[list[str], list[str]]]) -> None:
        """The pending enqueue's answer was lost: confirm the tasks if the payloads are
        on their write quorum, else withdraw them (nobody waits for either)."""
        settle: dict[str, Any] = {"group": group, "items": [
            {"queue": it["queue"], "pid": it["pid"], "payload": it["payload"]}
            for it in items]}
        if store.exception() is None:
            replicas, receipts = store.result()
            self._confirm({**settle, "durable": True, "replicas": replicas,
                           "receipts": receipts})
        else:
            self._confirm({**settle, "durable": False})

    def _confirm(self, settle: dict[str, Any]) -> None:
        """Send `settle` with the next commit (within CONFIRM_LINGER_S); nobody waits for
        it: a confirmation that fails is settled by the master's housekeeping."""
        fut = self._enqueue_commit("s", settle, wake=False)
        self._confirms.add(fut)
        fut.add_done_callback(self._confirmed)
        if self._linger is None:
            self._linger = asyncio.get_running_loop().call_later(CONFIRM_LINGER_S,
                                                                 self._wake_up)

    def _wake_up(self) -> None:
        self._linger = None
        self._wake.set()

    def _confirmed(self, fut: asyncio.Future[dict[str, Any]]) -> None:
        self._confirms.discard(fut)
        if fut.cancelled():
            return
        if fut.exception() is not None:
            self.confirm_failures += 1
            log.warning("a confirmation of pending tasks failed (the master settles them "
                        "from the block reports): %s", fut.exception())
        else:
            self.confirmed += 1

    def _hook(self, where: str) -> None:
        if self.crash == where:
            log.warning("SQUALL_TEST_CRASH=%s: killing myself", where)
            os.kill(os.getpid(), signal.SIGKILL)

    async def _store(self, payloads: list[bytes]
                     ) -> tuple[list[dict[str, Any]], list[str], list[str]]:
        """Store `payloads` on the write quorum: their references (blob id, size, CRC32C),
        and the replicas and receipts they all share (one batch receipt per node)."""
        ids, peers, quorum = await self.take_ids(len(payloads))
        frames = [Frame(b, d, crc32c(d)) for b, d in zip(ids, payloads, strict=True)]
        replicas, receipts = await self._store_frames(frames, peers, quorum)
        return ([{"blob_id": f.blob_id, "size": len(f.data), "crc32c": f.crc32c}
                 for f in frames], replicas, receipts)

    async def _store_frames(self, frames: list[Frame], peers: list[str], quorum: int
                            ) -> tuple[list[str], list[str]]:
        """Store `frames` here and on `peers`, at least `quorum` copies: the replicas and
        batch receipts (one per node) the frames share."""
        node = self.node
        body = b"".join(encode_frame(f.blob_id, f.data, crc=f.crc32c) for f in frames)
        like = [BlobMeta(f.blob_id, 0, len(f.data), f.crc32c, 0, 0, 0) for f in frames]
        both: tuple[Any, Any] = await asyncio.gather(
            node.store.put_batch([(f.blob_id, f.data, f.crc32c) for f in frames]),
            self.coalescer.forward(body, like, peers) if self.coalescer is not None
            else forward_batch(node, body, like, peers, batch_receipt=True),
            return_exceptions=True)
        stored, forwarded = both
        if isinstance(stored, BaseException):
            raise stored
        if isinstance(forwarded, BaseException):
            raise forwarded
        local: list[tuple[BlobMeta, bool]] = stored
        remote: list[dict[str, dict[str, str]] | PeerError] = forwarded
        node.puts += len(frames)
        errors = [r for r in remote if isinstance(r, PeerError)]
        good = [r for r in remote if not isinstance(r, PeerError)]
        if errors:
            node.peer_errors += len(errors)
            self.drop_block()
        if 1 + len(good) < quorum:
            raise Unavailable(quorum_message(f"a front-door batch of {len(frames)} payloads",
                                             1 + len(good), 1 + len(peers), quorum, errors),
                              retry_after=1)
        mine = node.batch_receipt(m for m, _ in local)  # one per node for the batch
        first = frames[0].blob_id  # a peer's entry is the same for every blob of the batch
        return ([node.address, *(p[first]["address"] for p in good)],
                [mine, *(p[first]["receipt"] for p in good)])

    # -- the group commit to the master ----------------------------------------------------
    async def _commit(self, body: dict[str, Any], kind: str = "u") -> dict[str, Any]:
        """Commit an update (`kind` "u") or a settle ("s") with the next group."""
        if len(self._pending) >= COMMIT_PENDING_MAX:
            raise Unavailable(f"{len(self._pending)} front-door requests wait for the master "
                              "on this node; retry shortly", retry_after=1)
        return await self._enqueue_commit(kind, body)

    def _enqueue_commit(self, kind: str, body: dict[str, Any], wake: bool = True
                        ) -> asyncio.Future[dict[str, Any]]:
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_loop(), name="frontdoor-commit")
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending.append((kind, body, fut))
        if wake:
            self._wake.set()
        return fut

    async def _commit_loop(self) -> None:
        """Everything waiting when a slot is free goes in one commit; up to
        COMMITS_IN_FLIGHT commits at once (each client request is its own update on the
        master, so their order does not matter)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                await self._slots.acquire()
                if not self._pending:  # taken meanwhile (the node stops)
                    self._slots.release()
                    break
                batch = self._pending[:COMMIT_UPDATES_MAX]
                del self._pending[:COMMIT_UPDATES_MAX]
                t = asyncio.create_task(self._commit_batch(batch), name="frontdoor-commit")
                self._in_flight[t] = batch
                t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task[None]) -> None:
        self._in_flight.pop(t, None)

    async def _commit_batch(self, batch: _Batch) -> None:
        try:
            await self._commit_to_master(batch)
        finally:
            self._slots.release()
            # cancelled (the node stops) with the commit perhaps at the master: nobody
            # waits forever, and nobody is told it was refused
            _stopped(batch, unknown="this data node stopped")

    async def _commit_to_master(self, batch: _Batch) -> None:
        t0 = time.monotonic()
        try:
            updates = [b for k, b, _ in batch if k == "u"]
            settles = [b for k, b, _ in batch if k == "s"]
            ans = await self._post("/v1/nodes/commit", {"node_id": self.node.node_id,
                                                        "updates": updates,
                                                        "settles": settles})
            ups, sts = iter(ans["results"]), iter(ans.get("settled") or [])
            if len(ans["results"]) != len(updates) or len(ans.get("settled") or []) != len(
                    settles):
                raise ValueError(f"{len(ans['results'])} results for {len(updates)} updates")
            results = [next(ups) if k == "u" else next(sts) for k, _, _ in batch]
        except Exception as e:  # every waiting request gets an answer, whatever happened
            # the master's refusal, Unavailable (never sent) or OutcomeUnknown as raised;
            # anything else happened after sending (e.g. an answer that does not parse)
            err = e if isinstance(e, StatusError) else OutcomeUnknown(
                _UNKNOWN.format(f"{type(e).__name__}: {e}"))
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(err)
            return
        self.commits += 1
        self.committed += len(batch)
        log.debug("committed %d front-door requests in %.1f ms", len(batch),
                  1000 * (time.monotonic() - t0))
        for (_, _, fut), r in zip(batch, results, strict=True):
            if fut.done():
                continue
            if "ok" in r:
                fut.set_result(r["ok"])
            else:
                bad = r.get("error") or {}
                fut.set_exception(from_response(int(bad.get("status", 500)), {"error": bad},
                                                None))

    async def aclose(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
        batches = list(self._in_flight.values())
        tasks = [t for t in [self._committer, *self._in_flight] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # a commit task cancelled before its first step never ran its `finally` (and never
        # sent anything); the ones that ran have answered their requests already
        for batch in batches:
            _stopped(batch)
        pending, self._pending = self._pending, []
        _stopped(pending)


def _stopped(batch: _Batch, unknown: str | None = None) -> None:
    """Answer the requests of `batch` still waiting (none, after a commit that answered):
    OutcomeUnknown saying `unknown` (why the master may have the commit), or (never sent
    to the master) 503."""
    err: StatusError | None = None
    for _, _, fut in batch:
        if not fut.done():
            if err is None:
                err = OutcomeUnknown(_UNKNOWN.format(unknown)) if unknown else Unavailable(
                    "the data node stopped before sending this to the master; nothing was "
                    "applied, retry", retry_after=1)
            fut.set_exception(err)


def _json(content: bytes, unknown: bool = False) -> Any:
    """The parsed body; one that does not parse is the master's answer lost on a 2xx
    (`unknown`: OutcomeUnknown), or an error answer of its own (its status says)."""
    try:
        return orjson.loads(content) if content else {}
    except orjson.JSONDecodeError as e:
        if unknown:
            raise OutcomeUnknown(_UNKNOWN.format(f"its answer did not parse: {e}")) from e
        return {}
