"""The endpoint's calls to the master, made on the caller's behalf with the short-lived
squall credential the master handed out with its access key (``keys.py``), so the master
applies the caller's roles and groups itself. Leasing (``lease``) is in this one place so
it can move to a data-node lease-on-behalf function without touching the actions.

Errors come back as SQS errors: 401 InvalidClientTokenId, 403 AccessDenied, 404
QueueDoesNotExist, 409 (a stale lease) MessageNotInflight, 400/413/422
InvalidParameterValue, anything else ServiceUnavailable (a refused write changed nothing;
``outcome_unknown`` is said as such)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import orjson

from squall.common.wire.models import MAX_WAIT_SECS
from squall.datanode import masterlink
from squall.datanode.replication.peers import PeerUnreachable
from squall.datanode.sqs.errors import SqsError

if TYPE_CHECKING:
    from squall.datanode.service import DataNode

LEASE_SLACK_S = 30.0  # a waiting lease's answer may take this much longer than its wait


class Upstream:
    """The master, as one caller (`credential`) sees it."""

    def __init__(self, node: DataNode, credential: str) -> None:
        self.node = node
        self.credential = credential

    async def call(self, method: str, path: str, body: Any = None, *,
                   query: dict[str, Any] | None = None, replay: bool = False,
                   timeout: float | None = None, missing: str | None = None) -> Any:
        if self.node.masters is None:
            raise SqsError("ServiceUnavailable", "this data node has no master")
        assert self.node.peers is not None
        url = path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        headers = {"Authorization": "Bearer " + self.credential}
        content = None
        if body is not None:
            content = orjson.dumps(body)
            headers["Content-Type"] = "application/json"
        try:
            r = await masterlink.request(self.node.peers, self.node.masters, method, url,
                                         content, headers, replay=replay, timeout=timeout)
        except PeerUnreachable as e:
            raise SqsError("ServiceUnavailable", f"the master is unreachable ({e}); "
                           + ("the outcome is unknown: retry" if e.sent else
                              "nothing was applied, retry")) from None
        if r.status_code < 400:
            try:
                return orjson.loads(r.content) if r.content else {}
            except orjson.JSONDecodeError:
                raise SqsError("ServiceUnavailable", "the master's answer did not parse; "
                               "the outcome is unknown: retry") from None
        raise _refusal(r.status_code, r.content, missing)

    # -- tasks -----------------------------------------------------------------------------
    async def lease(self, group: str, queue: str, max_tasks: int, lease_secs: float | None,
                    wait_secs: float, worker: str) -> dict[str, Any]:
        """The master's lease on the caller's behalf: {"tasks": [...], "read_token"}."""
        body: dict[str, Any] = {"max_tasks": max_tasks, "worker": worker}
        if lease_secs is not None:
            body["lease_secs"] = lease_secs
        if wait_secs > 0:
            body["wait_secs"] = min(wait_secs, MAX_WAIT_SECS)
        timeout = max(self.node.settings.peer_timeout_s, wait_secs + LEASE_SLACK_S)
        res: dict[str, Any] = await self.call(
            "POST", f"/v1/groups/{_q(group)}/queues/{_q(queue)}/lease", body, timeout=timeout,
            missing=f"The specified queue {queue} does not exist.")
        return res

    async def update(self, group: str, body: dict[str, Any]) -> dict[str, Any]:
        """Dequeue, renew or release; a task no longer there (deleted, purged) is a lease
        that is not current: MessageNotInflight, like a stale token."""
        try:
            res: dict[str, Any] = await self.call("POST", f"/v1/groups/{_q(group)}/update",
                                                  body)
        except SqsError as e:
            if e.shape == "QueueDoesNotExist":
                raise SqsError("MessageNotInflight", e.message) from None
            raise
        return res

    # -- queues ----------------------------------------------------------------------------
    async def stats(self, group: str, queue: str) -> dict[str, Any] | None:
        try:
            res: dict[str, Any] = await self.call(
                "GET", f"/v1/groups/{_q(group)}/queues/{_q(queue)}", replay=True)
        except SqsError as e:
            if e.shape == "QueueDoesNotExist":
                return None
            raise
        return res

    async def policy(self, group: str, queue: str) -> dict[str, Any]:
        res: dict[str, Any] = await self.call(
            "GET", f"/v1/groups/{_q(group)}/queues/{_q(queue)}/policy", replay=True)
        return res

    async def set_policy(self, group: str, queue: str, policy: dict[str, Any] | None) -> None:
        path = f"/v1/groups/{_q(group)}/queues/{_q(queue)}/policy"
        if policy is None:
            await self.call("DELETE", path)
        else:
            await self.call("PUT", path, policy)

    async def delete_queue(self, group: str, queue: str) -> None:
        await self.call("DELETE", f"/v1/groups/{_q(group)}/queues/{_q(queue)}")

    async def redrive(self, group: str, queue: str, max_tasks: int) -> dict[str, Any]:
        res: dict[str, Any] = await self.call(
            "POST", f"/v1/groups/{_q(group)}/queues/{_q(queue)}/redrive",
            {"max_tasks": max_tasks})
        return res

    async def queues(self, group: str, limit: int = 1000, after: str | None = None
                     ) -> dict[str, Any]:
        res: dict[str, Any] = await self.call(
            "GET", "/v1/queues", query={"group": group, "min_tasks": 0, "limit": limit,
                                        "after": after}, replay=True)
        return res


def _refusal(status: int, content: bytes, missing: str | None) -> SqsError:
    """The SQS error of a refusal of the master."""
    try:
        err = orjson.loads(content).get("error", {})
    except (orjson.JSONDecodeError, AttributeError):
        err = {}
    msg = str(err.get("message", f"HTTP {status}"))
    if status == 401:
        return SqsError("InvalidClientTokenId", msg)
    if status == 403:
        return SqsError("AccessDenied", msg)
    if status == 404:
        return SqsError("QueueDoesNotExist", missing or msg)
    if status == 409:
        return SqsError("MessageNotInflight", msg)
    if status in (400, 413, 422):
        return SqsError("InvalidParameterValue", msg)
    return SqsError("ServiceUnavailable", f"{err.get('code', status)}: {msg}")


def _q(name: str) -> str:
    return quote(name, safe="")
