"""The payload verbs of the protocol core (mixed into ``_protocol.Core``): one payload,
many payloads with batch reads, streamed reads, and refreshing a task's replica list from
the master when the one its lease answer named has gone stale (SeaweedFS's clients drop
cached locations on failure the same way)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from squall.client._blobs import BATCH_BLOB_BYTES
from squall.client._effects import Proto
from squall.client._tasks import TaskBase
from squall.common.errors import NotFound, SquallError, TransportError, Unavailable

if TYPE_CHECKING:
    from squall.client._blobs import Blobs
    from squall.common.wire.models import TaskInfo

_STALE = (TransportError, Unavailable, NotFound)  # no listed replica could deliver


class PayloadVerbs:
    blobs: Blobs

    def task(self, queue: str, pid: str) -> Proto[TaskInfo]:
        raise NotImplementedError  # pragma: no cover - Core's

    def payload(self, task: TaskBase) -> Proto[bytes]:
        held = task._held_payload()
        if held is not None:
            return held
        assert task.payload_ref is not None
        try:
            return (yield from self.blobs.read(task.payload_ref))
        except _STALE:
            if not (yield from self._refresh(task)):
                raise
        return (yield from self.blobs.read(task.payload_ref))

    def read_payloads(self, tasks: list[TaskBase]) -> Proto[list[bytes]]:
        """Every task's payload, in order (b"" without one): the small ones with one batch
        read per data node, large ones one by one. Raises the first payload's error that
        no replica could deliver, even after asking the master where its copies are now."""
        yield from self._load(tasks, True)
        return [t._data if t._data is not None else b"" for t in tasks]

    def _load(self, tasks: list[TaskBase], strict: bool) -> Proto[None]:
        todo = [t for t in tasks if t.payload_ref is not None and t._data is None]
        small = [t for t in todo if t.size <= BATCH_BLOB_BYTES]
        if small:
            got = yield from self.blobs.read_many([t.payload_ref for t in small
                                                   if t.payload_ref is not None])
            for t, d in zip(small, got, strict=True):
                if isinstance(d, bytes):
                    t._data = d
        if not strict:
            return
        for t in todo:
            if t._data is None:
                t._data = yield from self.payload(t)

    def _refresh(self, task: TaskBase) -> Proto[bool]:
        """Ask the master where the task's payload lives now (live replicas, a fresh read
        token): a lease answer's replica list goes stale when its nodes die and the blob is
        copied elsewhere. False if the master has nothing newer."""
        try:
            info = yield from self.task(task.queue, task.pid)
        except SquallError:
            return False
        ref = info.payload
        if ref is None or task.payload_ref is None or ref.blob_id != task.payload_ref.blob_id:
            return False
        task.payload_ref = ref
        return True

    def iter_payload(self, task: TaskBase, chunk_bytes: int) -> Proto[None]:
        if task.payload_ref is not None:
            yield from self.blobs.iter_read(task.payload_ref, chunk_bytes)
