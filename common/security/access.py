"""Access rules: who may call a route of the master or of a data node, and how a request
finds its route's rule.

Each route's rule is a column of its server's route table (``master/http/table.py``,
``datanode/http/table.py``), so a route cannot be added without one (the app refuses to
build); a request matching no route needs an admin credential. The same rules are listed in
``docs/security.md`` (``tests/test_access.py`` compares them).

Roles of a :class:`Rule`:

- ``public``: no credential (health probes, the API description);
- ``producer`` / ``consumer`` / ``admin`` / ``monitor`` / ``node``: a credential
  (``common/security/auth.py``) with one of these roles; ``admin`` passes every rule but
  ``node``-only and ``payload`` ones; ``monitor`` is read-only (metrics, the dashboard's
  data, stats) and is listed in exactly the rules it passes;
- a rule of ``node`` alone (the data nodes' own calls: heartbeat, blocks, commit) also
  accepts a heartbeat token signed with the cluster key (``tokens.py``); the route checks
  that it speaks for the node id in the body;
- ``member``: a master set's journal calls, only with a token signed with the cluster key
  (op ``journal``); no credential passes, not even admin's;
- ``payload``: data-node blob routes; an ``Authorization: Bearer`` payload token is required
  and its signature and expiry checked before the body is read; the route checks its scope
  (write / read / delete / replicate, blob ids).
- ``sigv4``: the SQS endpoint of a data node; the route checks the request's AWS Signature
  Version 4 itself and answers SQS's errors (``datanode/sqs/``).

Group scope (credentials limited to groups): ``path`` checks the ``{group}`` path
parameter, ``query`` the ``group`` query parameter (which a limited credential must give),
``any`` ignores groups (e.g. blob allocation), ``all`` refuses group-limited credentials
(cluster-wide views), ``node`` is ``all`` plus: a node credential passes only for the
``{node_id}`` it names (a data node's lifecycle hooks decommission *that* node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Scope = Literal["path", "query", "any", "all", "node"]


@dataclass(frozen=True, slots=True)
class Rule:
    roles: frozenset[str]
    groups: Scope = "any"
    body: Literal["json", "binary", "none"] = "json"  # what a request body must be

    @property
    def public(self) -> bool:
        return "public" in self.roles


def rule(roles: str, groups: Scope = "any", body: Literal["json", "binary", "none"] = "json"
         ) -> Rule:
    """A rule: `roles` space-separated."""
    return Rule(frozenset(roles.split()), groups, body)


PUBLIC = rule("public", body="none")
ADMIN = rule("admin", "all")
ADMIN_READ = rule("admin", "all", "none")  # cluster-wide views
MONITOR_READ = rule("admin monitor", "all", "none")  # metrics, the dashboard's data
READ = rule("producer consumer monitor", "path", "none")  # group-scoped reads: stats, policies
PAYLOAD = rule("payload", body="binary")
SIGV4 = rule("sigv4", body="binary")
PUBLIC_WHEN_ASKED = {"metrics": (("GET", "/metrics"),),
                     "status": (("GET", "/v1/overview"),
                                ("GET", "/v1/overview/queues/{group}/{queue}"),
                                ("GET", "/v1/overview/workers"))}
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
        for (method, template), r in rules.items():
            if "{" not in template:
                self._exact[(method, template)] = r
            else:
                self._patterns.append((method, _compile(template), r))
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
