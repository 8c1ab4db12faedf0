"""Access rules: who may call a route of the master or of a data node, and how a request
finds its route's rule.

Each route's rule is a column of its server's route table (``master/http/table.py``,
``datanode/http/table.py``), so a route cannot be added without one (the app refuses to
build); a request matching no route needs an admin credential. The same rules are listed in
``docs/security.md`` (``tests/test_access.py`` compares them).

Roles of a :class:`Rule`:

- ``public``: no credential (health probes, the API description);
- ``producer`` / ``consumer`` / ``admin`` / ``node``: a credential
  (``common/security/auth.py``) with one of these roles; ``admin`` passes every non-node rule;
- ``node`` also accepts a heartbeat token signed with the cluster key (``tokens.py``); the
  route checks that it speaks for the node id in the body;
- ``member``: a master set's journal calls, only with a token signed with the cluster key
  (op ``journal``); no credential passes, not even admin's;
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


def rule(roles: str, groups: Scope = "any", body: Literal["json", "binary", "none"] = "json"
         ) -> Rule:
    """A rule: `roles` space-separated."""
    return Rule(frozenset(roles.split()), groups, body)


PUBLIC = rule("public", body="none")
ADMIN = rule("admin", "all")
ADMIN_READ = rule("admin", "all", "none")  # cluster-wide views
READ = rule("producer consumer", "path", "none")  # group-scoped reads: stats, policies
PAYLOAD = rule("payload", body="binary")
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
