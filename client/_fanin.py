"""The batch verbs of the protocol core (fan-in: members and a callback), mixed into
``Core``. A batch is named ``group#id`` like a queue."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from squall.client import _trace
from squall.client._effects import Proto
from squall.client._tasks import NewTask, fifo_pid
from squall.common.errors import BadRequest
from squall.common.wire.models import MAX_BATCH, BatchInfo, BatchResponse
from squall.common.wire.names import split_queue

RESULTS_PAGE = 1000


def batch_path(batch: str) -> str:
    """The path of batch ``group#id``."""
    group, bid = split_queue(batch)
    return f"/v1/groups/{group}/batches/{bid}"


def _queue_in(group: str | None, queue: str | None, what: str) -> tuple[str, str]:
    if not queue:
        raise BadRequest(f"{what} needs a queue (NewTask(queue=...))")
    g, name = split_queue(queue) if ("#" in queue or group is None) else (group, queue)
    if group is not None and g != group:
        raise BadRequest(f"{what}: queue {queue} is not in group {group!r}: a batch's "
                         "members and callbacks are in one group")
    return g, name


class FaninVerbs:
    if TYPE_CHECKING:
        def _call(self, method: str, url: str, json: Any = None, *, idempotent: bool = True,
                  params: dict[str, str] | None = None) -> Proto[Any]: ...

        def _prepare(self, tasks: list[NewTask], generated: set[str],
                     specs: list[dict[str, Any]] | None = None,
                     sources: list[Any] | None = None) -> Proto[list[dict[str, Any]]]: ...

    def batch(self, tasks: list[NewTask], callback: NewTask,
              error_callback: NewTask | None = None, on_dead: str = "fail",
              batch_id: str | None = None) -> Proto[BatchResponse]:
        """Create a batch (see ``Client.batch``); the answer's ``batch`` is ``group#id``."""
        if len(tasks) > MAX_BATCH:
            raise BadRequest(f"a batch is created with at most {MAX_BATCH} members; add more "
                             "with put(..., batch=...) from a member")
        group, _ = _queue_in(None, callback.queue, "the callback")
        everyone = [*tasks, callback, *([error_callback] if error_callback else [])]
        names = [_queue_in(group, t.queue, "a member")[1] for t in everyone]
        n = len(tasks)
        specs = yield from self._prepare(everyone[:n], set())  # allocations of <= 1,000
        specs += yield from self._prepare(everyone[n:], set())
        for spec, name in zip(specs, names, strict=True):
            spec["queue"] = name
        body: dict[str, Any] = {"id": batch_id or "b" + fifo_pid(), "tasks": specs[:n],
                                "callback": specs[n], "on_dead": on_dead}
        if error_callback is not None:
            body["error_callback"] = specs[n + 1]
        tp, ts = _trace.current()
        if tp is not None:
            body["traceparent"] = tp
            if ts is not None:
                body["tracestate"] = ts
        # not resent on a lost answer: a resend of an applied create is a 409
        ans = yield from self._call("POST", f"/v1/groups/{group}/batches", body,
                                    idempotent=False)
        ans["batch"] = f"{group}#{ans['batch']}"
        return BatchResponse.model_validate(ans)

    def batch_info(self, batch: str) -> Proto[BatchInfo]:
        return BatchInfo.model_validate((yield from self._call("GET", batch_path(batch))))

    def batch_results(self, batch: str) -> Proto[dict[tuple[str, str], Any]]:
        """Every result of the batch's members, by (queue, pid), JSON-decoded (a result
        that is not JSON stays text)."""
        out: dict[tuple[str, str], Any] = {}
        params = {"limit": str(RESULTS_PAGE)}
        while True:
            ans = yield from self._call("GET", batch_path(batch) + "/results", params=params)
            for r in ans["results"]:
                try:
                    value = json.loads(r["result"])
                except ValueError:
                    value = r["result"]
                out[(r["queue"], r["pid"])] = value
            if not ans.get("next"):
                return out
            params["after"] = ans["next"]

    def list_batches(self, group: str) -> Proto[list[BatchInfo]]:
        out: list[BatchInfo] = []
        params = {"limit": "1000"}
        while True:
            ans = yield from self._call("GET", f"/v1/groups/{group}/batches", params=params)
            out += [BatchInfo.model_validate(b) for b in ans["batches"]]
            if not ans.get("next") or len(out) >= 100_000:
                return out
            params["after"] = ans["next"]

    def delete_batch(self, batch: str) -> Proto[None]:
        yield from self._call("DELETE", batch_path(batch))
        return None
