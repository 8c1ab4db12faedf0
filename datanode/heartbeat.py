"""The data node's heartbeat to the master, and the commands it brings back.

Every ``heartbeat_interval_s`` (first beat at once) the node POSTs a
:class:`~squall.common.wire.cluster.HeartbeatRequest` to ``{master}/v1/nodes/heartbeat`` with
``Authorization: Bearer <heartbeat token>`` (op ``heartbeat``, scoped to its node id, signed
with the cluster key), through the node's HTTP client (``replication/peers.py``, the
engine's pool; a beat is never resent after it was sent). Of a master set, the beat goes to
the leader (``masterlink.py``: a standby's refusal or a refused connection sends it on at
once). See ``common/wire/cluster.py`` for the fields:
space, blob count, an incremental block report (added / deleted since the last good beat),
a full inventory on the first beat, after a failed one, every ``full_report_every`` beats
and when the master asks; corrupt replicas dropped; outcomes of replicate commands.

A failed beat (master down, slow, 5xx, bad answer) never stops the node: it is logged, the
next beat is a full report (so no delta is lost), corrupt and replication reports are kept
for it, and the interval backs off (doubling, at most 4x) until the master answers again.
Of a master set a failed beat means a failover is likely under way, and the new leader
places no payload on a node it has not heard from: the node tries again every
``FAILOVER_RETRY_S`` (at most ``FAILOVER_TRIES`` times in a row) before it backs off, and
it beats at once when its requests to the master moved to another address.

Commands in the answer run here: ``delete`` at once (all of an answer's deletes together,
one transaction and one sync per 1000 ids), ``replicate`` and ``replicate_batch`` as
background copies (at most ``copies_max`` commands at a time, one per blob or batch and
target) whose outcomes (one per blob) go into the next beats. When copies finish the node
beats early (at most every ``NUDGE_GAP_S``) to report them and fetch the next ones, so a
repair runs at the speed of the copies, not of the heartbeat period; early beats do not
count towards ``full_report_every``.

The highest master-set epoch an answer carried is kept in ``<data_dir>/master-epoch``
(0600, replaced atomically and fsynced before the answer's commands run, read at start):
a deposed leader's deletes stay refused after this node restarts (docs/decisions/0026).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from squall.common.wire.cluster import (
    Command,
    DeleteCommand,
    HeartbeatRequest,
    ReplicateBatchCommand,
    ReplicateCommand,
    ReplicationReport,
)
from squall.datanode import masterlink
from squall.datanode.replication.pipeline import copy_batch, copy_blob
from squall.datanode.service import DataNode

log = logging.getLogger("squall.datanode.heartbeat")
_COMMAND: TypeAdapter[Command] = TypeAdapter(Command)
MAX_PENDING_REPORTS = 10_000
REPORTS_PER_BEAT = 250  # more wait for the next beat, which comes early (bounded work)
DELETE_TXN_IDS = 1000
NUDGE_GAP_S = 0.1  # the shortest pause between two beats when copies finished early
FAILOVER_RETRY_S = 0.25  # of a master set: the pause after a failed beat ...
FAILOVER_TRIES = 40  # ... this many times in a row (10 s, past an elector's lease)
MAX_REVOKED = 100_000
PATH = "/v1/nodes/heartbeat"
CONNECT_S, TIMEOUT_S = 2.0, 30.0  # a beat's connect and answer timeouts (never resent)
EPOCH_FILE = "master-epoch"


def load_epoch(path: str) -> int:
    """The epoch kept in `path`; 0 when there is none. An unreadable file fails the start
    (a node that forgot its epoch would run a deposed leader's deletes)."""
    try:
        with open(path, "rb") as f:
            text = f.read(64).strip()
    except FileNotFoundError:
        return 0
    if not text.isdigit():
        raise ValueError(f"{path} does not hold a master epoch ({text[:20]!r}); it is "
                         "rewritten by the next heartbeat answer once removed")
    return int(text)


def save_epoch(path: str, epoch: int) -> None:
    """Write `epoch` to `path` durably: a temporary file (0600), fsynced, renamed over it,
    the directory fsynced."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"%d\n" % epoch)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class Heartbeat:
    def __init__(self, node: DataNode) -> None:
        self.node = node
        s = node.settings
        self.interval_s = s.heartbeat_interval_s
        self.seq = 0
        self.timed = 0  # successful beats on the regular schedule (full report cadence)
        self.nudged = 0  # early beats that reported finished copies
        self._nudge = asyncio.Event()
        self.beats = self.failures = self.consecutive_failures = 0
        self.commands_run = 0
        # the highest master-set epoch a heartbeat answer carried, kept across restarts
        self.epoch_path = os.path.join(s.data_dir, EPOCH_FILE)
        self.epoch = self.saved_epoch = load_epoch(self.epoch_path)
        self.fenced_deletes = 0  # delete commands dropped: from a deposed leader
        self.last_ok_at = 0.0
        self.last_error = ""
        self.need_full = True
        self._corrupt: list[str] = []
        self._reports: list[ReplicationReport] = []
        self._copies: dict[tuple[str, str], asyncio.Task[None]] = {}  # (blob or batch, target)
        self._sem = asyncio.Semaphore(max(1, s.copies_max))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beating = False  # a beat that moves on needs no beat after it

    @property
    def url(self) -> str:
        """Where the next beat goes (the master that answered last, of a master set)."""
        m = self.node.masters
        return m.current + PATH if m is not None else ""

    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        if self.node.masters is not None:
            self.node.masters.on_switch = self.moved
        timed = True
        due = loop.time()
        while True:
            started = loop.time()
            self._nudge.clear()
            ok = await self.beat(timed=timed)
            backoff = 2 ** min(self.consecutive_failures, 2)
            # a fixed rate, not a fixed pause: a slow beat (a busy master) must not stretch
            # the period past what the master counts as a missed beat
            if timed or not ok:
                due = started + self.interval_s * (1 if ok else backoff)
            if not ok and self._failing_over():
                due = min(due, started + FAILOVER_RETRY_S)
            if not ok:
                await asyncio.sleep(max(0.0, due - loop.time()))
                timed = True
                continue
            timed = await self._wait(due - loop.time())
            if not timed:  # copies finished: report them soon, but not in a tight loop
                await asyncio.sleep(max(0.0, started + NUDGE_GAP_S - loop.time()))
                timed = loop.time() >= due

    def _failing_over(self) -> bool:
        m = self.node.masters
        return (m is not None and m.several
                and self.consecutive_failures <= FAILOVER_TRIES)

    def moved(self) -> None:
        """The node's requests to the master moved to another address (a standby named
        a new leader, or the old one could not be reached): beat now, so the master that
        leads hears from this node before it has to place payloads. Thread-safe."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and not self._beating:
            loop.call_soon_threadsafe(self._nudge.set)

    async def _wait(self, delay: float) -> bool:
        """Sleep `delay` seconds or until a copy finished; True when the time ran out."""
        try:
            async with asyncio.timeout(max(0.0, delay)):
                await self._nudge.wait()
            return False
        except TimeoutError:
            return True

    async def stop(self) -> None:
        for t in self._copies.values():
            t.cancel()
        for t in list(self._copies.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def build(self, timed: bool = True) -> HeartbeatRequest:
        node, store = self.node, self.node.store
        every = max(1, node.settings.full_report_every)
        full = self.need_full or (timed and self.timed % every == 0)
        # before the inventory: see Journal
        added, added_sizes, deleted, corrupt = store.journal.take_sized()
        self._corrupt += corrupt
        space = await store.run(store.space)
        ids, sizes = await store.run(store.inventory) if full else ([], [])
        reports = self._reports[:REPORTS_PER_BEAT]
        self._reports = self._reports[REPORTS_PER_BEAT:]
        if self._reports:
            self._nudge.set()  # the rest go in an early beat
        return HeartbeatRequest(
            node_id=node.node_id, address=node.address, started_at=node.started_at,
            seq=self.seq, capacity_bytes=space.capacity_bytes, used_bytes=space.used_bytes,
            free_bytes=space.free_bytes, blob_count=space.blob_count, full=full,
            blob_ids=ids, blob_sizes=sizes, added=[] if full else added,
            added_sizes=[] if full else added_sizes, deleted=[] if full else deleted,
            corrupt=list(self._corrupt), replicated=reports)

    async def beat(self, timed: bool = True) -> bool:
        """One heartbeat and its commands; True when the master answered. `timed`: a beat
        on the regular schedule (else an early one reporting finished copies)."""
        req = await self.build(timed)
        self._beating = True
        try:
            peers, masters = self.node.peers, self.node.masters
            if peers is None or masters is None:
                raise RuntimeError("the node's HTTP client is not open, or it has no master")
            r = await masterlink.post(
                peers, masters, PATH, orjson.dumps(req.model_dump()),
                {"Content-Type": "application/json", "Authorization": "Bearer "
                 + (self.node.settings.node_credential
                    or self.node.node_token("heartbeat", [self.node.node_id]))},
                connect_timeout=CONNECT_S, timeout=TIMEOUT_S)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            body = orjson.loads(r.content)
            if not isinstance(body, dict):
                raise ValueError("answer is not a JSON object")
        except Exception as e:
            self._failed(req, e)
            return False
        finally:
            self._beating = False
        self.seq += 1
        self.beats += 1
        if timed:
            self.timed += 1
        else:
            self.nudged += 1
        self.consecutive_failures = 0
        self.last_ok_at = self.node.clock.now()
        self.need_full = bool(body.get("full_report"))
        revoked = body.get("revoked")
        if isinstance(revoked, list):  # the master's revocation list, whole every beat
            self.node.revoked = frozenset(str(x) for x in revoked[:MAX_REVOKED])
        del self._corrupt[:len(req.corrupt)]
        commands = self.admit(body)
        await self.keep_epoch()
        await self.execute(commands)
        return True

    async def keep_epoch(self) -> None:
        """Make a risen epoch durable before the answer's commands run (a failure is
        logged and retried with the next answer; the deletes of the newest epoch are safe
        to run meanwhile)."""
        epoch = self.epoch
        if epoch <= self.saved_epoch:
            return
        try:
            await asyncio.to_thread(save_epoch, self.epoch_path, epoch)
        except OSError as e:
            log.warning("could not keep master epoch %d in %s: %s", epoch, self.epoch_path, e)
            return
        self.saved_epoch = max(self.saved_epoch, epoch)

    def admit(self, body: dict[str, Any]) -> list[Any]:
        """The answer's commands, without its deletes when it comes from a master-set
        epoch below the highest this node has seen: a deposed leader's view of which
        blobs are unreferenced may be stale (docs/decisions/0026)."""
        commands = body.get("commands") or []
        if not isinstance(commands, list):
            return []
        epoch = body.get("epoch", 0)
        epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0
        if epoch >= self.epoch:
            self.epoch = epoch
            return commands
        kept = [c for c in commands if not (isinstance(c, dict) and c.get("op") == "delete")]
        if len(kept) < len(commands):
            self.fenced_deletes += len(commands) - len(kept)
            log.warning("ignoring %d delete command(s) from master epoch %d: this node has "
                        "seen epoch %d", len(commands) - len(kept), epoch, self.epoch)
        return kept

    def _failed(self, req: HeartbeatRequest, e: Exception) -> None:
        self.failures += 1
        self.consecutive_failures += 1
        self.need_full = True  # the deltas taken for this beat are covered by a full report
        self._reports = (req.replicated + self._reports)[-MAX_PENDING_REPORTS:]
        self.last_error = f"{type(e).__name__}: {e}"
        level = logging.WARNING if self.consecutive_failures <= 3 else logging.DEBUG
        log.log(level, "heartbeat to %s failed (%d in a row): %s", self.url,
                self.consecutive_failures, self.last_error)

    async def execute(self, commands: list[Any]) -> None:
        doomed: list[str] = []  # every delete of this answer: one transaction per 1000 ids
        for raw in commands if isinstance(commands, list) else []:
            try:
                cmd = _COMMAND.validate_python(raw)
            except ValidationError as e:
                log.warning("skipping a command this node does not understand: %.200r (%s)",
                            raw, e.errors()[:1])
                continue
            self.commands_run += 1
            if isinstance(cmd, DeleteCommand):
                doomed += cmd.blob_ids
            elif isinstance(cmd, ReplicateCommand | ReplicateBatchCommand):
                self._start_copy(cmd)
        if doomed:
            await self._delete(list(dict.fromkeys(doomed)))

    async def _delete(self, ids: list[str]) -> None:
        for i in range(0, len(ids), DELETE_TXN_IDS):
            try:
                await self.node.store.delete(ids[i:i + DELETE_TXN_IDS])
            except Exception as e:
                log.warning("delete command failed (retried when the master asks again): %s",
                            e)

    def _start_copy(self, cmd: ReplicateCommand | ReplicateBatchCommand) -> None:
        first = cmd.blob_id if isinstance(cmd, ReplicateCommand) else \
            f"{cmd.blob_ids[0]}+{len(cmd.blob_ids) - 1}"
        key = (first, cmd.target.rstrip("/"))
        running = self._copies.get(key)
        if running is not None and not running.done():
            return
        self._copies[key] = asyncio.create_task(self._copy(cmd, key))

    async def _copy(self, cmd: ReplicateCommand | ReplicateBatchCommand,
                    key: tuple[str, str]) -> None:
        ids = [cmd.blob_id] if isinstance(cmd, ReplicateCommand) else cmd.blob_ids
        try:
            async with self._sem:
                try:
                    if isinstance(cmd, ReplicateCommand):
                        reps = [await copy_blob(self.node, cmd.blob_id, cmd.target, cmd.token)]
                    else:
                        reps = await copy_batch(self.node, cmd.blob_ids, cmd.target, cmd.token)
                except Exception as e:
                    reps = [ReplicationReport(blob_id=b, target=key[1], ok=False,
                                              error=f"{type(e).__name__}: {e}") for b in ids]
            bad = [r for r in reps if not r.ok]
            if bad:
                log.warning("replicating %d of %d blob(s) to %s failed, e.g. %s: %s",
                            len(bad), len(reps), key[1], bad[0].blob_id, bad[0].error)
            self._reports.extend(reps)
            del self._reports[:-MAX_PENDING_REPORTS]
        finally:
            if self._copies.get(key) is asyncio.current_task():
                del self._copies[key]
            self._nudge.set()

    async def idle(self) -> None:
        """Wait for the replicate commands in flight (tests)."""
        while self._copies:
            await asyncio.gather(*self._copies.values(), return_exceptions=True)
