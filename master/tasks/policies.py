"""Queue policies: retries with backoff, dead letters, default lease length.

A policy is stored per queue, or per group as the default of its queues (name ``""``); the
effective policy takes each field from the queue's policy, else the group's, else the
built-in default. Backoff is deterministic (its jitter comes from a hash of pid and
attempt), so the sweeper computes the same retry time live and after a restart.
"""

from __future__ import annotations

import hashlib
from typing import Any

from squall.master.storage.index import Index

DEFAULT_LEASE_SECS = 60.0
DEAD_SUFFIX = ".dead"


def effective(index: Index, group: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ((group, ""), (group, name)):
        p = index.policies.get(key)
        if p:
            out.update({k: v for k, v in p.items() if v is not None})
    return out


def lease_secs(policy: dict[str, Any], requested: float | None) -> float:
    if requested is not None:
        return requested
    return float(policy.get("lease_secs") or DEFAULT_LEASE_SECS)


def dead_letter_queue(policy: dict[str, Any], name: str) -> str:
    dlq = policy.get("dead_letter_queue")
    return str(dlq) if dlq else name + DEAD_SUFFIX


def dead_letter_reason(why: str, error: str | None) -> str:
    """The reason kept with a dead letter: the task's last error's first line (a worker
    writes `Type: message` there) stays first, so one-line views show it; then `why` the
    master dead-lettered it; then the rest of the error (the traceback)."""
    if not error:
        return why
    first, _, rest = error.partition("\n")
    return f"{first}\n{why}" + (f"\n{rest}" if rest else "")


def exhausted(policy: dict[str, Any], attempts: int) -> bool:
    """True when a task that has been leased `attempts` times may not be leased again."""
    m = policy.get("max_attempts")
    return m is not None and attempts >= int(m)


def backoff_ms(policy: dict[str, Any], attempts: int, pid: str) -> int:
    """Delay before the next attempt after `attempts` failed ones (0 without a backoff)."""
    b = policy.get("backoff")
    if not b or attempts < 1:
        return 0
    base = b["base_secs"] * b["factor"] ** min(attempts - 1, 64)
    delay = min(float(b["cap_secs"]), base)
    h = hashlib.blake2b(f"{pid}\x00{attempts}".encode(), digest_size=8).digest()
    unit = int.from_bytes(h, "big") / 2**64  # in [0, 1), the same every time
    delay *= 1 + b["jitter"] * (2 * unit - 1)
    return max(0, int(delay * 1000))
