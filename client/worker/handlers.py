"""What a handler is to the worker: sync or async, the error text kept when it raises, and
its return value read as follow-up tasks."""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable
from typing import Any

from squall.client._tasks import NewTask, TaskBase
from squall.common.wire.names import split_queue

Handler = Callable[[Any], Any]


def is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None))  # noqa: B004 - callable objects


HEAD_MAX = 1000  # characters of the first line (`Type: message`)


def describe_error(e: BaseException, limit: int = 4000) -> str:
    """The reason kept with a failed task: `Type: message` first (what a listing of dead
    letters, the CLI and the dashboard show as one line), then the traceback below it,
    cut from the top to fit `limit` characters (its last frames are the useful ones)."""
    only = "".join(traceback.format_exception_only(type(e), e)).strip() or type(e).__name__
    head = " ".join(only.split("\n")[0].split())[:HEAD_MAX]
    text = "".join(traceback.format_exception(e)).rstrip("\n")
    room = limit - len(head) - 1
    if len(text) > room:
        text = "…" + text[-(room - 1):] if room > 1 else ""
    return head + "\n" + text if text else head


def followups(task: TaskBase, result: Any) -> list[NewTask]:
    """A handler's return value as follow-up tasks: None, a NewTask, a (queue, payload)
    tuple, or a list of those. Queues are in the task's group (atomic with its dequeue)."""
    if result is None:
        return []
    items = [result] if isinstance(result, NewTask | tuple) else list(result)
    out = []
    for r in items:
        if isinstance(r, tuple):
            r = NewTask(r[1] if len(r) > 1 else None, queue=r[0])
        if not isinstance(r, NewTask) or not r.queue:
            raise TypeError("a handler returns None, NewTask(queue=...), (queue, payload) or a "
                            f"list of those, not {r!r}")
        if "#" in r.queue and split_queue(r.queue)[0] != task.group:
            raise ValueError(f"follow-up queue {r.queue} is not in group {task.group!r}: only "
                             "queues of the task's group can be updated atomically with it")
        out.append(r)
    return out
