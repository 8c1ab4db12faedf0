"""The REST paths the client's verbs call, built from checked names."""

from __future__ import annotations

from urllib.parse import quote

from squall.common.errors import BadRequest
from squall.common.wire.names import split_queue


def qpath(queue: str) -> tuple[str, str, str]:
    """(group, name, the queue's path) of ``group#name``."""
    group, name = split_queue(queue)
    return group, name, f"/v1/groups/{group}/queues/{name}"


def pid_segment(pid: str) -> str:
    """`pid` as one URL path segment: every reserved character percent-encoded, and the
    dot segments ``.`` and ``..`` too (else URL normalisation would turn ``/tasks/..``
    into a different path)."""
    seg = quote(pid, safe="")
    return seg.replace(".", "%2E") if seg in (".", "..") else seg


def node_path(node_id: str) -> str:
    if not node_id or len(node_id) > 128:
        raise BadRequest("a data node id is 1 to 128 characters (`squall nodes` lists them)")
    return "/v1/nodes/" + quote(node_id, safe="")


def policy_path(target: str) -> str:
    if target.endswith("#"):
        return f"/v1/groups/{split_queue(target + 'x')[0]}/policy"
    return qpath(target)[2] + "/policy"


def schedule_path(name: str) -> str:
    group, sname = split_queue(name)
    return f"/v1/groups/{group}/schedules/{sname}"
