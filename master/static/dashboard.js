// squall dashboard: polls /v1/overview (and a queue's /v1/overview/queues/...) every few
// seconds, updates tables and uPlot charts in place. Server data is only ever set as
// textContent (never HTML). Actions call the ordinary REST routes with the credential typed
// into the header field, sent as a bearer header (kept in this tab's sessionStorage).
"use strict";
// ?refresh=MS overrides the poll period (at least 250 ms; the browser test uses it)
const REFRESH_MS = Math.max(250, Number(new URLSearchParams(location.search).get("refresh"))
                                 || 3000);
const $ = (s) => document.querySelector(s);
const st = { since: 0, hist: [], qhist: [], qsince: 0, qname: null, sort: "total",
             asc: false, rows: [], charts: {}, timer: null };

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
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
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
  b.textContent = text || "";
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
      b.onclick = () => act("decommission data node " + x.node_id + "?", "POST",
                            "/v1/nodes/" + encodeURIComponent(x.node_id) + "/decommission");
      td.append(b);
    }
    tr.append(td);
    return tr;
  }));
}

function qlink(name) {
  const a = el("a", name);
  const [g, q] = name.split("#");
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
    tr.append(td);
    for (const key of ["total", "available", "leased", "delayed"]) tr.append(el("td", fmt(r[key])));
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
    const reason = r.reasons.length ? r.reasons[0].error : "";
    tr.append(el("td", reason, "text"));
    tr.append(el("td"));
    return tr;
  });
  fill($("#dead tbody"), rows.length ? rows : [trMsg("no dead letters", 4)]);
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
  $("#qtitle").textContent = name + (o.is_dead_letter_queue ? "  (a dead-letter queue)" : "");
  $("#qfacts").replaceChildren(
    card("total", fmt(o.total)), card("available", fmt(o.available)),
    card("leased", fmt(o.leased)), card("delayed", fmt(o.delayed)),
    card("oldest available (s)", o.oldest_age_secs == null ? "-" : fmt(o.oldest_age_secs)),
    card("completed", fmt(o.completed)), card("enqueue/s", rate(o.rates.enqueue_1m)),
    card("dequeue/s", rate(o.rates.dequeue_1m)),
    card("mean lease (s)", o.mean_lease_secs == null ? "-" : fmt(o.mean_lease_secs, 2)),
    card("dead letters", fmt(o.dead_letters), o.dead_letters ? "bad" : ""));
  fill($("#qleased tbody"), o.leased_sample.length ? o.leased_sample.map((x) => {
    const tr = el("tr");
    tr.append(el("td", x.pid), el("td", x.worker), el("td", x.worker_addr),
              el("td", fmt(x.lease_age_secs) + "s"), el("td", ago(x.expires_at, now)));
    return tr;
  }) : [trMsg("no task leased recently", 5)]);
  fill($("#qhead tbody"), o.head.length ? o.head.map((x) => {
    const tr = el("tr");
    tr.append(el("td", x.pid), el("td", x.state), el("td", x.attempts), el("td", x.worker),
              el("td", x.error, "text"));
    return tr;
  }) : [trMsg("empty", 5)]);
  $("#qpolicy").textContent = JSON.stringify(o.policy, null, 2);
  fill($("#qsched tbody"), o.schedules.length ? o.schedules.map((s) => {
    const tr = el("tr");
    tr.append(el("td", s.name), el("td", s.interval_secs ? s.interval_secs + "s" : s.cron),
              el("td", ago(s.last_slot, now)), el("td", ago(s.next_slot, now)));
    return tr;
  }) : [trMsg("no schedule feeds this queue", 4)]);
  $("#qdlqtitle").textContent = "Dead letters (in " + o.dead_letter_queue + ")";
  fill($("#qdlq tbody"), o.dead_letter_sample.length ? o.dead_letter_sample.map((x) => {
    const tr = el("tr", null, "dlq");
    tr.append(el("td", x.pid), el("td", x.attempts), el("td", x.error, "text"));
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
async function act(question, method, path, body) {
  if (!confirm(question)) return;
  try {
    const r = await api(method, path, body);
    banner("#errbanner", "");
    alert("done: " + JSON.stringify(r));
  } catch (e) {
    banner("#errbanner", (e.status === 401 || e.status === 403 ?
      "not allowed (paste an admin credential at the top right): " : "failed: ") + e.message);
  }
  refresh();
}
document.querySelectorAll(".actions button").forEach((b) => b.addEventListener("click", () => {
  const [g, q] = st.qname.split("#");
  const base = "/v1/groups/" + encodeURIComponent(g) + "/queues/" + encodeURIComponent(q);
  const what = b.dataset.act;
  if (what === "redrive") act("move the dead letters of " + st.qname + " back into it?",
                              "POST", base + "/redrive", { max_tasks: 1000 });
  if (what === "reset") act("make every leased task of " + st.qname + " available now?",
                            "POST", base + "/reset-leases");
  if (what === "delete") act("DELETE " + st.qname + " and all its tasks?", "DELETE", base);
}));

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
