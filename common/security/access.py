"""THE rule table: who may call which route of the master and of a data node.

Every route a server serves needs an entry here (``tests/test_access.py`` walks both apps
and fails on a route without one); a request matching no entry needs an admin credential.
The same table is in ``docs/security.md``. Add a line when you add a route.

Roles of a :class:`Rule`:

- ``public``: no credential (health probes, the API description);
- ``producer`` / ``consumer`` / ``admin`` / ``node``: a credential
  (``common/security/auth.py``) with one of these roles; ``admin`` passes every non-node rule;
- ``node`` also accepts a heartbeat token signed with the cluster key (``tokens.py``); the
  route checks that it speaks for the node id in the body;
- ``payload``: data-node blob routes; the route checks the master-signed payload token
  (write / read / delete / replicate, scoped to blob ids), as before.

Group scope (credentials limited to groups): ``path`` checks the ``{group}`` path
parameter, ``query`` the ``group`` query parameter (which a limited credential must give),
``any`` ignores groups (e.g. blob allocation), ``all`` refuses group-limited credentials
(cluster-wide views).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Scope = Literal["path", "query", "any", "all"]


@dataclass(frozen=True, slots=True)
class Rule:
    roles: frozenset[str]
    groups: Scope = "any"
    body: Literal["json", "binary", "none"] = "json"  # what a request body must be

    @property
    def public(self) -> bool:
        return "public" in self.roles


def _r(roles: str, groups: Scope = "any", body: Literal["json", "binary", "none"] = "json"
       ) -> Rule:
    return Rule(frozenset(roles.split()), groups, body)


PUBLIC = _r("public", body="none")
ADMIN = _r("admin", "all")
READ = _r("producer consumer", "path", "none")  # group-scoped reads: stats, policies
_G = "/v1/groups/{group}"
_Q = _G + "/queues/{queue}"

MASTER_RULES: dict[tuple[str, str], Rule] = {
    # tasks (the hot path; also served by master/http/fastpath.py behind the same check)
    ("POST", _G + "/update"): _r("producer consumer", "path"),  # route: enqueue needs
    ("POST", _Q + "/tasks"): _r("producer", "path"),            # producer, the rest consumer
    ("POST", _Q + "/lease"): _r("consumer", "path"),
    ("GET", _Q + "/tasks/{pid:path}"): _r("admin", "path", "none"),  # hands out read tokens
    ("GET", _Q + "/tasks"): _r("admin", "path", "none"),
    ("DELETE", _Q + "/tasks/{pid:path}"): _r("admin", "path", "none"),  # cancel a queued task
    # queues
    ("GET", _Q): READ,
    ("DELETE", _Q): _r("admin", "path", "none"),
    ("POST", _Q + "/reset-leases"): _r("admin", "path"),
    ("POST", _Q + "/redrive"): _r("admin", "path"),
    ("GET", "/v1/queues"): _r("producer consumer", "query", "none"),
    ("GET", "/v1/cluster/stats"): _r("producer consumer", "all", "none"),
    # policies and schedules
    ("GET", _G + "/policy"): READ,
    ("PUT", _G + "/policy"): _r("admin", "path"),
    ("GET", _Q + "/policy"): READ,
    ("PUT", _Q + "/policy"): _r("admin", "path"),
    ("DELETE", _Q + "/policy"): _r("admin", "path", "none"),
    ("GET", _G + "/schedules"): READ,
    ("PUT", _G + "/schedules/{name}"): _r("admin", "path"),
    ("GET", _G + "/schedules/{name}"): READ,
    ("DELETE", _G + "/schedules/{name}"): _r("admin", "path", "none"),
    # cluster
    ("POST", "/v1/nodes/heartbeat"): _r("node"),
    ("POST", "/v1/nodes/blocks"): _r("node"),  # the front door's blob-id blocks
    ("POST", "/v1/nodes/commit"): _r("node"),  # the front door's group commit
    ("POST", "/v1/blobs/allocate"): _r("producer"),
    ("GET", "/v1/cluster"): _r("producer consumer", "any", "none"),
    # node management (decommission, recommission, forget)
    ("GET", "/v1/nodes/{node_id}"): _r("admin", "all", "none"),
    ("POST", "/v1/nodes/{node_id}/decommission"): ADMIN,
    ("DELETE", "/v1/nodes/{node_id}/decommission"): _r("admin", "all", "none"),
    ("DELETE", "/v1/nodes/{node_id}"): _r("admin", "all", "none"),
    # credentials
    ("POST", "/v1/auth/credentials"): ADMIN,
    ("GET", "/v1/auth/credentials"): _r("admin", "all", "none"),
    ("DELETE", "/v1/auth/credentials/{cred_id}"): _r("admin", "all", "none"),
    # health, metrics, status page, API description
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/metrics"): _r("admin", "all", "none"),  # public with --public-metrics
    # the dashboard: the page and its assets hold no data; the JSON it polls is admin's
    # (public with --public-status), its actions are the REST routes above
    ("GET", "/"): PUBLIC,
    ("GET", "/v1/overview"): _r("admin", "all", "none"),
    ("GET", "/v1/overview/queues/{group}/{queue}"): _r("admin", "path", "none"),
    ("GET", "/static/{path:path}"): PUBLIC,  # dashboard and API docs assets
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
}

_PAYLOAD = _r("payload", body="binary")
DATANODE_RULES: dict[tuple[str, str], Rule] = {
    ("PUT", "/v1/blobs/{blob_id}"): _PAYLOAD,
    ("GET", "/v1/blobs/{blob_id}"): _r("payload", body="none"),
    ("HEAD", "/v1/blobs/{blob_id}"): _r("payload", body="none"),
    ("DELETE", "/v1/blobs/{blob_id}"): _r("payload", body="none"),
    ("POST", "/v1/blobs:batch-put"): _PAYLOAD,
    ("POST", "/v1/blobs:batch-get"): _r("payload"),
    ("PUT", "/v1/replicate/{blob_id}"): _PAYLOAD,
    ("POST", "/v1/replicate:batch-put"): _PAYLOAD,
    # the front door: a client's tasks with small payloads (msgpack), committed by the node
    ("POST", _Q + "/tasks"): _r("producer", "path", "binary"),
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/metrics"): _r("admin", "all", "none"),
    ("GET", "/static/{path:path}"): PUBLIC,  # API docs assets
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
}
PUBLIC_WHEN_ASKED = {"metrics": (("GET", "/metrics"),),
                     "status": (("GET", "/v1/overview"),
                                ("GET", "/v1/overview/queues/{group}/{queue}"))}
DEFAULT_RULE = ADMIN  # a request no rule matches (e.g. a 404) needs an admin credential


class RuleTable:
    """Finds the rule of a request: (method, path) -> (rule, path parameters)."""

    def __init__(self, rules: dict[tuple[str, str], Rule], public: tuple[str, ...] = ()):
        rules = dict(rules)
        for name in public:
            for key in PUBLIC_WHEN_ASKED[name]:
                rules[key] = PUBLIC
        self.rules = rules
        self._exact: dict[tuple[str, str], Rule] = {}
        self._patterns: list[tuple[str, re.Pattern[str], Rule]] = []
        for (method, template), rule in rules.items():
            if "{" not in template:
                self._exact[(method, template)] = rule
            else:
                self._patterns.append((method, _compile(template), rule))
        # templates with more literal text first: /tasks/{pid:path} vs /tasks
        self._patterns.sort(key=lambda p: -len(re.sub(r"\(\?P<[^>]+>[^)]+\)", "", p[1].pattern)))

    def match(self, method: str, path: str) -> tuple[Rule, dict[str, str]]:
        for m in (method, "GET") if method == "HEAD" else (method,):
            rule = self._exact.get((m, path))
            if rule is not None:
                return rule, {}
            for pm, rx, rule in self._patterns:
                if pm == m:
                    hit = rx.fullmatch(path)
                    if hit:
                        return rule, hit.groupdict()
        return DEFAULT_RULE, {}


def _compile(template: str) -> re.Pattern[str]:
    out, pos = [], 0
    for m in re.finditer(r"\{(\w+)(:path)?\}", template):
        out.append(re.escape(template[pos:m.start()]))
        out.append(f"(?P<{m[1]}>.+)" if m[2] else f"(?P<{m[1]}>[^/]+)")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out))
