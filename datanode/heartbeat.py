"""The data node's heartbeat to the master, and the commands it brings back.

Every ``heartbeat_interval_s`` (first beat at once) the node POSTs a
:class:`~squall.common.cluster.HeartbeatRequest` to ``{master}/v1/nodes/heartbeat`` with
``Authorization: Bearer <heartbeat token>`` (op ``heartbeat``, scoped to its node id, signed
with the cluster key). See ``common/cluster.py`` for the fields: space, blob count, an
incremental block report (added / deleted since the last good beat), a full inventory on
the first beat, after a failed one, every ``full_report_every`` beats and when the master
asks; corrupt replicas dropped; outcomes of replicate commands.

A failed beat (master down, slow, 5xx, bad answer) never stops the node: it is logged, the
next beat is a full report (so no delta is lost), corrupt and replication reports are kept
for it, and the interval backs off (doubling, at most 4x) until the master answers again.

Commands in the answer run here: ``delete`` at once (all of an answer's deletes together,
one transaction and one sync per 1000 ids), ``replicate`` as background copies
(at most ``copies_max`` at a time, one per blob and target) whose outcome goes into the
next beats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx
import orjson
from pydantic import TypeAdapter, ValidationError

from squall.common.cluster import (
    Command,
    DeleteCommand,
    HeartbeatRequest,
    ReplicateCommand,
    ReplicationReport,
)
from squall.datanode.replication import copy_blob
from squall.datanode.service import DataNode

log = logging.getLogger("squall.datanode.heartbeat")
_COMMAND: TypeAdapter[Command] = TypeAdapter(Command)
MAX_PENDING_REPORTS = 10_000
DELETE_TXN_IDS = 1000
MAX_REVOKED = 100_000


class Heartbeat:
    def __init__(self, node: DataNode) -> None:
        self.node = node
        s = node.settings
        self.interval_s = s.heartbeat_interval_s
        self.url = (s.master_url.rstrip("/") + "/v1/nodes/heartbeat") if s.master_url else ""
        self.seq = 0
        self.beats = self.failures = self.consecutive_failures = 0
        self.commands_run = 0
        self.last_ok_at = 0.0
        self.last_error = ""
        self.need_full = True
        self._corrupt: list[str] = []
        self._reports: list[ReplicationReport] = []
        self._copies: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._sem = asyncio.Semaphore(max(1, s.copies_max))
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=2.0),
                                         verify=s.tls.client_context())

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            ok = await self.beat()
            backoff = 2 ** min(self.consecutive_failures, 2)
            # a fixed rate, not a fixed pause: a slow beat (a busy master) must not stretch
            # the period past what the master counts as a missed beat
            took = loop.time() - started
            await asyncio.sleep(max(0.0, self.interval_s * (1 if ok else backoff) - took))

    async def stop(self) -> None:
        for t in self._copies.values():
            t.cancel()
        for t in list(self._copies.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self._client.aclose()

    async def build(self) -> HeartbeatRequest:
        node, store = self.node, self.node.store
        full = self.need_full or self.seq % max(1, node.settings.full_report_every) == 0
        added, deleted, corrupt = store.journal.take()  # before the inventory: see Journal
        self._corrupt += corrupt
        space = await store.run(store.space)
        ids = await store.run(store.all_ids) if full else []
        reports, self._reports = self._reports, []
        return HeartbeatRequest(
            node_id=node.node_id, address=node.address, started_at=node.started_at,
            seq=self.seq, capacity_bytes=space.capacity_bytes, used_bytes=space.used_bytes,
            free_bytes=space.free_bytes, blob_count=space.blob_count, full=full,
            blob_ids=ids, added=[] if full else added, deleted=[] if full else deleted,
            corrupt=list(self._corrupt), replicated=reports)

    async def beat(self) -> bool:
        """One heartbeat and its commands; True when the master answered."""
        req = await self.build()
        try:
            r = await self._client.post(
                self.url, content=orjson.dumps(req.model_dump()),
                headers={"Content-Type": "application/json", "Authorization": "Bearer "
                         + (self.node.settings.node_credential
                            or self.node.node_token("heartbeat", [self.node.node_id]))})
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            body = orjson.loads(r.content)
            if not isinstance(body, dict):
                raise ValueError("answer is not a JSON object")
        except Exception as e:
            self._failed(req, e)
            return False
        self.seq += 1
        self.beats += 1
        self.consecutive_failures = 0
        self.last_ok_at = self.node.clock.now()
        self.need_full = bool(body.get("full_report"))
        revoked = body.get("revoked")
        if isinstance(revoked, list):  # the master's revocation list, whole every beat
            self.node.revoked = frozenset(str(x) for x in revoked[:MAX_REVOKED])
        del self._corrupt[:len(req.corrupt)]
        await self.execute(body.get("commands") or [])
        return True

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
            elif isinstance(cmd, ReplicateCommand):
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

    def _start_copy(self, cmd: ReplicateCommand) -> None:
        key = (cmd.blob_id, cmd.target.rstrip("/"))
        running = self._copies.get(key)
        if running is not None and not running.done():
            return
        self._copies[key] = asyncio.create_task(self._copy(cmd, key))

    async def _copy(self, cmd: ReplicateCommand, key: tuple[str, str]) -> None:
        try:
            async with self._sem:
                try:
                    rep = await copy_blob(self.node, cmd.blob_id, cmd.target, cmd.token)
                except Exception as e:
                    rep = ReplicationReport(blob_id=cmd.blob_id, target=key[1], ok=False,
                                            error=f"{type(e).__name__}: {e}")
            if not rep.ok:
                log.warning("replicating %s to %s failed: %s", cmd.blob_id, key[1], rep.error)
            self._reports.append(rep)
            del self._reports[:-MAX_PENDING_REPORTS]
        finally:
            if self._copies.get(key) is asyncio.current_task():
                del self._copies[key]

    async def idle(self) -> None:
        """Wait for the replicate commands in flight (tests)."""
        while self._copies:
            await asyncio.gather(*self._copies.values(), return_exceptions=True)
