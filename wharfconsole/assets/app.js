// wharf console. Every value from the server is put in the page as text
// (text nodes and attributes set one by one): never as markup.
"use strict";

const cfg = { read_only: true, auth: false, schema: "", relay_id: "" };
let timer = null;
let renderSeq = 0;

// el builds an element: attrs are set one by one, strings become text nodes.
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  append(e, kids);
  return e;
}

function append(e, kids) {
  for (const k of kids.flat(Infinity)) {
    if (k === undefined || k === null || k === false) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
}

// replace puts kids (flattened; null and false skipped) in place of e's children.
function replace(e, ...kids) {
  e.replaceChildren();
  append(e, kids);
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

class HTTPError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (r.status === 401) {
    location.href = "login";
    throw new HTTPError(401, "log in first");
  }
  let data = null;
  try { data = await r.json(); } catch (_) { data = null; }
  if (!r.ok) throw new HTTPError(r.status, (data && data.error) || (r.status + " " + r.statusText));
  return data;
}
const get = (p) => call("GET", p);
const post = (p, b) => call("POST", p, b);

function toast(msg, isError) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.className = isError ? "error" : "";
  t.hidden = false;
  clearTimeout(toast.t);
  toast.t = setTimeout(() => { t.hidden = true; }, isError ? 8000 : 4000);
}

function fmtDur(s) {
  if (s === null || s === undefined || isNaN(s)) return "–";
  const neg = s < 0;
  s = Math.abs(s);
  let out;
  if (s < 1) out = Math.round(s * 1000) + " ms";
  else if (s < 60) out = s.toFixed(1) + " s";
  else if (s < 3600) out = Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  else if (s < 86400) out = Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  else out = Math.floor(s / 86400) + " d " + Math.round((s % 86400) / 3600) + " h";
  return neg ? "-" + out : out;
}
// fmtTime shows a time in UTC, RFC 3339 to the second, as the CLI does.
function fmtTime(t) {
  if (!t) return "–";
  const d = new Date(t);
  return isNaN(d) ? String(t) : d.toISOString().replace(/\.\d{3}Z$/, "Z");
}
// niceStep is a round axis step (1, 2 or 5 times a power of ten) of
// about span/4.
function niceStep(span) {
  const raw = span / 4, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}
function fmtCount(c) { return (c.exact ? "" : "≈") + c.n.toLocaleString(); }
function pill(text, kind) { return el("span", { class: "pill " + kind }, text); }
function stateKind(s) { return { due: "ok", scheduled: "info", retrying: "warn", held: "info" }[s] || "info"; }
// heldText says what a held message waits for: the earlier message of its key.
function heldText(m) {
  const h = m.held_behind;
  if (!h) return "";
  return "behind " + h.id + " (" + (h.reason === "retrying" ? "retrying at " : "scheduled until ") + fmtTime(h.until) + ")";
}
function statePill(m) {
  if (m.state !== "held") return pill(m.state, stateKind(m.state));
  return el("span", { class: "held", title: "held " + heldText(m) }, pill("held", "info"), " ", el("span", { class: "mono" }, "behind " + m.held_behind.seq));
}

// ---- pages -------------------------------------------------------------

const pages = { overview, relays, lanes, blocked, pending, dead, flows, flow };

function route() {
  const name = (location.hash.replace(/^#\/?/, "").split("?")[0]) || "overview";
  const page = pages[name] ? name : "overview";
  const section = page === "flow" ? "flows" : page;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === section);
  clearInterval(timer);
  timer = null;
  const main = document.getElementById("main");
  replace(main);
  document.body.dataset.page = page;
  document.body.dataset.loaded = "";
  const seq = ++renderSeq;
  pages[page](main, () => seq === renderSeq);
}

// poll runs f now and every ms while the page stays the same; a tick that
// comes while the previous run still waits for its answers is skipped, so
// runs never overlap (an overlapping one could render after a later one).
function poll(current, f, ms) {
  let busy = false;
  const run = async () => {
    if (!current() || busy) return;
    busy = true;
    try { await f(); } catch (e) { if (current()) showError(e); } finally { busy = false; }
    if (current()) document.body.dataset.loaded = "1";
  };
  run();
  timer = setInterval(run, ms);
}

function showError(e) {
  if (e instanceof HTTPError && e.status === 401) return;
  toast(e.message || String(e), true);
}

function card(label, value, kind) {
  return el("div", { class: "card " + (kind || "") }, el("div", { class: "label" }, label), el("div", { class: "value" }, value));
}

// The overview's hist survives page changes: 150 points, 5 minutes. It
// starts with the history the server kept, so the charts are not empty.
const hist = [];
const HISTORY = 150;

// histPoint is a chart point from a status sample (of the history, or the
// status itself, whose counts are objects).
function histPoint(h) {
  const n = (v) => (v !== null && typeof v === "object" ? v.n : v);
  const delivered = h.in_process ? h.in_process.delivered : h.delivered;
  return { t: Date.parse(h.time) / 1000, due: h.due, scheduled: n(h.scheduled), retrying: n(h.retrying), messages: n(h.messages),
    inserted: h.inserted, deleted: h.deleted, delivered: delivered === null ? undefined : delivered, enq: null, out: null, rate: null };
}

// withRates sets a point's rates from the counters' change since prev: rows
// inserted into the outbox (enqueued/s), rows removed from it (delivered,
// dead-lettered or cancelled), and an in-process relay's deliveries.
function withRates(p, prev) {
  if (!prev || p.t <= prev.t) return p;
  const dt = p.t - prev.t;
  if (p.inserted || prev.inserted) {
    p.enq = Math.max(0, (p.inserted - prev.inserted) / dt);
    p.out = Math.max(0, (p.deleted - prev.deleted) / dt);
  }
  if (p.delivered !== undefined && prev.delivered !== undefined) p.rate = Math.max(0, (p.delivered - prev.delivered) / dt);
  return p;
}

function overview(main, current) {
  const cards = el("div", { class: "cards" });
  const charts = el("div", { class: "charts" });
  const note = el("p", { class: "muted" });
  append(main, [el("h1", {}, "Overview"), cards, charts, note]);
  poll(current, async () => {
    const s = await get("api/status");
    if (!current()) return;
    if (!hist.length) for (const h of s.history || []) hist.push(withRates(histPoint(h), hist[hist.length - 1]));
    const prev = hist[hist.length - 1];
    const point = withRates(histPoint(s), prev);
    if (!prev || point.t > prev.t) hist.push(point);
    while (hist.length > HISTORY) hist.shift();

    const live = s.relays.filter((r) => r.live).length;
    replace(cards, 
      card("Due", s.due.toLocaleString()),
      card("Scheduled", fmtCount(s.scheduled)),
      card("Retrying", fmtCount(s.retrying), s.retrying.n > 0 ? "warn" : ""),
      card("Dead letters", fmtCount(s.dead_letters), s.dead_letters.n > 0 ? "bad" : ""),
      card("Oldest due", s.oldest_due_age_s > 0 ? fmtDur(s.oldest_due_age_s) : "none", s.oldest_due_age_s > 60 ? "warn" : ""),
      card("Messages", fmtCount(s.messages)),
      card("Relays live", live + " / " + s.relays.length, live === 0 ? "bad" : ""),
      card("Uncovered lanes", String(s.uncovered.length), s.uncovered.length > 0 ? "bad" : ""),
      s.in_process ? card("Delivered (this process)", s.in_process.delivered.toLocaleString()) : null,
    );
    const rates = [
      { name: "enqueued/s", color: "#6a1b9a", key: "enq" },
      { name: "left the outbox/s", color: "#1f6feb", key: "out" },
    ];
    if (s.in_process) rates.push({ name: "delivered/s (relay in this process)", color: "#2e7d32", key: "rate" });
    replace(charts, 
      chart("Throughput (rows in and out of the outbox table, from PostgreSQL's statistics)", rates),
      chart("Backlog", [
        { name: "due", color: "#2e7d32", key: "due" },
        { name: "scheduled", color: "#1f6feb", key: "scheduled" },
        { name: "retrying", color: "#b26a00", key: "retrying" },
      ]),
    );
    const notes = ["Refreshed every 2 s from " + cfg.schema + "."];
    if (!s.messages.exact) notes.push("Counts marked ≈ are estimated from a sample of a large table.");
    if (s.oldest_due_unknown.length) notes.push("Lanes " + s.oldest_due_unknown.join(", ") + " start with many scheduled messages: their oldest due message was not looked for.");
    if (s.dead_tuples > 100000) notes.push(s.dead_tuples.toLocaleString() + " dead rows in the outbox: vacuum is falling behind (a long transaction?).");
    note.textContent = notes.join(" ");
  }, 2000);
}

function chart(title, series) {
  const W = 600, H = 180, L = 48, B = 18, T = 8, R = 8;
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
  const pts = hist;
  let maxV = 0, minV = 0;
  for (const s of series) for (const p of pts) {
    const v = p[s.key];
    if (v === null || v === undefined) continue;
    maxV = Math.max(maxV, v);
    minV = Math.min(minV, v);
  }
  if (maxV === minV) maxV = minV + 1;
  const step = niceStep(maxV - minV);
  minV = Math.floor(minV / step + 1e-9) * step;
  maxV = Math.ceil(maxV / step - 1e-9) * step;
  const decimals = (String(+step.toPrecision(3)).split(".")[1] || "").length;
  const t0 = pts.length ? pts[0].t : 0, t1 = pts.length ? pts[pts.length - 1].t : 1;
  const x = (t) => L + (W - L - R) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = (v) => T + (H - T - B) * (1 - (v - minV) / (maxV - minV));
  for (let v = minV; v <= maxV + step / 2; v += step) {
    box.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#e1e5eb" }));
    const lab = svg("text", { x: L - 4, y: y(v) + 4, "text-anchor": "end", "font-size": 10, fill: "#6b7585" });
    lab.textContent = ((Math.abs(v) < step / 1e6 ? 0 : v)).toLocaleString(undefined, { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
    box.append(lab);
  }
  const span = svg("text", { x: W - R, y: H - 4, "text-anchor": "end", "font-size": 10, fill: "#6b7585" });
  span.textContent = pts.length > 1 ? "last " + fmtDur(t1 - t0) : "collecting…";
  box.append(span);
  for (const s of series) {
    const coords = pts.filter((p) => p[s.key] !== null && p[s.key] !== undefined).map((p) => x(p.t).toFixed(1) + "," + y(p[s.key]).toFixed(1));
    if (coords.length) box.append(svg("polyline", { points: coords.join(" "), fill: "none", stroke: s.color, "stroke-width": 2 }));
  }
  const legend = el("div", { class: "legend" }, series.map((s) => {
    const last = [...pts].reverse().find((p) => p[s.key] !== null && p[s.key] !== undefined);
    const i = el("i");
    i.style.background = s.color;
    return el("span", {}, i, s.name + (last ? ": " + ((Math.round(last[s.key] * 10) / 10) || 0).toLocaleString() : ""));
  }));
  return el("div", { class: "card chart" }, el("div", { class: "label" }, title), box, legend);
}

function relays(main, current) {
  const body = el("tbody");
  const note = el("p", { class: "muted" });
  append(main, [el("h1", {}, "Relays"), el("table", { id: "relays" },
    el("thead", {}, el("tr", {}, ["Relay", "Host", "PID", "Started", "Last heartbeat", "State", "Lanes held", "Lease left"].map((h) => el("th", {}, h)))),
    body), note]);
  poll(current, async () => {
    const s = await get("api/status");
    if (!current()) return;
    replace(body, ...s.relays.map((r) => el("tr", { "data-relay": r.id },
      el("td", {}, el("span", { class: "mono nowrap" }, r.id), r.id === cfg.relay_id ? el("span", { class: "nowrap muted" }, " (this process)") : ""),
      el("td", {}, r.host), el("td", {}, String(r.pid)), el("td", {}, fmtTime(r.started_at)),
      el("td", {}, fmtDur(r.heartbeat_age_s) + " ago"),
      el("td", {}, r.live ? pill("live", "ok") : pill("not live", "bad")),
      el("td", {}, r.lanes.length + (r.lanes.length ? " (" + r.lanes.join(", ") + ")" : "")),
      el("td", {}, r.lanes.length ? fmtDur(r.lease_left_s) : "–"))));
    if (!s.relays.length) body.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "No relay is registered.")));
    note.textContent = "A relay is live while its heartbeat is younger than the lease TTL (" + fmtDur(s.lease_ttl_s) + "). A stopped or crashed relay stays listed, not live, until a live relay removes it.";
  }, 2000);
}

function lanes(main, current) {
  const summary = el("p");
  const grid = el("div", { class: "lanes", id: "lanes" });
  append(main, [el("h1", {}, "Lanes"), summary, grid]);
  poll(current, async () => {
    const s = await get("api/status");
    if (!current()) return;
    replace(summary, s.uncovered.length
      ? el("span", { class: "error" }, s.uncovered.length + " of 64 lanes have no live lease (highlighted): their messages wait until a live relay claims them.")
      : el("span", {}, "All 64 lanes are leased by a relay."));
    replace(grid, ...s.lanes.map((l) => el("div", { class: "lane" + (l.covered ? "" : " uncovered"), "data-lane": l.lane, title: "lane " + l.lane },
      el("div", { class: "n" }, "Lane " + l.lane),
      el("div", { class: "o" }, l.owner || "free"),
      el("div", { class: "muted" }, "fence " + l.fence),
      el("div", { class: "muted" }, l.owner ? (l.lease_left_s > 0 ? "lease " + fmtDur(l.lease_left_s) : "expired " + fmtDur(-l.lease_left_s) + " ago") : "–"))));
  }, 2000);
}

function blocked(main, current) {
  const body = el("tbody");
  const note = el("div");
  append(main, [el("h1", {}, "Blocked keys"),
    el("p", { class: "muted" }, "Keys whose first pending message is scheduled for later or waits for a retry: every later message of the key waits behind it."),
    note,
    el("table", { id: "blocked" },
      el("thead", {}, el("tr", {}, ["Topic", "Key", "Why", "First message", "Deliver at / next attempt", "Attempts", "Last error", "Waiting behind", "Lane"].map((h) => el("th", {}, h)))),
      body)]);
  poll(current, async () => {
    const b = await get("api/blocked");
    if (!current()) return;
    replace(body, ...b.keys.map((k) => el("tr", { "data-key": k.key },
      el("td", {}, k.topic), el("td", { class: "mono" }, k.key),
      el("td", {}, pill(k.reason, k.reason === "retrying" ? "warn" : "info")),
      el("td", { class: "mono" }, el("a", { href: "#/pending", onclick: () => { pendingFilter = { id: k.head_id, key: "", topic: "" }; } }, k.head_id)),
      el("td", {}, fmtTime(k.reason === "retrying" ? k.next_attempt_at : k.deliver_at)),
      el("td", {}, String(k.attempts)),
      el("td", { class: "mono" }, k.last_error || "–"),
      el("td", {}, (k.waiting_at_least ? "≥ " : "") + k.waiting.toLocaleString()),
      el("td", {}, String(k.lane)))));
    if (!b.keys.length) body.append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No key is blocked.")));
    const notes = [];
    if (b.more) notes.push("More keys are blocked than shown (the oldest " + b.keys.length + " are listed).");
    if (b.unscanned_lanes.length) notes.push("Lanes " + b.unscanned_lanes.join(", ") + " hold more than " + b.scan_bound + " messages: keys first scheduled past that point are not listed (retrying ones are).");
    replace(note, ...notes.map((n) => el("p", { class: "note" }, n)));
  }, 5000);
}

// ---- messages (pending and dead) -------------------------------------

let pendingFilter = { id: "", key: "", topic: "" };
let deadFilter = { id: "", topic: "" };

function filterForm(fields, state, onSubmit) {
  const inputs = {};
  const form = el("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); for (const f of fields) state[f.name] = inputs[f.name].value.trim(); onSubmit(); } },
    fields.map((f) => {
      inputs[f.name] = el("input", { name: f.name, id: "filter-" + f.name, placeholder: f.placeholder, value: state[f.name] || "", size: f.size || 24 });
      return el("label", {}, f.label, inputs[f.name]);
    }),
    el("button", { type: "submit", class: "primary", id: "search" }, "Search"));
  return form;
}

function query(state) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(state)) if (v) q.set(k, v);
  return q.toString();
}

function payloadView(m) {
  return [
    el("h2", {}, "Payload ", el("span", { class: "muted" }, "(" + m.payload.kind + ", " + m.payload.bytes + " bytes)")),
    el("pre", { id: "payload", class: "mono" }, m.payload.body),
    el("h2", {}, "Headers"),
    Object.keys(m.headers).length
      ? el("table", { id: "headers" }, el("tbody", {}, Object.entries(m.headers).sort().map(([k, v]) => el("tr", {}, el("td", { class: "mono" }, k), el("td", { class: "mono" }, v)))))
      : el("p", { class: "muted" }, "none"),
  ];
}

function dl(pairs) {
  return el("dl", {}, pairs.filter((p) => p).map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

// confirmBox shows a question with a confirming and a cancelling button.
function confirmBox(host, question, yesLabel, yesID, onYes) {
  const box = el("div", { class: "confirm", id: yesID + "-box" }, el("p", {}, question),
    el("div", { class: "actions" },
      el("button", { type: "button", class: "danger", id: yesID, onclick: async () => { box.remove(); await onYes(); } }, yesLabel),
      el("button", { type: "button", id: yesID + "-no", onclick: () => box.remove() }, "Keep")));
  host.querySelector(".confirm")?.remove();
  host.append(box);
}

function pending(main, current) {
  const list = el("div");
  const detail = el("div", { class: "detail card", id: "detail", hidden: true });
  let selected = null;
  const load = async () => {
    const r = await get("api/pending?" + query(pendingFilter));
    if (!current()) return;
    const rows = r.messages.map((m) => el("tr", { class: "clickable" + (selected === m.id ? " selected" : ""), "data-id": m.id, onclick: () => { selected = m.id; show(m); for (const tr of list.querySelectorAll("tr")) tr.classList.toggle("selected", tr.dataset.id === m.id); } },
      el("td", { class: "mono" }, m.id), el("td", {}, m.topic), el("td", { class: "mono" }, m.key || "–"),
      el("td", {}, statePill(m)),
      el("td", {}, m.state === "retrying" ? fmtTime(m.next_attempt_at) : m.state === "held" ? "after " + fmtTime(m.held_behind.until) : fmtTime(m.deliver_at)),
      el("td", {}, String(m.attempts)), el("td", {}, fmtTime(m.created_at))));
    replace(list, el("table", { id: "pending" },
      el("thead", {}, el("tr", {}, ["Id", "Topic", "Key", "State", "Deliver at / next attempt", "Attempts", "Enqueued"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No pending message matches.")))),
    r.messages.length >= r.limit ? el("p", { class: "muted" }, "Showing the first " + r.limit + " (oldest first); narrow the search to see others.") : null);
    const again = r.messages.find((m) => m.id === selected);
    if (again) show(again); else { selected = null; detail.hidden = true; }
    document.body.dataset.loaded = "1";
  };
  const show = (m) => {
    detail.hidden = false;
    const actions = el("div", { class: "actions" });
    replace(detail, el("h2", {}, "Message"),
      dl([["Id", el("span", { class: "mono" }, m.id)], ["Position", String(m.seq)], ["Topic", m.topic], ["Key", el("span", { class: "mono", id: "detail-key" }, m.key || "–")],
        ["Lane", String(m.lane)], ["State", pill(m.state, stateKind(m.state))],
        m.held_behind ? ["Held", el("span", { id: "detail-held" }, "waits " + heldText(m) + ": an earlier message of its key that is not delivered yet")] : null,
        ["Enqueued", fmtTime(m.created_at)],
        ["Deliver at", fmtTime(m.deliver_at)], m.dedup_key ? ["Dedup key", m.dedup_key] : null,
        m.attempts ? ["Attempts", String(m.attempts)] : null, m.attempts ? ["Next attempt", fmtTime(m.next_attempt_at)] : null,
        m.last_error ? ["Last error", el("span", { class: "mono error" }, m.last_error)] : null]),
      cfg.read_only ? el("p", { class: "muted", id: "read-only-note" }, "Read-only console: no changes.") : actions,
      payloadView(m));
    if (cfg.read_only) return;
    const at = el("input", { type: "datetime-local", id: "reschedule-at", step: 1 });
    append(actions, [
      el("button", { type: "button", class: "danger", id: "cancel", onclick: () => confirmBox(detail, "Cancel message " + m.id + "? It is deleted from the outbox and never delivered. This cannot be undone.", "Yes, cancel it", "cancel-confirm", async () => {
        try {
          const r = await post("api/pending/cancel", { ids: [m.id] });
          toast(r.cancelled ? "Cancelled " + m.id : "Nothing cancelled: the message was already delivered or removed.");
          await load();
        } catch (e) { showError(e); }
      }) }, "Cancel…"),
      at,
      el("button", { type: "button", id: "reschedule", onclick: async () => {
        if (!at.value) { toast("Pick a date and time to reschedule to (or use Deliver now).", true); return; }
        const when = new Date(at.value);
        if (isNaN(when)) { toast("That date and time cannot be read.", true); return; }
        try {
          const r = await post("api/pending/reschedule", { ids: [m.id], at: when.toISOString() });
          toast("Rescheduled " + r.rescheduled + " message(s) to " + fmtTime(when));
          await load();
        } catch (e) { showError(e); }
      } }, "Reschedule"),
      el("button", { type: "button", id: "deliver-now", onclick: async () => {
        try {
          const r = await post("api/pending/reschedule", { ids: [m.id], at: "" });
          toast("Made " + r.rescheduled + " message(s) due now");
          await load();
        } catch (e) { showError(e); }
      } }, "Deliver now"),
    ]);
  };
  append(main, [el("h1", {}, "Pending messages"),
    filterForm([{ name: "id", label: "Id or position", placeholder: "message id or seq, comma-separated", size: 40 },
      { name: "key", label: "Key", placeholder: "exact key" }, { name: "topic", label: "Topic", placeholder: "exact topic" }],
    pendingFilter, () => load().catch(showError)),
    el("div", { class: "split" }, list, detail)]);
  load().catch(showError);
}

function dead(main, current) {
  const list = el("div");
  const bulk = el("div", { class: "actions" });
  const detail = el("div", { class: "detail card", id: "detail", hidden: true });
  let selected = null;
  const act = async (what, ids) => {
    try {
      const r = await post("api/dead/" + what, { ids });
      toast(what === "retry" ? "Moved " + r.retried + " dead letter(s) back to the outbox" : "Purged " + r.purged + " dead letter(s)");
      await load();
    } catch (e) { showError(e); }
  };
  const load = async () => {
    const r = await get("api/dead?" + query(deadFilter));
    if (!current()) return;
    const rows = r.messages.map((m) => el("tr", { class: "clickable" + (selected === m.id ? " selected" : ""), "data-id": m.id, onclick: () => { selected = m.id; show(m); for (const tr of list.querySelectorAll("tr")) tr.classList.toggle("selected", tr.dataset.id === m.id); } },
      el("td", { class: "mono" }, m.id), el("td", {}, m.topic), el("td", { class: "mono" }, m.key || "–"),
      el("td", {}, String(m.attempts)), el("td", { class: "mono" }, m.last_error), el("td", {}, fmtTime(m.failed_at))));
    replace(list, el("table", { id: "dead" },
      el("thead", {}, el("tr", {}, ["Id", "Topic", "Key", "Attempts", "Last error", "Failed"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No dead letter matches.")))),
    r.messages.length >= r.limit ? el("p", { class: "muted" }, "Showing the first " + r.limit + "; narrow the search to see others.") : null);
    replace(bulk);
    if (!cfg.read_only && r.messages.length) {
      const ids = r.messages.map((m) => m.id);
      append(bulk, [
        el("button", { type: "button", id: "retry-all", onclick: () => act("retry", ids) }, "Retry all " + ids.length + " listed"),
        el("button", { type: "button", class: "danger", id: "purge-all", onclick: () => confirmBox(bulk, "Purge the " + ids.length + " listed dead letters for good? This cannot be undone.", "Yes, purge " + ids.length, "purge-all-confirm", () => act("purge", ids)) }, "Purge all listed…"),
      ]);
    }
    const again = r.messages.find((m) => m.id === selected);
    if (again) show(again); else { selected = null; detail.hidden = true; }
    document.body.dataset.loaded = "1";
  };
  const show = (m) => {
    detail.hidden = false;
    const actions = el("div", { class: "actions" });
    replace(detail, el("h2", {}, "Dead letter"),
      dl([["Id", el("span", { class: "mono" }, m.id)], ["Position", String(m.seq)], ["Topic", m.topic], ["Key", el("span", { class: "mono", id: "detail-key" }, m.key || "–")],
        ["Attempts", String(m.attempts)], ["Failed", fmtTime(m.failed_at)], ["Enqueued", fmtTime(m.created_at)],
        ["Last error", el("span", { class: "mono error" }, m.last_error)], m.dedup_key ? ["Dedup key", m.dedup_key] : null]),
      cfg.read_only ? el("p", { class: "muted", id: "read-only-note" }, "Read-only console: no changes.") : actions,
      payloadView(m));
    if (cfg.read_only) return;
    append(actions, [
      el("button", { type: "button", class: "primary", id: "retry", onclick: () => act("retry", [m.id]) }, "Retry"),
      el("button", { type: "button", class: "danger", id: "purge", onclick: () => confirmBox(detail, "Purge dead letter " + m.id + " for good? This cannot be undone.", "Yes, purge it", "purge-confirm", () => act("purge", [m.id])) }, "Purge…"),
    ]);
  };
  append(main, [el("h1", {}, "Dead letters"),
    el("p", { class: "muted" }, "Retrying moves a dead letter back into the outbox with its id: the relay delivers a key's retried messages in order."),
    filterForm([{ name: "id", label: "Id or position", placeholder: "message id or seq, comma-separated", size: 40 }, { name: "topic", label: "Topic", placeholder: "exact topic" }],
      deadFilter, () => load().catch(showError)),
    bulk,
    el("div", { class: "split" }, list, detail)]);
  load().catch(showError);
}

// ---- flows ---------------------------------------------------------------

let flowFilter = { flow: "", status: "", key: "" };
// flowListRenders counts the Flows page's list renders (body's
// data-flow-list): a render that answers a click is told from the one before.
let flowListRenders = 0;
function flowStatusKind(s) {
  return { running: "ok", done: "ok", failed: "bad", cancelled: "warn" }[s] || "info";
}
function flowPill(s) { return pill(s, flowStatusKind(s)); }
// hashQuery reads the parameters after "?" in the page's hash.
function hashQuery() { return new URLSearchParams(location.hash.split("?")[1] || ""); }
// flowNext says when an instance next moves, per its status.
// stepLabel is the step a list shows: an awaiting instance runs its step
// only once a signal comes.
function stepLabel(i) {
  return i.status === "awaiting" && i.await_signals ? "awaits " + i.await_signals.join(", ") + " → " + i.step : i.step;
}

function flowNext(i, nowMs) {
  const at = i.run_at ? Date.parse(i.run_at) : null;
  switch (i.status) {
    case "ready": return at === null || at <= nowMs ? "due now" : "at " + fmtTime(i.run_at) + " (in " + fmtDur((at - nowMs) / 1000) + ")";
    case "running": return "lease until " + fmtTime(i.run_at);
    case "awaiting": return at === null ? "no deadline" : "deadline " + fmtTime(i.run_at);
    case "joining": return "its children";
    case "failed": return "an operator's retry or cancel";
    default: return "–";
  }
}

function flows(main, current) {
  const summary = el("div", { id: "flow-summary" });
  const list = el("div");
  const pager = el("div", { class: "actions", id: "flow-pager" });
  const body = el("div", {}, summary);
  append(main, [el("h1", {}, "Flows"), body]);
  // cursors are the ?before of the pages seen: [0] is the first (newest).
  let cursors = [0];
  let formBuilt = false;
  const form = () => {
    const inputs = {
      flow: el("input", { name: "flow", id: "flow-filter-flow", placeholder: "exact flow name", value: flowFilter.flow, size: 20 }),
      status: el("select", { name: "status", id: "flow-filter-status" }, el("option", { value: "" }, "any"),
        cfgFlows.statuses.map((s) => el("option", { value: s, selected: flowFilter.status === s }, s))),
      key: el("input", { name: "key", id: "flow-filter-key", placeholder: "exact correlation key", value: flowFilter.key, size: 24 }),
    };
    return el("form", { class: "filters", id: "flow-filters", onsubmit: (e) => {
      e.preventDefault();
      for (const k of Object.keys(inputs)) flowFilter[k] = inputs[k].value.trim();
      cursors = [0];
      loadList().catch(showError);
    } },
    el("label", {}, "Flow", inputs.flow), el("label", {}, "Status", inputs.status), el("label", {}, "Correlation key", inputs.key),
    el("button", { type: "submit", class: "primary", id: "flow-search" }, "Search"));
  };
  const filterTo = (flowName, status) => {
    flowFilter = { flow: flowName, status: status, key: "" };
    cursors = [0];
    replace(formHost, form());
    loadList().catch(showError);
  };
  const formHost = el("div");
  const bulk = el("div", { class: "actions" });
  // Only the latest list request renders: a slower earlier one (the page's
  // first load, answered after a filter's) would otherwise replace the
  // filtered list and any confirmation the user is about to click.
  let listSeq = 0;
  const loadList = async () => {
    const seq = ++listSeq;
    const q = new URLSearchParams(query(flowFilter));
    const before = cursors[cursors.length - 1];
    if (before) q.set("before", before);
    const r = await get("api/flows/instances?" + q.toString());
    if (!current() || seq !== listSeq) return;
    const now = Date.now();
    const rows = r.instances.map((i) => el("tr", { class: "clickable", "data-id": i.id, onclick: () => { location.hash = "#/flow?id=" + i.id; } },
      el("td", { class: "mono" }, el("a", { href: "#/flow?id=" + i.id }, String(i.id))), el("td", {}, i.flow), el("td", { class: "mono" }, i.key || "–"),
      el("td", {}, flowPill(i.status)), el("td", { class: "mono" }, stepLabel(i)), el("td", {}, String(i.attempt)),
      el("td", {}, flowNext(i, now)), el("td", {}, fmtTime(i.created_at)), el("td", { class: "mono error" }, i.error || "")));
    replace(list, el("table", { id: "flow-instances" },
      el("thead", {}, el("tr", {}, ["Id", "Flow", "Key", "Status", "Step", "Attempt", "Next", "Started", "Error"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No instance matches.")))));
    replace(bulk);
    document.body.dataset.flowList = String(++flowListRenders);
    const failedIDs = r.instances.filter((i) => i.status === "failed").map((i) => i.id);
    if (!cfg.read_only && failedIDs.length) {
      append(bulk, [el("button", { type: "button", id: "flow-retry-all", onclick: () => confirmBox(bulk, "Retry the " + failedIDs.length + " failed instance(s) listed? Each runs its failed step again, from attempt 0.", "Yes, retry " + failedIDs.length, "flow-retry-all-confirm", async () => {
        try {
          const res = await post("api/flows/retry", { ids: failedIDs });
          toast("Retried " + res.retried + " instance(s)" + (res.skipped.length ? "; skipped " + res.skipped.join(", ") + " (no longer failed)" : ""));
          await loadList();
        } catch (e) { showError(e); }
      }) }, "Retry the " + failedIDs.length + " failed listed…")]);
    }
    replace(pager,
      cursors.length > 1 ? el("button", { type: "button", id: "flow-newer", onclick: () => { cursors.pop(); loadList().catch(showError); } }, "← Newer") : null,
      el("span", { class: "muted" }, "Page " + cursors.length + ", newest first, " + r.limit + " a page"),
      r.next_before ? el("button", { type: "button", id: "flow-older", onclick: () => { cursors.push(r.next_before); loadList().catch(showError); } }, "Older →") : null);
  };
  const loadSummary = async () => {
    const s = await get("api/flows");
    if (!current()) return;
    Object.assign(cfgFlows, { statuses: s.statuses });
    if (!s.available) {
      replace(body, el("p", { class: "note", id: "flows-missing" }, "Flows are not available: " + s.message + "."));
      return;
    }
    if (!formBuilt) {
      formBuilt = true;
      replace(formHost, form());
      replace(body, summary, el("h2", {}, "Instances"), formHost, bulk, list, pager);
      await loadList();
    }
    const cell = (f, st) => {
      const n = f.counts[st] || 0;
      const label = st === "ready" && f.later ? n.toLocaleString() + " (" + f.later.toLocaleString() + " later)" : n.toLocaleString();
      return el("td", { class: "num" + (st === "failed" && n ? " error" : "") },
        n ? el("a", { href: "#/flows", "data-status": st, onclick: (e) => { e.preventDefault(); filterTo(f.flow, st); } }, label) : el("span", { class: "muted" }, "0"));
    };
    replace(summary, s.flows.length
      ? el("table", { id: "flow-counts" },
        el("thead", {}, el("tr", {}, el("th", {}, "Flow"), s.statuses.map((st) => el("th", { class: "num" }, st)), el("th", { class: "num" }, "total"))),
        el("tbody", {}, s.flows.map((f) => el("tr", { "data-flow": f.flow },
          el("td", {}, el("a", { href: "#/flows", onclick: (e) => { e.preventDefault(); filterTo(f.flow, ""); } }, f.flow)),
          s.statuses.map((st) => cell(f, st)), el("td", { class: "num" }, f.total.toLocaleString())))))
      : el("p", { class: "muted" }, "No flow instance yet."),
    el("p", { class: "muted" }, "ready: due, or scheduled for later (a step's time or a retry's backoff); running: leased by a runner; awaiting: a signal or its deadline; joining: its children; failed instances stay until retried or cancelled; done and cancelled ones are kept for the runners' retention. Counts refresh every 5 s."));
  };
  poll(current, loadSummary, 5000);
}

// cfgFlows holds what the flows summary said about the statuses.
const cfgFlows = { statuses: ["ready", "running", "awaiting", "joining", "done", "failed", "cancelled"] };

function flow(main, current) {
  const id = hashQuery().get("id") || "";
  const head = el("div", { class: "detail card" });
  const info = el("div");
  const actions = el("div", { id: "flow-actions" });
  const rest = el("div");
  append(main, [el("p", {}, el("a", { href: "#/flows" }, "← Flows")), el("h1", {}, "Flow instance " + id), head, actions, info, rest]);
  let shownStatus = null;
  const act = async (what, body, done) => {
    try {
      const r = await post("api/flows/" + what, body);
      toast(done(r));
      await load();
    } catch (e) { showError(e); }
  };
  const buildActions = (i) => {
    if (cfg.read_only) { replace(actions, el("p", { class: "muted", id: "read-only-note" }, "Read-only console: no changes.")); return; }
    const buttons = el("div", { class: "actions" });
    if (i.status === "failed") {
      buttons.append(el("button", { type: "button", class: "primary", id: "flow-retry", onclick: () => act("retry", { id: i.id }, () => "Instance " + i.id + " will run step " + i.step + " again, from attempt 0") }, "Retry step " + i.step));
    }
    if (i.status !== "done" && i.status !== "cancelled") {
      buttons.append(el("button", { type: "button", class: "danger", id: "flow-cancel", onclick: () => confirmBox(actions, "Cancel instance " + i.id + " and its children that have not ended? A step running now commits nothing. This cannot be undone.", "Yes, cancel it", "flow-cancel-confirm", () => act("cancel", { id: i.id }, (r) => "Cancelled " + r.cancelled + " instance(s)")) }, "Cancel…"));
    }
    const parts = [buttons];
    if (i.status !== "done" && i.status !== "cancelled") {
      const name = el("input", { id: "signal-name", placeholder: "signal name", value: (i.await_signals || [])[0] || "", size: 20 });
      const payload = el("textarea", { id: "signal-payload", placeholder: "payload: JSON, optional", rows: 3, cols: 40 });
      const dedup = el("input", { id: "signal-dedup", placeholder: "dedup key, optional", size: 20 });
      parts.push(el("form", { class: "filters", id: "flow-signal-form", onsubmit: (e) => {
        e.preventDefault();
        const body = { id: i.id, name: name.value.trim(), dedup_key: dedup.value.trim() };
        if (!body.name) { toast("Name the signal: the one the flow awaits.", true); return; }
        if (payload.value.trim()) {
          try { body.payload = JSON.parse(payload.value); } catch (_) { toast("The payload is not JSON (quote a string: \"text\").", true); return; }
        }
        act("signal", body, (r) => "Signal " + r.signal + " (" + body.name + ") recorded for instance " + i.id);
      } }, el("label", {}, "Signal", name), el("label", {}, "Payload", payload), el("label", {}, "Dedup key", dedup),
      el("button", { type: "submit", id: "signal-send" }, "Send signal")));
    }
    replace(actions, parts);
  };
  const rowsOf = (items, cols, row, empty, tid) => el("table", { id: tid },
    el("thead", {}, el("tr", {}, cols.map((h) => el("th", {}, h)))),
    el("tbody", {}, items.length ? items.map(row) : el("tr", {}, el("td", { colspan: cols.length, class: "muted" }, empty))));
  const load = async () => {
    let r;
    try {
      r = await get("api/flows/instances/" + encodeURIComponent(id));
    } catch (e) {
      if (!current()) return;
      if (e instanceof HTTPError && (e.status === 404 || e.status === 400)) {
        clearInterval(timer);
        replace(head, el("p", { class: "note", id: "flow-missing" }, e.message));
        replace(actions); replace(info); replace(rest);
        return;
      }
      throw e;
    }
    if (!current()) return;
    const i = r.instance, now = Date.parse(r.time);
    replace(head, dl([
      ["Flow", i.flow], ["Correlation key", el("span", { class: "mono" }, i.key || "–")],
      ["Status", el("span", { id: "flow-status" }, flowPill(i.status))],
      [i.status === "awaiting" ? "Step after the signal" : "Step", el("span", { class: "mono", id: "flow-step" }, i.step)], ["Attempt", String(i.attempt)],
      ["Next", flowNext(i, now)],
      i.status === "ready" ? ["Not before", fmtTime(i.not_before)] : null,
      i.await_signals && i.await_signals.length ? ["Awaits", el("span", { class: "mono" }, i.await_signals.join(", "))] : null,
      i.status === "awaiting" && i.timeout_step ? ["At the deadline", "runs step " + i.timeout_step] : null,
      i.lease_owner ? ["Runner", el("span", { class: "mono" }, i.lease_owner)] : null,
      r.parent ? ["Parent", el("span", {}, el("a", { href: "#/flow?id=" + r.parent.id, id: "flow-parent" }, String(r.parent.id)), " " + r.parent.flow + " (" + r.parent.status + ", step " + r.parent.step + ")")]
        : i.parent_id ? ["Parent", String(i.parent_id) + " (deleted)"] : null,
      ["Priority", String(i.priority)],
      i.concurrency_key ? ["Concurrency key", el("span", { class: "mono" }, i.concurrency_key)] : null,
      i.rate_key ? ["Rate key", el("span", { class: "mono" }, i.rate_key)] : null,
      ["Started", fmtTime(i.created_at)], ["Updated", fmtTime(i.updated_at)], ["Ended", fmtTime(i.finished_at)],
    ]));
    if (shownStatus !== i.status + "/" + i.step) {
      shownStatus = i.status + "/" + i.step;
      buildActions(i);
    }
    replace(info,
      i.error ? [el("h2", {}, i.status === "failed" ? "Error (failed the instance)" : "Last error"), el("pre", { class: "mono error-box", id: "flow-error" }, i.error)] : null,
      el("h2", {}, "State"), el("pre", { class: "mono", id: "flow-state" }, JSON.stringify(i.state, null, 2)),
      i.result !== undefined && i.result !== null ? [el("h2", {}, "Result"), el("pre", { class: "mono", id: "flow-result" }, JSON.stringify(i.result, null, 2))] : null);
    replace(rest,
      el("h2", {}, "Steps (" + r.steps_total + (r.steps_total > i.steps.length ? ", the last " + i.steps.length + " listed" : "") + ")"),
      rowsOf(i.steps, ["Step", "Attempt", "Outcome", "Started", "Took", "Runner", "Error"], (s) => el("tr", {},
        el("td", { class: "mono" }, s.step), el("td", {}, String(s.attempt)), el("td", {}, s.outcome === "fail" ? pill("fail", "bad") : s.outcome === "retry" ? pill("retry", "warn") : s.outcome),
        el("td", {}, fmtTime(s.started_at)), el("td", {}, fmtDur((Date.parse(s.finished_at) - Date.parse(s.started_at)) / 1000)),
        el("td", { class: "mono" }, s.runner), el("td", { class: "mono error" }, s.error || "")), "No step has run yet.", "flow-steps"),
      el("h2", {}, "Signals (" + r.signals_total + (r.signals_total > i.signals.length ? ", the last " + i.signals.length + " listed" : "") + "; " + i.signals.filter((s) => !s.consumed_at).length + " pending)"),
      rowsOf(i.signals, ["Id", "Name", "Received", "Consumed", "Dedup key", "Payload"], (s) => el("tr", { "data-signal": s.id },
        el("td", {}, String(s.id)), el("td", { class: "mono" }, s.name), el("td", {}, fmtTime(s.created_at)),
        el("td", {}, s.consumed_at ? "by step " + s.consumed_step + " at " + fmtTime(s.consumed_at) : pill("pending", "info")),
        el("td", { class: "mono" }, s.dedup_key || "–"), el("td", { class: "mono" }, s.payload === undefined ? "–" : JSON.stringify(s.payload))), "No signal received.", "flow-signals"),
      el("h2", {}, "Children (" + r.children.length + (r.children_more ? "+, the newest listed" : "") + ")"),
      rowsOf(r.children, ["Id", "Flow", "Status", "Step", "Attempt", "Error"], (c) => el("tr", { class: "clickable", "data-id": c.id, onclick: () => { location.hash = "#/flow?id=" + c.id; } },
        el("td", {}, el("a", { href: "#/flow?id=" + c.id }, String(c.id))), el("td", {}, c.flow), el("td", {}, flowPill(c.status)),
        el("td", { class: "mono" }, c.step), el("td", {}, String(c.attempt)), el("td", { class: "mono error" }, c.error || "")), "No children.", "flow-children"),
      el("p", { class: "muted" }, "Outbox messages a step emits commit with its outcome; they are not recorded per instance (find them on the Pending page by topic and key)."));
  };
  poll(current, load, 3000);
}

// ---- start -------------------------------------------------------------

async function start() {
  try {
    Object.assign(cfg, await get("api/config"));
  } catch (e) {
    showError(e);
    return;
  }
  document.getElementById("meta").textContent = "schema " + cfg.schema + (cfg.read_only ? " · read-only" : "");
  document.body.dataset.readOnly = cfg.read_only ? "1" : "";
  document.getElementById("logout").hidden = !cfg.auth;
  window.addEventListener("hashchange", route);
  route();
}

start();
