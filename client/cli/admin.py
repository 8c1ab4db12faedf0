"""The ``squall`` queue and cluster verbs: queues, stats, delete, reset-leases, dead-letters,
redrive, nodes, and the ``policy`` and ``schedule`` command groups."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import typer
from rich.box import SIMPLE_HEAD
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from squall.client._sync import Client
from squall.client.cli.common import (
    JsonOpt,
    MasterOpt,
    ago,
    check_queue,
    clean,
    connect,
    fail,
    invalid,
    out,
    print_json,
    say,
    show,
    table,
)
from squall.common.wire.models import (
    Backoff,
    ClusterStats,
    PauseState,
    Policy,
    QueueStats,
    Schedule,
)

QueueArg = Annotated[str, typer.Argument(help="queue, written group#name (group: default)")]


def queues(regex: Annotated[str | None, typer.Argument(help="regex searched in group#name")
                            ] = None,
           group: Annotated[str | None, typer.Option(help="only this group")] = None,
           all_: Annotated[bool, typer.Option("--all", help="include empty queues")] = False,
           limit: Annotated[int, typer.Option(min=1)] = 1000,
           as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """List queues with their task counts."""
    with connect(master) as c:
        qs = c.queues(regex, group=group, min_tasks=0 if all_ else 1, limit=limit)
    if as_json:
        print_json(qs)
        return
    if not qs:
        say("no queues" + (" match" if regex or group else " hold tasks"))
        return
    show(None, ["queue", "available", "leased", "delayed", "total", "completed"],
         [[f"{q.group}#{q.queue}", q.available, q.leased, q.delayed, q.total, q.completed]
          for q in qs])


def _stats_view(c: Client, queue: str | None) -> RenderableType:
    s = c.stats(queue)
    if isinstance(s, ClusterStats):
        top = sorted(c.queues(limit=1000), key=lambda q: -q.total)[:20]
        head = table("cluster", ["", "value"], [
            ["queues holding tasks", s.queues], ["available", s.available],
            ["leased", s.leased], ["delayed", s.delayed], ["completed", s.completed],
            ["enqueue/s (1m)", f"{s.rates.enqueue_1m:.1f}"],
            ["lease/s (1m)", f"{s.rates.lease_1m:.1f}"],
            ["dequeue/s (1m)", f"{s.rates.dequeue_1m:.1f}"], ["WAL ticket", s.wal_ticket]])
        return Group(head, table("busiest queues", ["queue", "available", "leased",
                                                    "delayed", "completed"],
                                 [[f"{q.group}#{q.queue}", q.available, q.leased, q.delayed,
                                   q.completed] for q in top]))
    assert isinstance(s, QueueStats)
    r = s.rates
    rows: list[list[Any]] = [
            ["available", s.available], ["leased", s.leased], ["delayed", s.delayed],
            ["total", s.total], ["completed", s.completed],
            ["paused (held by a pause)", s.paused],
            ["blocked (held by a limit)", s.blocked],
            ["enqueued (all time)", s.enqueued_total],
            ["enqueue/s 1m / 5m", f"{r.enqueue_1m:.1f} / {r.enqueue_5m:.1f}"],
            ["lease/s 1m / 5m", f"{r.lease_1m:.1f} / {r.lease_5m:.1f}"],
            ["dequeue/s 1m / 5m", f"{r.dequeue_1m:.1f} / {r.dequeue_5m:.1f}"],
            ["mean lease (s)", f"{s.mean_lease_secs:.2f}" if s.mean_lease_secs else "-"],
            ["oldest available (s)", s.oldest_available_age_secs or "-"]]
    if s.queue_paused or s.paused_keys:
        rows.append(["PAUSED", "the whole queue" if s.queue_paused else
                     "keys " + ", ".join(clean(k) for k in s.paused_keys[:10])])
    counts = table(f"{s.group}#{s.queue}", ["", "value"], rows)
    if not s.leased_sample:
        return counts
    # the sample in a table of its own: a long pid or worker name is cut short with "…"
    # there, and can never push the counts off the screen
    sample = Table(title="leased now (sample)", title_justify="left", header_style="bold",
                   box=SIMPLE_HEAD)
    for name, widest in (("pid", 32), ("worker", 20), ("address", 22)):
        sample.add_column(name, no_wrap=True, overflow="ellipsis", max_width=widest)
    sample.add_column("since", justify="right", no_wrap=True)
    for x in s.leased_sample[:5]:
        sample.add_row(Text(clean(x.pid)), Text(clean(x.worker or "")),
                       Text(clean(x.worker_addr or "")), f"{x.lease_age_secs:.1f}s")
    return Group(counts, sample)


def stats(queue: Annotated[str | None, typer.Argument(help="a queue (default: the cluster)")
                           ] = None,
          watch: Annotated[bool, typer.Option("--watch", "-w", help="refresh until Ctrl-C")
                           ] = False,
          interval: Annotated[float, typer.Option(min=0.1, help="seconds between refreshes")
                              ] = 2.0,
          times: Annotated[int, typer.Option(hidden=True, help="stop after N refreshes")] = 0,
          as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Queue statistics (counts, rates, lease times), or cluster totals."""
    if queue is not None:
        check_queue(queue)
    with connect(master) as c:
        if as_json:
            print_json(c.stats(queue))
            return
        if not watch:
            out.print(_stats_view(c, queue))
            return
        n = 0
        try:
            with Live(_stats_view(c, queue), console=out, auto_refresh=False) as live:
                while not times or n < times:
                    time.sleep(interval)
                    live.update(_stats_view(c, queue), refresh=True)
                    n += 1
        except KeyboardInterrupt:
            pass


def _lag(m: dict[str, Any]) -> str:
    if m.get("leader"):
        return "-"
    lag = m.get("lag")
    return "?" if lag is None else f"{lag} records"


def status(as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """The cluster at a glance: data nodes, the WAL, totals and, on a master set, its
    members, leader, epoch, each standby's lag and the elector (monitor role)."""
    with connect(master) as c:
        ov = c.overview()
    if as_json:
        print_json({k: ov.get(k) for k in ("cluster", "wal", "totals", "master_set")})
        return
    cl, w, t = ov.get("cluster") or {}, ov.get("wal") or {}, ov.get("totals") or {}
    nodes = cl.get("nodes") or []
    up = sum(1 for n in nodes if n.get("health") == "alive")
    rows: list[list[Any]] = [
        ["data nodes", f"{len(nodes)} ({up} alive)" if nodes else "none"],
        ["under-replicated / lost blobs",
         f"{cl.get('under_replicated', 0)} / {cl.get('lost', 0)}"],
        ["WAL ticket (durable)", f"{w.get('ticket')} ({w.get('durable_ticket')})"],
        ["WAL error", w.get("error") or "none"],
        ["queues holding tasks", t.get("queues")], ["available", t.get("available")],
        ["leased", t.get("leased")], ["delayed", t.get("delayed")],
        ["completed", t.get("completed")]]
    out.print(table("cluster", ["", "value"], rows))
    ms = ov.get("master_set")
    if not ms:
        say("master: a single master")
        return
    say(f"master set: leader {ms.get('leader') or 'none'}, epoch {ms.get('epoch')}, "
        f"elector {ms.get('elector')}, {ms.get('failovers', 0)} failover(s) seen by "
        f"{ms.get('me')}")
    show("members", ["member", "role", "journal", "in sync", "lag"],
         [[m.get("url"), "leader" if m.get("leader") else "standby",
           m.get("status") or "-", {True: "yes", False: "no"}.get(m.get("in_sync"), "?"),
           _lag(m)] for m in ms.get("members") or []])


def delete(queue: QueueArg,
           yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
           master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Delete a queue and all its tasks."""
    check_queue(queue)
    if not yes and not typer.confirm(f"delete {clean(queue)} and all its tasks?"):
        raise typer.Exit(1)
    with connect(master) as c:
        r = c.delete(queue)
    say(f"deleted {queue} ({r.deleted} task(s))")


def reset_leases(queue: QueueArg, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Make every leased task of a queue available again now."""
    check_queue(queue)
    with connect(master) as c:
        r = c.reset_leases(queue)
    say(f"reset {r.reset} lease(s) in {queue}")


KeyOpt = Annotated[str | None, typer.Option("--key", "-k", help="only this key's tasks")]


def pause(queue: QueueArg, key: KeyOpt = None,
          master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Pause a queue (or one key in it): leases skip it, enqueues go on, until resumed."""
    check_queue(queue)
    with connect(master) as c:
        st = c.pause(queue, key)
    say(_pause_text(queue, st))


def resume(queue: QueueArg, key: KeyOpt = None,
           master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Resume a paused queue (or one paused key in it)."""
    check_queue(queue)
    with connect(master) as c:
        st = c.resume(queue, key)
    say(_pause_text(queue, st))


def _pause_text(queue: str, st: PauseState) -> str:
    keys = f"; paused keys: {', '.join(st.paused_keys)}" if st.paused_keys else ""
    return f"{queue} is {'paused' if st.paused else 'not paused'}{keys}"


def dead_letters(queue: QueueArg, limit: Annotated[int, typer.Option(min=1)] = 100,
                 as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """List a queue's dead letters (tasks that failed max_attempts times)."""
    check_queue(queue)
    with connect(master) as c:
        dlq = c.dead_letter_queue(queue)
        ts = c.dead_letters(queue, limit=limit)
    if as_json:
        print_json(ts)
        return
    if not ts:
        say(f"no dead letters in {dlq}")
        return
    show(f"dead letters of {queue} (in {dlq})", ["pid", "attempts", "error"],
         [[t.pid, t.attempts, (t.error or "").splitlines()[0][:160] if t.error else ""]
          for t in ts])


def redrive(queue: QueueArg,
            max_tasks: Annotated[int, typer.Option("--max", min=1, max=1000)] = 1000,
            master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Move dead letters back into their queue (attempts reset)."""
    check_queue(queue)
    with connect(master) as c:
        r = c.redrive(queue, max_tasks)
    say(f"moved {r.moved} task(s) from {r.source} back into {queue}")


# -- policies ------------------------------------------------------------------------------
policy_app = typer.Typer(help="Show, set or clear a queue's (or a group's default) policy.",
                         no_args_is_help=True)
TargetArg = Annotated[str, typer.Argument(
    help="group#queue, or group# for the group's default policy")]


def _check_target(target: str) -> str:
    check_queue(target + "x" if target.endswith("#") else target)
    return target


def _show_policy(target: str, p: Policy, as_json: bool) -> None:
    if as_json:
        print_json(p)
        return
    b = p.backoff
    out.print(table(f"policy of {target}", ["", "value"], [
        ["max attempts", p.max_attempts or "unlimited"],
        ["dead-letter queue", p.dead_letter_queue or "<queue>.dead"],
        ["lease (s)", p.lease_secs or "60 (default)"],
        ["retry backoff", f"{b.base_secs}s x{b.factor} up to {b.cap_secs}s, jitter "
                          f"{b.jitter}" if b else "default"],
        ["leased per key", p.key_limit or "unlimited"],
        ["leased in the queue", p.queue_limit or "unlimited"],
        ["rate per key", f"{p.key_rate}/s, burst {p.key_burst or max(1.0, p.key_rate)}"
                         if p.key_rate else "unlimited"],
        ["rate of the queue", f"{p.rate}/s, burst {p.burst or max(1.0, p.rate)}"
                              if p.rate else "unlimited"],
        ["fair across keys", ("yes" + (f", weights {p.key_weights}" if p.key_weights
                                        else "")) if p.fair else "no (pid order)"]]))


@policy_app.command("show")
def policy_show(target: TargetArg, as_json: JsonOpt = False,
                master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """The effective policy of a queue (or a group's default)."""
    with connect(master) as c:
        p = c.policy(_check_target(target))
    _show_policy(target, p, as_json)


@policy_app.command("set")
def policy_set(target: TargetArg,
               max_attempts: Annotated[int | None, typer.Option(min=1, max=10_000)] = None,
               dead_letter_queue: Annotated[str | None, typer.Option()] = None,
               lease_secs: Annotated[float | None, typer.Option(min=0.001)] = None,
               backoff_base: Annotated[float | None, typer.Option(
                   help="retry backoff: first delay (s)")] = None,
               backoff_factor: Annotated[float, typer.Option()] = 2.0,
               backoff_cap: Annotated[float, typer.Option()] = 300.0,
               key_limit: Annotated[int | None, typer.Option(
                   min=1, help="at most N tasks of one key leased at once")] = None,
               queue_limit: Annotated[int | None, typer.Option(
                   min=1, help="at most M tasks of the queue leased at once")] = None,
               key_rate: Annotated[float | None, typer.Option(
                   help="tasks of one key leased per second")] = None,
               key_burst: Annotated[float | None, typer.Option()] = None,
               rate: Annotated[float | None, typer.Option(
                   help="tasks of the queue leased per second")] = None,
               burst: Annotated[float | None, typer.Option()] = None,
               fair: Annotated[bool, typer.Option(
                   "--fair", help="lease keys in weighted round-robin")] = False,
               weight: Annotated[list[str] | None, typer.Option(
                   help="KEY=N: a fair queue's weight of a key (repeatable)")] = None,
               as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Replace the policy of a queue (or a group's default) with the given fields."""
    weights: dict[str, int] = {}
    for w in weight or []:
        k, sep, n = w.partition("=")
        if not sep or not n.isdigit():
            fail(f"--weight takes KEY=N, not {w!r}", 2)
        weights[k] = int(n)
    try:
        backoff = (Backoff(base_secs=backoff_base, factor=backoff_factor, cap_secs=backoff_cap)
                   if backoff_base is not None else None)
        pol = Policy(max_attempts=max_attempts, dead_letter_queue=dead_letter_queue,
                     lease_secs=lease_secs, backoff=backoff, key_limit=key_limit,
                     queue_limit=queue_limit, key_rate=key_rate, key_burst=key_burst,
                     rate=rate, burst=burst, fair=fair or None, key_weights=weights or None)
    except ValueError as e:
        fail(invalid("policy", e, {"max_attempts": "--max-attempts", "lease_secs": "--lease-secs",
                                   "dead_letter_queue": "--dead-letter-queue",
                                   "base_secs": "--backoff-base",
                                   "factor": "--backoff-factor",
                                   "cap_secs": "--backoff-cap"}), 2)
    with connect(master) as c:
        p = c.set_policy(_check_target(target), pol)
    _show_policy(target, p, as_json)


@policy_app.command("clear")
def policy_clear(target: TargetArg, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Remove the policy of a queue (or a group's default)."""
    with connect(master) as c:
        c.delete_policy(_check_target(target))
    say(f"cleared the policy of {target}")


# -- schedules -----------------------------------------------------------------------------
schedule_app = typer.Typer(help="List, set or delete recurring tasks (schedules).",
                           no_args_is_help=True)
NameArg = Annotated[str, typer.Argument(help="group#schedule")]


@schedule_app.command("list")
def schedule_list(group: Annotated[str, typer.Argument(help="the group")] = "default",
                  as_json: JsonOpt = False,
                  master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """A group's schedules with their last and next slots."""
    with connect(master) as c:
        ss = c.schedules(group)
    if as_json:
        print_json(ss)
        return
    if not ss:
        say(f"no schedules in group {group}")
        return
    now = time.time()
    show(f"schedules of {group}", ["schedule", "queue", "every", "last", "next"],
         [[s.name, s.queue, f"{s.interval_secs}s" if s.interval_secs else s.cron,
           ago(s.last_slot, now), ago(s.next_slot, now)] for s in ss])


@schedule_app.command("set")
def schedule_set(name: NameArg,
                 queue: Annotated[str, typer.Option(help="queue name in the same group")],
                 every: Annotated[float | None, typer.Option(help="interval in seconds")
                                  ] = None,
                 cron: Annotated[str | None, typer.Option(help="cron expression (UTC)")
                                 ] = None,
                 catch_up: Annotated[str, typer.Option(help="after downtime: one | all")
                                     ] = "one",
                 master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Create or replace a schedule: the master enqueues pid <schedule>@<slot> each slot."""
    check_queue(name)
    if (every is None) == (cron is None):
        fail("give exactly one of --every SECONDS or --cron EXPR", 2)
    if catch_up not in ("one", "all"):
        fail("--catch-up is one or all", 2)
    mode: Literal["one", "all"] = "one" if catch_up == "one" else "all"
    try:
        sched = Schedule(queue=queue, interval_secs=every, cron=cron, catch_up=mode)
    except ValueError as e:
        fail(invalid("schedule", e, {"interval_secs": "--every", "cron": "--cron",
                                     "queue": "--queue", "catch_up": "--catch-up"}), 2)
    with connect(master) as c:
        s = c.set_schedule(name, sched)
    say(f"schedule {name} -> {s.queue}, next slot {ago(s.next_slot, time.time())}")


@schedule_app.command("delete")
def schedule_delete(name: NameArg, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Delete a schedule (tasks it already enqueued stay)."""
    check_queue(name)
    with connect(master) as c:
        c.delete_schedule(name)
    say(f"deleted schedule {name}")


def register(app: typer.Typer) -> None:
    for fn in (status, queues, stats, delete, reset_leases, pause, resume, dead_letters, redrive):
        app.command(fn.__name__.replace("_", "-"))(fn)
    app.add_typer(policy_app, name="policy")
    app.add_typer(schedule_app, name="schedule")
