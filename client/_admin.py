"""The admin and inspection verbs of the protocol core (queues, stats, tasks, policies,
schedules, data nodes, credentials), mixed into ``Core``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from squall.client._effects import Emit, Proto
from squall.client._paths import node_path, pid_segment, policy_path, qpath, schedule_path
from squall.common.errors import NotFound
from squall.common.wire.models import (
    CancelResponse,
    ClusterInfo,
    ClusterStats,
    DeleteResponse,
    ForgetResponse,
    NodeStatus,
    PauseState,
    Policy,
    QueueCounts,
    QueueStats,
    RedriveResponse,
    ResetResponse,
    Schedule,
    ScheduleInfo,
    TaskInfo,
)
from squall.common.wire.names import split_queue


class AdminVerbs:
    if TYPE_CHECKING:
        def _call(self, method: str, url: str, json: Any = None, *, idempotent: bool = True,
                  params: dict[str, str] | None = None) -> Proto[Any]: ...

    def queues(self, regex: str | None, group: str | None, min_tasks: int, limit: int
               ) -> Proto[list[QueueCounts]]:
        out: list[QueueCounts] = []
        after: str | None = None
        while len(out) < limit:
            params = {"min_tasks": str(min_tasks), "limit": str(min(limit - len(out), 10_000))}
            for k, v in (("regex", regex), ("group", group), ("after", after)):
                if v is not None:
                    params[k] = v
            ans = yield from self._call("GET", "/v1/queues", params=params)
            out += [QueueCounts.model_validate(q) for q in ans["queues"]]
            after = ans.get("next")
            if not after:
                break
        return out

    def stats(self, queue: str | None) -> Proto[QueueStats | ClusterStats]:
        if queue is None:
            return ClusterStats.model_validate((yield from self._call("GET", "/v1/cluster/stats")))
        ans = yield from self._call("GET", qpath(queue)[2])
        return QueueStats.model_validate(ans)

    def task(self, queue: str, pid: str) -> Proto[TaskInfo]:
        group, _, path = qpath(queue)
        ans = yield from self._call("GET", f"{path}/tasks/{pid_segment(pid)}")
        return _info(ans, group)

    def cancel(self, queue: str, pid: str) -> Proto[CancelResponse]:
        """Remove a queued (available or delayed) task without leasing it."""
        ans = yield from self._call("DELETE", f"{qpath(queue)[2]}/tasks/{pid_segment(pid)}",
                                    idempotent=False)
        return CancelResponse.model_validate(ans)

    def _task_page(self, queue: str, after: str | None, n: int
                   ) -> Proto[tuple[list[TaskInfo], str | None]]:
        params = {"limit": str(n)}
        if after is not None:
            params["after"] = after
        ans = yield from self._call("GET", qpath(queue)[2] + "/tasks", params=params)
        return [_info(t, qpath(queue)[0]) for t in ans["tasks"]], ans.get("next")

    def tasks(self, queue: str, after: str | None, limit: int) -> Proto[list[TaskInfo]]:
        """Up to `limit` of a queue's tasks in pid order, after pid `after`."""
        out: list[TaskInfo] = []
        while len(out) < limit:
            page, after = yield from self._task_page(queue, after, min(1000, limit - len(out)))
            out += page
            if not after or not page:
                break
        return out

    def iter_tasks(self, queue: str, after: str | None) -> Proto[None]:
        """Emit every task of a queue in pid order, a page at a time."""
        while True:
            page, after = yield from self._task_page(queue, after, 1000)
            for t in page:
                yield Emit(t)
            if not after or not page:
                return

    def dead_letters(self, queue: str, limit: int) -> Proto[list[TaskInfo]]:
        dlq = yield from self.dead_letter_queue(queue)
        try:
            return (yield from self.tasks(dlq, None, limit))
        except NotFound:
            return []

    def delete(self, queue: str) -> Proto[DeleteResponse]:
        ans = yield from self._call("DELETE", qpath(queue)[2], idempotent=False)
        return DeleteResponse.model_validate(ans)

    def reset_leases(self, queue: str) -> Proto[ResetResponse]:
        ans = yield from self._call("POST", qpath(queue)[2] + "/reset-leases",
                                    idempotent=False)
        return ResetResponse.model_validate(ans)

    def pause(self, queue: str, key: str | None, paused: bool) -> Proto[PauseState]:
        ans = yield from self._call("POST", qpath(queue)[2] + ("/pause" if paused
                                                               else "/resume"),
                                    {"key": key} if key is not None else {})
        return PauseState.model_validate(ans)

    def pause_state(self, queue: str) -> Proto[PauseState]:
        return PauseState.model_validate((yield from self._call("GET", qpath(queue)[2]
                                                                + "/pause")))

    def redrive(self, queue: str, max_tasks: int) -> Proto[RedriveResponse]:
        ans = yield from self._call("POST", qpath(queue)[2] + "/redrive",
                                    {"max_tasks": max_tasks}, idempotent=False)
        return RedriveResponse.model_validate(ans)

    def dead_letter_queue(self, queue: str) -> Proto[str]:
        """``group#name`` of the queue's dead-letter queue (its policy's, else name.dead)."""
        group, name, _ = qpath(queue)
        pol = yield from self.policy(queue)
        return f"{group}#{pol.dead_letter_queue or name + '.dead'}"

    def policy(self, target: str) -> Proto[Policy]:
        """``group#name``: the queue's effective policy; ``group#``: the group default."""
        return Policy.model_validate((yield from self._call("GET", policy_path(target))))

    def set_policy(self, target: str, policy: Policy | None) -> Proto[Policy]:
        if policy is None:
            ans = yield from self._call("DELETE", policy_path(target))
        else:
            ans = yield from self._call("PUT", policy_path(target),
                                        policy.model_dump(exclude_none=True))
        return Policy.model_validate(ans)

    def schedules(self, group: str) -> Proto[list[ScheduleInfo]]:
        g = split_queue(f"{group}#x")[0]
        ans = yield from self._call("GET", f"/v1/groups/{g}/schedules")
        return [ScheduleInfo.model_validate(s) for s in ans["schedules"]]

    def set_schedule(self, name: str, schedule: Schedule) -> Proto[ScheduleInfo]:
        """`name` is ``group#schedule``; the schedule's queue is a name in that group."""
        ans = yield from self._call("PUT", schedule_path(name),
                                    schedule.model_dump(exclude_none=True))
        return ScheduleInfo.model_validate(ans)

    def delete_schedule(self, name: str) -> Proto[None]:
        yield from self._call("DELETE", schedule_path(name), idempotent=False)

    def cluster(self) -> Proto[ClusterInfo]:
        return ClusterInfo.model_validate((yield from self._call("GET", "/v1/cluster")))

    def node(self, node_id: str) -> Proto[NodeStatus]:
        return NodeStatus.model_validate((yield from self._call("GET", node_path(node_id))))

    def decommission(self, node_id: str, cancel: bool = False) -> Proto[NodeStatus]:
        ans = yield from self._call("DELETE" if cancel else "POST",
                                    node_path(node_id) + "/decommission")
        return NodeStatus.model_validate(ans)

    def forget(self, node_id: str) -> Proto[ForgetResponse]:
        # not retried: a retry of a forget that went through would answer 404
        ans = yield from self._call("DELETE", node_path(node_id), idempotent=False)
        return ForgetResponse.model_validate(ans)

    def overview(self) -> Proto[dict[str, Any]]:
        # the dashboard's front page without its queue rows and history: cluster health,
        # WAL state, totals and (on a master set) the set's members, leader, epoch, lags
        ans: dict[str, Any] = yield from self._call(
            "GET", "/v1/overview", params={"limit": "1", "since": "1e18"})
        return ans

    def ready(self) -> Proto[dict[str, Any]]:
        ans: dict[str, Any] = yield from self._call("GET", "/readyz")
        return ans

    # -- credentials (admin) -------------------------------------------------------------
    def mint_credential(self, roles: Iterable[str], groups: Iterable[str] | None,
                        node: str | None, ttl_secs: float, note: str, sqs: bool = False,
                        sqs_key: tuple[str, str] | None = None) -> Proto[dict[str, Any]]:
        body: dict[str, Any] = {"roles": list(roles), "ttl_secs": ttl_secs, "note": note}
        if groups is not None:
            body["groups"] = list(groups)
        if node is not None:
            body["node"] = node
        if sqs_key is not None:
            body["access_key_id"], body["secret_access_key"] = sqs_key
        path = "/v1/auth/sqs-keys" if sqs or sqs_key else "/v1/auth/credentials"
        ans: dict[str, Any] = yield from self._call("POST", path, body, idempotent=False)
        return ans

    def credentials(self) -> Proto[list[dict[str, Any]]]:
        ans = yield from self._call("GET", "/v1/auth/credentials")
        return list(ans["credentials"])

    def revoke_credential(self, cred_id: str) -> Proto[dict[str, Any]]:
        ans: dict[str, Any] = yield from self._call("DELETE", f"/v1/auth/credentials/{cred_id}")
        return ans


def _info(ans: dict[str, Any], group: str) -> TaskInfo:
    """A TaskInfo with its queue as ``group#name``, like every other answer of the client."""
    ans["queue"] = f"{group}#{ans['queue']}"
    return TaskInfo.model_validate(ans)
