"""The WAL record body that applying a plan builds (ops.apply) is exactly msgpack of its ops,
whatever ops a request makes: new queue, enqueue with and without payload, lease, dequeue,
release, renew, dead letter, idempotency key, a raised high-water mark."""

from __future__ import annotations

from typing import Any

import msgpack

from squall.common.clock import ManualClock
from squall.common.wire.models import (
    EnqueueItem,
    LeaseRequest,
    PayloadRef,
    Policy,
    ReleaseItem,
    RenewItem,
    TaskRef,
    TaskSpec,
    UpdateLease,
    UpdateRequest,
)
from squall.master import service
from squall.master.service import Master, MasterSettings
from squall.master.storage import ops as ops_mod
from squall.master.storage.walfile import read_records


async def test_wal_bodies_are_msgpack_of_their_ops(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[tuple[list[Any], bytes]] = []

    def spy(index: Any, txn: Any, ops: Any, ticket: int) -> bytes:
        body = ops_mod.apply(index, txn, ops, ticket)
        seen.append((list(ops), body))
        return body

    monkeypatch.setattr(service, "apply", spy)
    m = Master(MasterSettings(data_dir=str(tmp_path), require_receipts=False),
               ManualClock(1_700_000_000.0))
    try:
        ref = PayloadRef(blob_id="b1", size=3, crc32c=7)
        await m.enqueue("g", "q", [TaskSpec(pid=f"p{i:03d}") for i in range(40)]
                        + [TaskSpec(), TaskSpec(pid="z", payload=ref, delay_secs=5),
                           TaskSpec(pid="k", idempotency_key="key-1")])
        await m.set_policy("g", "q", Policy(max_attempts=1))
        got = (await m.lease("g", "q", LeaseRequest(max_tasks=30, lease_secs=30), "a"))["tasks"]
        refs = [TaskRef(queue="q", pid=t["pid"], token=t["token"]) for t in got]
        await m.update("g", UpdateRequest(
            dequeue=refs[:10],
            renew=[RenewItem(queue="q", pid=r.pid, token=r.token) for r in refs[10:20]],
            release=[ReleaseItem(queue="q", pid=r.pid, token=r.token, error="boom")
                     for r in refs[20:]],  # max_attempts 1: to the dead-letter queue
            enqueue=[EnqueueItem(queue="other", pid="o1")],
            lease=UpdateLease(queue="q", max_tasks=5)), "a")
    finally:
        m.close()
    records, _ = read_records(str(tmp_path / "wal"))
    assert [body for _, body in records] == [body for _, body in seen]
    for ops, body in seen:
        assert body == msgpack.packb(ops)
    kinds = {op[0] for ops, _ in seen for op in ops}
    assert {"Q", "P", "D", "M", "K", "C"} <= kinds
    assert any(len(ops) > 15 for ops, _ in seen)  # an array16 header
