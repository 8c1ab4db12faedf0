"""Recurring schedules: which slots are due, and the pid each slot is enqueued under.

A schedule with ``interval_secs`` has slots starting at every multiple of the interval
since the epoch (UTC); one with ``cron`` has slots at the cron expression's times (UTC,
croniter). Each slot is enqueued once as pid ``<name>@<slot start, ISO 8601 UTC with
milliseconds>``, e.g. ``nightly@2026-11-22T03:00:00.000Z``: these pids sort in time order,
and pid collapse makes a slot impossible to enqueue twice even if two masters raced.
The last slot enqueued is stored with the schedule (in the same WAL record as the
enqueue), so a restart neither repeats nor skips slots; slots missed while the master was
down are enqueued according to ``catch_up``: ``one`` (only the latest) or ``all``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from squall.common.errors import BadRequest

MAX_SLOTS_PER_TICK = 1000


def _croniter() -> Any:
    from croniter import croniter  # imported when first needed: it is slow to import

    return croniter


def check_cron(expr: str) -> None:
    if not _croniter().is_valid(expr):
        raise BadRequest(f"invalid cron expression {expr!r}: use five fields, "
                         "e.g. '*/5 * * * *' (minute hour day month weekday, UTC)")


def slot_pid(name: str, slot_ms: int) -> str:
    t = datetime.fromtimestamp(slot_ms / 1000, UTC)
    return f"{name}@{t.strftime('%Y-%m-%dT%H:%M:%S')}.{slot_ms % 1000:03d}Z"


def slot_at_or_before(s: dict[str, Any], now_ms: int) -> int:
    """Start of the latest slot at or before `now_ms`."""
    if s.get("interval_secs"):
        step = int(s["interval_secs"] * 1000)
        return now_ms - now_ms % step
    it = _croniter()(s["cron"], datetime.fromtimestamp(now_ms / 1000 + 0.001, UTC))
    return int(it.get_prev(float) * 1000)


def next_slot(s: dict[str, Any], after_ms: int) -> int:
    """Start of the first slot strictly after `after_ms`."""
    if s.get("interval_secs"):
        step = int(s["interval_secs"] * 1000)
        return after_ms - after_ms % step + step
    it = _croniter()(s["cron"], datetime.fromtimestamp(after_ms / 1000, UTC))
    return int(it.get_next(float) * 1000)


def due_slots(s: dict[str, Any], now_ms: int) -> list[int]:
    """Slots after the last enqueued one that have started by `now_ms`, after catch-up."""
    last = int(s["last_slot_ms"])
    if next_slot(s, last) > now_ms:
        return []
    if s.get("catch_up", "one") == "one":
        return [slot_at_or_before(s, now_ms)]
    out: list[int] = []
    t = last
    while len(out) < MAX_SLOTS_PER_TICK:
        t = next_slot(s, t)
        if t > now_ms:
            break
        out.append(t)
    return out
