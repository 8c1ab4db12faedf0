"""The master's route table: every route it serves, declared once.

A row is (method, path template, handler, response model, access rule, hot); the request
model and the parameters are the handler's signature. The app's FastAPI routes (hence the
OpenAPI document), the access rules the guard enforces, the request-metric labels and the
fast dispatcher of the hot routes all come from here (``common/server/layered.py``). The
rules' vocabulary is ``common/security/access.py``; ``docs/security.md`` lists the same
rules. A hot route is served by the fast dispatcher, through the same handler.
"""

from __future__ import annotations

from starlette.responses import Response

from squall.common.security.access import ADMIN, ADMIN_READ, MONITOR_READ, PUBLIC, READ, rule
from squall.common.server.layered import Route, RouteTable, section
from squall.common.wire.cluster import (
    AllocateResponse,
    BlockGrant,
    HeartbeatResponse,
    NodeCommitResponse,
)
from squall.common.wire.models import (
    BatchInfo,
    BatchList,
    BatchResponse,
    BatchResults,
    CancelResponse,
    ClusterInfo,
    ClusterStats,
    DeleteResponse,
    EnqueueResponse,
    ForgetResponse,
    LeaseResponse,
    NodeStatus,
    PauseState,
    Policy,
    QueueList,
    QueueStats,
    RedriveResponse,
    ResetResponse,
    RetryResponse,
    ScheduleInfo,
    ScheduleList,
    TaskInfo,
    TaskList,
    UpdateResponse,
)
from squall.master import security, sqskeys
from squall.master.http.answers import ERROR_RESPONSES
from squall.master.http.routes import (
    batches,
    config,
    frontdoor,
    ha,
    health,
    nodes,
    nodes_admin,
    queues,
    status,
    tasks,
)

G = "/v1/groups/{group}"
Q = G + "/queues/{queue}"
N = "/v1/nodes/{node_id}"
A = "/v1/auth/credentials"
R = Route
WORKER = "producer consumer"
VIEW = "producer consumer monitor"  # reads that hand out no token
# a data node's lifecycle hooks act on their own node with a node credential (scope "node")
NODE_SELF = rule("admin node", "node")
NODE_SELF_READ = rule("admin monitor node", "node", "none")

ROUTES = RouteTable([
    *section(
        "tasks",
        # the hot path; update checks the body (enqueue: producer, the rest: consumer)
        R("POST", G + "/update", tasks.update, UpdateResponse, rule(WORKER, "path"), hot=True),
        R("POST", Q + "/tasks", tasks.enqueue, EnqueueResponse, rule("producer", "path"),
          hot=True),
        R("POST", Q + "/lease", tasks.lease, LeaseResponse, rule("consumer", "path"),
          hot=True),
        # task_info hands out read tokens
        R("GET", Q + "/tasks/{pid:path}", tasks.task_info, TaskInfo,
          rule("admin", "path", "none")),
        R("DELETE", Q + "/tasks/{pid:path}", tasks.cancel_task, CancelResponse,
          rule("admin", "path", "none")),
        R("GET", Q + "/tasks", tasks.list_tasks, TaskList, rule("admin", "path", "none"))),
    *section(
        "batches",
        R("POST", G + "/batches", batches.create_batch, BatchResponse, rule("producer", "path")),
        R("GET", G + "/batches", batches.list_batches, BatchList, READ),
        R("GET", G + "/batches/{batch}", batches.get_batch, BatchInfo, READ),
        R("GET", G + "/batches/{batch}/results", batches.batch_results, BatchResults,
          rule("producer consumer", "path", "none")),  # handlers' results: not monitor's
        R("DELETE", G + "/batches/{batch}", batches.delete_batch, None,
          rule("producer", "path", "none"))),
    *section(
        "queues",
        R("GET", Q, queues.queue_stats, QueueStats, READ),
        R("DELETE", Q, queues.delete_queue, DeleteResponse, rule("admin", "path", "none")),
        R("POST", Q + "/reset-leases", queues.reset_leases, ResetResponse,
          rule("admin", "path")),
        R("POST", Q + "/redrive", queues.redrive, RedriveResponse, rule("admin", "path")),
        R("POST", Q + "/retry", queues.retry, RetryResponse, rule("admin", "path")),
        R("GET", Q + "/pause", queues.get_pause, PauseState, READ),
        R("POST", Q + "/pause", queues.pause, PauseState, rule("admin", "path")),
        R("POST", Q + "/resume", queues.resume, PauseState, rule("admin", "path")),
        R("GET", "/v1/queues", queues.list_queues, QueueList, rule(VIEW, "query", "none")),
        R("GET", "/v1/cluster/stats", queues.cluster_stats, ClusterStats,
          rule(VIEW, "all", "none"))),
    *section(
        "config",
        R("GET", G + "/policy", config.get_group_policy, Policy, READ),
        R("PUT", G + "/policy", config.put_group_policy, Policy, rule("admin", "path")),
        R("GET", Q + "/policy", config.get_policy, Policy, READ),
        R("PUT", Q + "/policy", config.put_policy, Policy, rule("admin", "path")),
        R("DELETE", Q + "/policy", config.delete_policy, Policy,
          rule("admin", "path", "none")),
        R("GET", G + "/schedules", config.list_schedules, ScheduleList, READ),
        R("PUT", G + "/schedules/{name}", config.put_schedule, ScheduleInfo,
          rule("admin", "path")),
        R("GET", G + "/schedules/{name}", config.get_schedule, ScheduleInfo, READ),
        R("DELETE", G + "/schedules/{name}", config.delete_schedule, None,
          rule("admin", "path", "none"))),
    *section(
        "cluster",
        # a data node's heartbeat and block report; the handler checks it speaks for its id
        R("POST", "/v1/nodes/heartbeat", nodes.heartbeat, HeartbeatResponse, rule("node"),
          hot=True),
        R("POST", "/v1/blobs/allocate", nodes.allocate, AllocateResponse, rule("producer")),
        R("GET", "/v1/cluster", nodes.cluster, ClusterInfo, rule(VIEW, "any", "none")),
        # node management (decommission, recommission, forget); a node credential may
        # decommission (and cancel, and watch) its own node: the data nodes' lifecycle hooks
        R("GET", N, nodes_admin.get_node, NodeStatus, NODE_SELF_READ),
        R("POST", N + "/decommission", nodes_admin.decommission, NodeStatus, NODE_SELF),
        R("DELETE", N + "/decommission", nodes_admin.recommission, NodeStatus,
          rule("admin node", "node", "none")),
        R("DELETE", N, nodes_admin.forget, ForgetResponse, ADMIN_READ),
        # the data nodes' front door: blob-id blocks, and the group commit of enqueues
        R("POST", "/v1/nodes/blocks", frontdoor.blocks, BlockGrant, rule("node")),
        R("POST", "/v1/nodes/commit", frontdoor.commit, NodeCommitResponse, rule("node"),
          hot=True),
        R("POST", "/v1/nodes/commit.msgpack", frontdoor.commit_compact, NodeCommitResponse,
          rule("node", body="binary"), hot=True,
          options={"openapi_extra": frontdoor.COMPACT_BODY}),
        # the SQS endpoint of a data node verifying a SigV4 request (master/sqskeys.py)
        R("POST", "/v1/nodes/sqs-key", sqskeys.lookup_sqs_key, sqskeys.SqsKeyAnswer,
          rule("node"))),
    *section(
        "master set",
        # between members only: a token signed with the cluster key (op "journal")
        R("POST", "/v1/journal/{method}", ha.journal, None, rule("member", body="binary"),
          hot=True, responses={}, options={"include_in_schema": False}),
        R("GET", "/v1/leader", ha.leader, None, PUBLIC),
        R("GET", "/v1/master/members", ha.members, None, ADMIN_READ),
        R("POST", "/v1/master/members", ha.change_members, None, ADMIN),
        R("POST", "/v1/master/step-down", ha.step_down, None, ADMIN_READ)),
    *section(
        "health",
        R("GET", "/healthz", health.healthz, None, PUBLIC, responses={}),
        R("GET", "/readyz", health.readyz, None, PUBLIC, responses={}),
        # public with --public-metrics
        R("GET", "/metrics", health.metrics, None, MONITOR_READ, responses={},
          options={"response_class": Response})),
    *section(
        "dashboard",
        # the page and its assets hold no data; the JSON it polls is for admin and monitor
        # credentials (public with --public-status), its actions are the REST routes above
        R("GET", "/", status.dashboard, None, PUBLIC, options={"include_in_schema": False}),
        R("GET", "/v1/overview", status.overview, None, MONITOR_READ),
        R("GET", "/v1/overview/queues/{group}/{queue}", status.queue_overview, None,
          rule("admin monitor", "path", "none")),
        R("GET", "/v1/overview/workers", status.workers, None, MONITOR_READ),
        # payloads: admins only, never made public with the rest of the dashboard's data
        R("GET", "/v1/overview/queues/{group}/{queue}/payload", status.payload_preview, None,
          rule("admin", "path", "none"))),
    *section(
        "auth",
        R("POST", A, security.mint_credential, security.MintResponse, ADMIN,
          responses=security.RESPONSES),
        R("GET", A, security.list_credentials, security.CredentialList, ADMIN_READ,
          responses=security.RESPONSES),
        R("DELETE", A + "/{cred_id}", security.revoke_credential, security.CredentialInfo,
          ADMIN_READ, responses=security.RESPONSES),
        R("POST", "/v1/auth/sqs-keys", sqskeys.mint_sqs_key, sqskeys.SqsKeyInfo, ADMIN,
          responses=security.RESPONSES)),
    # served by the framework: the API description and its page, the dashboard's and the
    # API page's assets
    R("GET", "/openapi.json", None, None, PUBLIC),
    R("GET", "/docs", None, None, PUBLIC),
    R("GET", "/static/{path:path}", None, None, PUBLIC),
], responses=ERROR_RESPONSES)
