// squall dashboard: polls /v1/overview (and a queue's /v1/overview/queues/...) every few
// seconds, updates tables and uPlot charts in place. Server data is only ever set as
// textContent (never HTML), with control and invisible or direction-changing characters
// escaped as the CLI escapes them (clean()). Actions call the ordinary REST routes with the
// credential typed into the header field, sent as a bearer header (kept in this tab's
// sessionStorage); their results show in the page (#result), never in a dialog.
"use strict";
// C0, DEL, C1, and the invisible or direction-changing format characters (U+202E reverses
// the text after it): the set client/cli/common.py escapes, written the same way (\x1b,
// \u202e, \n), so a worker name or an error cannot spoof what the page shows
const UNSAFE = /[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g;
const NAMED = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };
function clean(v) {
  return String(v).replace(UNSAFE, (c) => NAMED[c] || (c.charCodeAt(0) < 0x100
    ? "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0")
    : "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0")));
}
// a multi-line text (a traceback): its line breaks kept, everything else escaped
function cleanLines(v) {
  return String(v).split("\n").map(clean).join("\n");
}
// ?refresh=MS overrides the poll period (at least 250 ms; the browser test uses it)
const REFRESH_MS = Math.max(250, Number(new URLSearchParams(location.search).get("refresh"))
                                 || 3000);
const $ = (s) => document.querySelector(s);
const st = { since: 0, hist: [], qhist: [], qsince: 0, qname: null, sort: "total",
             asc: false, rows: [], charts: {}, timer: null, task: null };

const tokenInput = $("#token");
tokenInput.value = sessionStorage.getItem("squall.token") || "";
tokenInput.addEventListener("change", () => {
  sessionStorage.setItem("squall.token", tokenInput.value.trim());
  refresh();
});

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  const tok = tokenInput.value.trim();
  if (tok) headers["Authorization"] = "Bearer " + tok;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined
                                                      : JSON.stringify(body) });
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (!r.ok) {
    const msg = data && data.error ? data.error.message : r.status + " " + r.statusText;
    const err = new Error(msg); err.status = r.status; throw err;
  }
  return data;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = clean(text);
  if (cls) e.className = cls;
  return e;
}
function kv(tbody, rows) {
  tbody.replaceChildren(...rows.map(([k, v]) => {
    const tr = el("tr"); tr.append(el("td", k), el("td", v === null || v === undefined ? "-" : v));
    return tr;
  }));
}
function qsplit(name) {
  const i = name.indexOf("#");
  return [name.slice(0, i), name.slice(i + 1)];
}
function qpath(name) {
  const [g, q] = qsplit(name);
  return "/v1/groups/" + encodeURIComponent(g) + "/queues/" + encodeURIComponent(q);
}
// a pid that opens the task drawer
function pidLink(queue, pid) {
  const a = el("a", pid, "pid");
  a.href = "#";
  a.dataset.queue = queue; a.dataset.pid = pid;
  a.addEventListener("click", (ev) => { ev.preventDefault(); openTask(queue, pid); });
  const td = el("td"); td.append(a);
  return td;
}
function fmt(v, digits) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number" && !Number.isInteger(v)) return v.toFixed(digits ?? 1);
  return typeof v === "number" ? v.toLocaleString("en-US") : String(v);
}
function rate(v) {
  return Number(v || 0).toFixed(1);
}
function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; let f = n;
  while (f >= 1024 && i < u.length - 1) { f /= 1024; i++; }
  return (i ? f.toFixed(1) : f) + " " + u[i];
}
function ago(t, now) {
  if (!t) return "";
  const d = t - now;
  return d >= 0 ? "in " + d.toFixed(1) + "s" : (-d).toFixed(1) + "s ago";
}
// A row replaced between a button's press and release swallows the click (the release
// lands on the new row): tables keep their rows while a pointer is pressed; the next
// refresh after the release renders them.
let pressed = false;
addEventListener("pointerdown", () => { pressed = true; }, true);
addEventListener("pointerup", () => { setTimeout(() => { pressed = false; }); }, true);
addEventListener("pointercancel", () => { pressed = false; }, true);
function fill(tbody, rows) {
  if (!pressed) tbody.replaceChildren(...rows);
}
function card(k, v, cls) {
  const c = el("div", null, "card " + (cls || ""));
  c.append(el("div", v, "v"), el("div", k, "k"));
  c.dataset.k = k;
  return c;
}
function banner(sel, text) {
  const b = $(sel);
  b.hidden = !text;
  b.textContent = clean(text || "");
}

// -- charts ----------------------------------------------------------------------------
function chart(id, labels, colors) {
  if (st.charts[id]) return st.charts[id];
  const series = [{}].concat(labels.map((l, i) => ({ label: l, stroke: colors[i], width: 1.5 })));
  const opts = { width: 420, height: 180, series, scales: { x: { time: true } },
                 legend: { live: false } };
  const data = [[]].concat(labels.map(() => []));
  st.charts[id] = new uPlot(opts, data, document.getElementById(id));
  return st.charts[id];
}
function plot(id, labels, colors, points, fields) {
  const c = chart(id, labels, colors);
  const cols = [points.map((p) => p[fields[0]])];
  for (let i = 1; i < fields.length; i++) cols.push(points.map((p) => p[fields[i]]));
  c.setData(cols);
}

// -- front page ------------------------------------------------------------------------
// a master set: leader, epoch, elector, and each member's lag (none on a single master)
function masterSetCards(ms) {
  if (!ms) return [];
  const cards = [card("leader", ms.leader || "none", ms.leader ? "ok" : "bad"),
                 card("epoch", ms.epoch), card("elector", ms.elector)];
  for (const x of ms.members) {
    if (x.leader) continue;
    const ok = x.in_sync === true;
    cards.push(card("member " + x.url, ok ? "lag " + (x.lag ?? 0) : (x.status || "?"),
                    ok ? "ok" : "bad"));
  }
  return cards;
}

function renderHealth(o) {
  const c = o.cluster, n = c.nodes;
  const count = (s) => n.filter((x) => x.state === s).length;
  const other = n.filter((x) => !["alive", "suspect", "dead"].includes(x.state)).length;
  const cards = [
    card("nodes alive", count("alive"), "ok"),
    card("suspect", count("suspect"), count("suspect") ? "bad" : ""),
    card("dead", count("dead"), count("dead") ? "bad" : ""),
    card("draining / other", other),
    card("under-replicated blobs", c.under_replicated, c.under_replicated ? "bad" : "ok"),
    card("lost blobs", c.lost, c.lost ? "bad" : "ok"),
    card("copies in flight", c.copies_in_flight),
    card("blobs", c.blobs),
    card("replication factor", c.replication_factor),
    card("WAL", o.wal.error ? "FAILED" : "ok", o.wal.error ? "bad" : "ok"),
    card("WAL ticket", o.wal.ticket),
    ...masterSetCards(o.master_set),
    card("queues holding tasks", o.totals.holding),
    card("available", o.totals.available), card("leased", o.totals.leased),
    card("delayed", o.totals.delayed), card("dead letters", o.totals.dead_letters,
                                            o.totals.dead_letters ? "bad" : ""),
    card("completed", o.totals.completed),
    card("enqueue/s", rate(o.totals.rates.enqueue_1m)),
    card("dequeue/s", rate(o.totals.rates.dequeue_1m)),
  ];
  $("#health").replaceChildren(...cards);
  banner("#walbanner", o.wal.error ? "The master cannot write its log (" + o.wal.error +
         "): every change is refused. Fix the disk and restart the master." : "");
  fill($("#nodes tbody"), n.map((x) => {
    const tr = el("tr");
    tr.dataset.node = x.node_id;
    tr.append(el("td", x.node_id), el("td", x.address), el("td", x.state, "state-" + x.state),
              el("td", x.last_beat_secs_ago.toFixed(1) + "s"), el("td", bytes(x.used_bytes)),
              el("td", bytes(x.free_bytes)), el("td", bytes(x.capacity_bytes)),
              el("td", fmt(x.blob_count)));
    const td = el("td");
    if (x.state !== "dead") {
      const b = el("button", "decommission");
      b.onclick = () => act("decommission data node " + clean(x.node_id) + "?", "POST",
                            "/v1/nodes/" + encodeURIComponent(x.node_id) + "/decommission",
                            undefined, "decommission " + x.node_id);
      td.append(b);
    }
    tr.append(td);
    return tr;
  }));
}

function qlink(name) {
  const a = el("a", name);
  const [g, q] = qsplit(name);
  a.href = "#/queue/" + encodeURIComponent(g) + "/" + encodeURIComponent(q);
  return a;
}

function renderQueues() {
  const f = $("#filter").value.trim().toLowerCase();
  const k = st.sort, dir = st.asc ? 1 : -1;
  const rows = st.rows.filter((r) => !f || r.queue.toLowerCase().includes(f));
  rows.sort((a, b) => {
    const x = a[k] ?? -1, y = b[k] ?? -1;
    return (x < y ? -1 : x > y ? 1 : 0) * dir;
  });
  document.querySelectorAll("#queues th").forEach((th) => {
    th.classList.toggle("sorted", th.dataset.k === k);
    th.classList.toggle("asc", th.dataset.k === k && st.asc);
  });
  fill($("#queues tbody"), rows.map((r) => {
    const tr = el("tr", null, r.dead_letter_queue ? "dlq" : "");
    const td = el("td"); td.append(qlink(r.queue));
    if (r.queue_paused) td.append(el("span", " paused", "bad"));
    tr.append(td);
    for (const key of ["total", "available", "leased", "delayed"]) tr.append(el("td", fmt(r[key])));
    tr.append(el("td", fmt(r.paused || 0), r.paused ? "warn" : ""));
    tr.append(el("td", fmt(r.blocked || 0), r.blocked ? "warn" : ""));
    tr.append(el("td", r.oldest_age_secs == null ? "" : fmt(r.oldest_age_secs)));
    for (const key of ["enqueue_1m", "lease_1m", "dequeue_1m"]) tr.append(el("td", rate(r[key])));
    tr.append(el("td", fmt(r.completed)));
    return tr;
  }));
}

document.querySelectorAll("#queues th").forEach((th) => th.addEventListener("click", () => {
  if (st.sort === th.dataset.k) st.asc = !st.asc; else { st.sort = th.dataset.k; st.asc = false; }
  renderQueues();
}));
$("#filter").addEventListener("input", renderQueues);

function renderDead(o) {
  const rows = o.dead_letter_queues.map((r) => {
    const tr = el("tr", null, "dlq");
    const td = el("td"); td.append(qlink(r.queue)); tr.append(td);
    tr.append(el("td", fmt(r.total)));
    const reason = r.reasons.length ? firstLine(r.reasons[0].error) : "";
    tr.append(el("td", reason, "text"));
    tr.append(el("td"));
    return tr;
  });
  fill($("#dead tbody"), rows.length ? rows : [trMsg("no dead letters", 4)]);
}
function renderWorkers(w) {
  const now = w.now;
  fill($("#workers tbody"), w.workers.length ? w.workers.map((x) => {
    const tr = el("tr");
    tr.dataset.worker = x.worker;
    const qs = x.queues.slice(0, 3).map((q) => q.queue + " (" + q.tasks + ")").join(", ") +
      (x.queues.length > 3 ? ", +" + (x.queues.length - 3) + " more" : "");
    tr.append(el("td", x.worker || "(unnamed)"), el("td", x.address), el("td", fmt(x.tasks)),
              el("td", qs, "text"), el("td", ago(x.since, now)));
    tr.append(x.oldest ? pidLink(x.oldest.queue, x.oldest.pid) : el("td"));
    tr.append(el("td", ago(x.last_lease, now)));
    return tr;
  }) : [trMsg("no lease held in the largest queues", 7)]);
}
function renderBatches(o) {
  const rows = (o.batches || []).map((b) => {
    const tr = el("tr");
    tr.append(el("td", b.group + "#" + b.batch));
    tr.append(el("td", b.state, b.state === "failed" ? "bad" : ""));
    const td = el("td");
    const bar = document.createElement("progress");
    bar.max = Math.max(1, b.total); bar.value = b.done + b.failed;
    bar.title = (b.done + b.failed) + " of " + b.total;
    td.append(bar); tr.append(td);
    tr.append(el("td", fmt(b.done)));
    tr.append(el("td", fmt(b.failed), b.failed ? "warn" : ""));
    tr.append(el("td", fmt(b.total)));
    tr.append(el("td", b.group + "#" + b.callback_queue));
    return tr;
  });
  fill($("#batches tbody"), rows.length ? rows : [trMsg("no batches", 7)]);
}
function trMsg(text, span) {
  const tr = el("tr"); const td = el("td", text, "muted"); td.colSpan = span; tr.append(td);
  return tr;
}

async function refreshHome() {
  const o = await api("GET", "/v1/overview?limit=100&since=" + st.since);
  st.hist = st.hist.concat(o.history).filter((p) => p.t > o.now - 3600);
  if (o.history.length) st.since = o.history[o.history.length - 1].t;
  renderHealth(o);
  st.rows = o.queues;
  $("#qcount").textContent = "(" + o.queues.length + " largest of " +
    o.totals.holding.toLocaleString("en-US") + " holding tasks)";
  renderQueues();
  renderDead(o);
  try {
    renderWorkers(await api("GET", "/v1/overview/workers"));
  } catch (e) {
    fill($("#workers tbody"), [trMsg("cannot list workers: " + e.message, 7)]);
  }
  renderBatches(o);
  plot("c-rates", ["enqueue", "lease", "dequeue"], ["#1d5fd1", "#a86200", "#1a7f37"],
       st.hist, ["t", "enqueue", "lease", "dequeue"]);
  plot("c-depth", ["available", "leased", "delayed", "dead letters"],
       ["#1d5fd1", "#a86200", "#8a93a6", "#c0182a"], st.hist,
       ["t", "available", "leased", "delayed", "dead_letters"]);
  plot("c-repl", ["under-replicated", "lost", "nodes down"], ["#a86200", "#c0182a", "#5b4bb7"],
       st.hist, ["t", "under_replicated", "lost", "nodes_down"]);
  $("#updated").textContent = "updated " + new Date(o.now * 1000).toLocaleTimeString();
}

// -- a queue's page --------------------------------------------------------------------
async function refreshQueue(g, q) {
  const name = g + "#" + q;
  if (st.qname !== name) { st.qname = name; st.qhist = []; st.qsince = 0; }
  const path = "/v1/overview/queues/" + encodeURIComponent(g) + "/" + encodeURIComponent(q);
  const o = await api("GET", path + "?since=" + st.qsince);
  const now = Date.now() / 1000;
  // a queue outside the largest has no server history: keep what this page saw
  const pts = o.history.length ? o.history :
    [[now, o.available, o.leased, o.delayed, o.oldest_age_secs || 0, o.rates.enqueue_1m,
      o.rates.lease_1m, o.rates.dequeue_1m]];
  st.qhist = st.qhist.concat(pts).filter((p) => p[0] > now - 3600);
  if (o.history.length) st.qsince = o.history[o.history.length - 1][0];
  $("#qtitle").textContent = clean(name) + (o.is_dead_letter_queue ? "  (a dead-letter queue)"
                                                                     : "");
  $("#qfacts").replaceChildren(
    card("total", fmt(o.total)), card("available", fmt(o.available)),
    card("leased", fmt(o.leased)), card("delayed", fmt(o.delayed)),
    card("oldest available (s)", o.oldest_age_secs == null ? "-" : fmt(o.oldest_age_secs)),
    card("completed", fmt(o.completed)), card("enqueue/s", rate(o.rates.enqueue_1m)),
    card("dequeue/s", rate(o.rates.dequeue_1m)),
    card("mean lease (s)", o.mean_lease_secs == null ? "-" : fmt(o.mean_lease_secs, 2)),
    card("dead letters", fmt(o.dead_letters), o.dead_letters ? "bad" : ""),
    card("paused", o.queue_paused ? "queue paused" : fmt(o.paused || 0),
         o.queue_paused || o.paused ? "bad" : ""),
    card("blocked by a limit", fmt(o.blocked || 0), o.blocked ? "warn" : ""),
    card("keys", fmt(o.keys || 0)));
  if (o.paused_keys && o.paused_keys.length)
    $("#qfacts").append(card("paused keys", o.paused_keys.slice(0, 20).join(", "), "bad"));
  fill($("#qleased tbody"), o.leased_sample.length ? o.leased_sample.map((x) => {
    const tr = el("tr");
    tr.append(pidLink(name, x.pid), el("td", x.worker), el("td", x.worker_addr),
              el("td", fmt(x.lease_age_secs) + "s"), el("td", ago(x.expires_at, now)));
    return tr;
  }) : [trMsg("no task leased recently", 5)]);
  fill($("#qhead tbody"), o.head.length ? o.head.map((x) => {
    const tr = el("tr");
    tr.append(pidLink(name, x.pid), el("td", x.state), el("td", x.attempts),
              el("td", x.worker), el("td", firstLine(x.error), "text"));
    return tr;
  }) : [trMsg("empty", 5)]);
  renderPolicy(o.policy, q);
  fill($("#qsched tbody"), o.schedules.length ? o.schedules.map((s) => {
    const tr = el("tr");
    tr.append(el("td", s.name), el("td", s.interval_secs ? s.interval_secs + "s" : s.cron),
              el("td", ago(s.last_slot, now)), el("td", ago(s.next_slot, now)));
    return tr;
  }) : [trMsg("no schedule feeds this queue", 4)]);
  $("#qdlqtitle").textContent = "Dead letters (in " + clean(o.dead_letter_queue) + ")";
  fill($("#qdlq tbody"), o.dead_letter_sample.length ? o.dead_letter_sample.map((x) => {
    const tr = el("tr", null, "dlq");
    tr.append(pidLink(o.dead_letter_queue, x.pid), el("td", x.attempts),
              el("td", firstLine(x.error), "text"));
    return tr;
  }) : [trMsg("none", 3)]);
  const f = (i) => st.qhist.map((p) => p[i]);
  const cd = chart("c-qdepth", ["available", "leased", "delayed"], ["#1d5fd1", "#a86200", "#8a93a6"]);
  cd.setData([f(0), f(1), f(2), f(3)]);
  const cr = chart("c-qrates", ["enqueue", "lease", "dequeue"], ["#1d5fd1", "#a86200", "#1a7f37"]);
  cr.setData([f(0), f(5), f(6), f(7)]);
  const ca = chart("c-qage", ["oldest (s)"], ["#c0182a"]);
  ca.setData([f(0), f(4)]);
  $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
}

// -- actions -----------------------------------------------------------------------------
// what an action's answer says, in words
function said(r) {
  if (!r || typeof r !== "object") return "";
  if ("moved" in r) return "moved " + r.moved + " task(s) from " + r.source + " back";
  if ("reset" in r) return "made " + r.reset + " leased task(s) available";
  if ("deleted" in r) return "deleted " + r.deleted + " task(s)";
  if ("retried" in r) return r.retried + " is available in " + r.queue + " (it was " +
    (r.was === "dead letter" ? "a dead letter" : r.was) + ")";
  if ("cancelled" in r) return "removed " + r.cancelled + " (it was " + r.state + ")";
  if ("node_id" in r) return "data node " + r.node_id + " is " + r.state;
  return Object.entries(r).filter(([k]) => k !== "ticket")
    .map(([k, v]) => k + " " + (typeof v === "object" ? JSON.stringify(v) : v)).join(", ");
}
function result(ok, text) {
  const b = $("#result");
  b.className = "banner " + (ok ? "ok" : "warn");
  b.dataset.ok = ok ? "1" : "0";
  banner("#result", text + "  (" + new Date().toLocaleTimeString() + ")");
}
async function act(question, method, path, body, what) {
  if (!confirm(question)) return null;
  let r = null;
  try {
    r = await api(method, path, body);
    result(true, (what ? what + ": " : "done: ") + said(r));
  } catch (e) {
    result(false, (what ? what + " " : "") + (e.status === 401 || e.status === 403 ?
      "not allowed (paste an admin credential at the top right): " : "failed: ") + e.message);
  }
  refresh();
  return r;
}
document.querySelectorAll(".actions button[data-act]").forEach((b) => b.addEventListener(
  "click", () => {
    const base = qpath(st.qname), name = clean(st.qname);
    const what = b.dataset.act;
    if (what === "redrive") act("move the dead letters of " + name + " back into it?",
                                "POST", base + "/redrive", { max_tasks: 1000 }, "redrive");
    if (what === "reset") act("make every leased task of " + name + " available now?",
                              "POST", base + "/reset-leases", undefined, "reset leases");
    if (what === "pause" || what === "resume") {
      const key = prompt(what + " " + name + ": a key only (empty: the whole queue)", "");
      if (key === null) return;
      act(what + " " + (key ? "key " + clean(key) + " of " : "") + name + "?", "POST",
          base + "/" + what, key ? { key } : {}, what);
    }
    if (what === "delete") act("DELETE " + name + " and all its tasks?", "DELETE", base,
                               undefined, "delete " + st.qname);
  }));

// -- the task drawer ---------------------------------------------------------------------
function firstLine(text) {
  return text ? String(text).split("\n")[0] : "";
}
async function openTask(queue, pid) {
  st.task = { queue, pid };
  $("#drawer").hidden = false;
  $("#dtitle").textContent = clean(queue) + "  " + clean(pid);
  $("#dpreview").hidden = true;
  clearTask();  // never show the last task's facts under this one's title
  await refreshTask();
  await previewTask(queue, pid);
}
// the payload's first bytes, read by the master from a replica (admins only)
async function previewTask(queue, pid) {
  const pre = $("#dpreview");
  let p;
  try {
    const [g, q] = qsplit(queue);
    p = await api("GET", "/v1/overview/queues/" + encodeURIComponent(g) + "/" +
                  encodeURIComponent(q) + "/payload?bytes=512&pid=" + encodeURIComponent(pid));
  } catch (e) {
    p = { error: e.status === 401 || e.status === 403 ? "the preview needs an admin credential"
                                                     : e.message };
  }
  if (!isOpen(queue, pid)) return;
  if (p.size === 0 && !p.error) { pre.hidden = true; return; }
  pre.hidden = false;
  pre.textContent = p.error ? "(no preview: " + clean(p.error) + ")" :
    (p.utf8 ? cleanLines(p.text) : "binary, first bytes: " + p.hex) +
    (p.shown < p.size ? "\n… (the first " + p.shown + " of " + p.size + " bytes)" : "");
}
// an answer for a task is shown only while that task's drawer is the one open
function isOpen(queue, pid) {
  return !!st.task && st.task.queue === queue && st.task.pid === pid;
}
function closeTask() {
  st.task = null;
  $("#drawer").hidden = true;
}
$("#dclose").addEventListener("click", closeTask);
addEventListener("keydown", (ev) => { if (ev.key === "Escape" && st.task) closeTask(); });
function clearTask() {
  $("#dfacts tbody").replaceChildren();
  $("#derror").textContent = ""; $("#dpayload tbody").replaceChildren();
  $("#dretry").disabled = $("#dcancel").disabled = true;
  $("#dhint").textContent = "";
}
async function refreshTask() {
  if (!st.task) return;
  const { queue, pid } = st.task;
  let t;
  try {
    t = await api("GET", qpath(queue) + "/tasks/" + encodeURIComponent(pid));
  } catch (e) {
    if (!isOpen(queue, pid)) return;  // closed, or another opened
    clearTask();
    kv($("#dfacts tbody"), [["state", e.status === 404 ?
      "gone (done, cancelled, deleted or moved)" : "cannot read it: " + e.message]]);
    return;
  }
  if (!isOpen(queue, pid)) return;  // closed, or another opened
  const now = Date.now() / 1000;
  const dead = !!t.origin && t.origin !== qsplit(queue)[1];
  kv($("#dfacts tbody"), [
    ["state", t.state + (dead ? " (a dead letter of " + qsplit(queue)[0] + "#" + t.origin + ")"
                          : "")],
    ["attempts", t.attempts],
    ["worker", t.worker ? t.worker + (t.worker_addr ? " at " + t.worker_addr : "") : null],
    ["lease expires", t.expires_at ? ago(t.expires_at, now) : null],
    ["available from", t.not_before ? ago(t.not_before, now) : null],
    ["enqueued", t.enqueued_at ? new Date(t.enqueued_at * 1000).toLocaleString() : null]]);
  $("#derror").textContent = t.error ? cleanLines(t.error) : "(none)";
  const p = t.payload;
  kv($("#dpayload tbody"), p ? [["size", bytes(p.size)], ["blob", p.blob_id],
                                ["replicas", (p.replicas || []).join(", ") || "none live"]]
                             : [["size", "no payload"]]);
  const leased = t.state === "leased";
  $("#dretry").disabled = !(dead || t.state === "delayed");
  $("#dcancel").disabled = leased;
  $("#dcancel").textContent = dead ? "delete dead letter" : "cancel task";
  $("#dhint").textContent = leased ? "leased: its worker holds it until the lease ends " +
    "(reset the queue's leases to take it back)" :
    dead ? "retry moves it back into " + t.origin + " with its attempts reset" :
    t.state === "delayed" ? "retry makes it available now" : "";
}
$("#dretry").addEventListener("click", async () => {
  const { queue, pid } = st.task;
  await act("retry " + clean(pid) + " of " + clean(queue) + " now?", "POST",
            qpath(queue) + "/retry", { pid }, "retry " + pid);
  await refreshTask();
});
$("#dcancel").addEventListener("click", async () => {
  const { queue, pid } = st.task;
  const r = await act("remove " + clean(pid) + " from " + clean(queue) +
                      " for good (its payload too)?", "DELETE",
                      qpath(queue) + "/tasks/" + encodeURIComponent(pid), undefined,
                      "remove " + pid);
  if (r) closeTask();
});

// -- a queue's policy, readably -----------------------------------------------------------
function renderPolicy(p, queue) {
  const b = p.backoff;
  kv($("#qpolicy tbody"), [
    ["max attempts", p.max_attempts || "unlimited (default)"],
    ["dead-letter queue", p.dead_letter_queue || queue + ".dead (default)"],
    ["lease", p.lease_secs ? p.lease_secs + " s" : "60 s (default)"],
    ["retry backoff", b ? b.base_secs + " s, x" + b.factor + " per attempt, at most " +
      b.cap_secs + " s, jitter " + b.jitter : "none: a released task is available again at once"],
  ]);
}

// -- routing and the refresh loop --------------------------------------------------------
function route() {
  const m = location.hash.match(/^#\/queue\/([^/]+)\/([^/]+)$/);
  $("#home").hidden = !!m;
  $("#queue").hidden = !m;
  return m ? [decodeURIComponent(m[1]), decodeURIComponent(m[2])] : null;
}
async function refresh() {
  clearTimeout(st.timer);
  try {
    const q = route();
    if (q) await refreshQueue(q[0], q[1]); else await refreshHome();
    await refreshTask();
    banner("#errbanner", "");
  } catch (e) {
    banner("#errbanner", e.status === 401 || e.status === 403 ?
      "the master wants a credential: paste one at the top right (" + e.message + ")" :
      "cannot refresh: " + e.message);
  }
  st.timer = setTimeout(refresh, REFRESH_MS);
}
window.addEventListener("hashchange", refresh);
refresh();
