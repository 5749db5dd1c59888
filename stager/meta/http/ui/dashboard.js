// stager's live dashboard: polls the JSON API every few seconds and redraws.
// Nothing here comes from elsewhere; every value from the server is set as text.
"use strict";

const TOKEN_KEY = "stager.token";
let refreshMs = 2000;
let authOn = false;
let timer = null;

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
}

const rate = (n) => (n === null || n === undefined ? "–" : bytes(n) + "/s");
const pct = (f) => (100 * (f || 0)).toFixed(1) + "%";

function ago(seconds) {
  if (!isFinite(seconds)) return "never";
  if (seconds < 1) return "now";
  if (seconds < 90) return seconds.toFixed(0) + " s ago";
  if (seconds < 5400) return (seconds / 60).toFixed(0) + " min ago";
  return (seconds / 3600).toFixed(1) + " h ago";
}

function bar(fraction, label, cls) {
  const fill = el("div", { class: "fill " + (cls || "") });
  fill.style.width = Math.max(0, Math.min(1, fraction || 0)) * 100 + "%";
  return el("div", { class: "bar" }, fill, el("span", {}, label));
}

// -- the token ------------------------------------------------------------------------
function token() { return sessionStorage.getItem(TOKEN_KEY); }

function askForToken(message) {
  stop();
  $("board").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("health").className = "health unknown";
  $("health").textContent = "token needed";
  $("token").focus();
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("token").value.trim();
  if (!text) return;
  sessionStorage.setItem(TOKEN_KEY, text);
  $("token").value = "";
  start();
});

$("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  askForToken("");
});

class Unauthorized extends Error {}

async function api(path) {
  const headers = { Accept: "application/json" };
  if (authOn && token()) headers.Authorization = "Bearer " + token();
  const resp = await fetch(path, { headers, cache: "no-store" });
  if (resp.status === 401) throw new Unauthorized("the token was refused");
  const body = await resp.json();
  if (!resp.ok) return { error: body.error || String(resp.status), message: body.message || "" };
  return body;
}

// -- drawing ----------------------------------------------------------------------------
// "in 4 min" until a clock time (seconds), for a down target's "lost at"
function until(at) {
  const s = Math.max(0, at - Date.now() / 1000);
  if (s < 90) return `in ${s.toFixed(0)} s`;
  return s < 5400 ? `in ${(s / 60).toFixed(0)} min` : `in ${(s / 3600).toFixed(1)} h`;
}

function drawHealth(status) {
  const targets = status.targets || [];
  const down = targets.filter((t) => t.state !== "up");
  const metas = status.metas || [];
  const metasDown = metas.filter((m) => m.state !== "up");
  const rebuild = status.rebuild || {};
  let cls = "ok", word = "healthy";
  if (down.length || metasDown.length) {
    cls = status.targets_up ? "warn" : "bad"; word = "degraded";
  }
  if (!status.targets_up) word = "no targets up";
  const parts = [
    `${word}: ${status.targets_up} of ${targets.length} targets up on ${status.nodes} nodes`,
    `${bytes(status.used)} of ${bytes(status.capacity)} used`,
    `${status.files} files, ${bytes(status.bytes)}`,
  ];
  if (metas.length > 1 || metasDown.length) {
    parts.push(`${metas.length - metasDown.length} of ${metas.length} metadata servers up`);
  }
  if (down.length) parts.push("down: " + down.map((t) => `${t.id} (${t.state})`).join(", "));
  if (metasDown.length) {
    parts.push("metadata server down: " + metasDown.map((m) => m.url).join(", "));
  }
  if (rebuild.state && rebuild.state !== "idle") parts.push(`rebuild ${rebuild.state}`);
  $("health").className = "health " + cls;
  $("health").textContent = parts.join(" · ");
}

function drawTargets(status) {
  const now = Date.now() / 1000;
  const speeds = status.throughput || {};
  const lostAt = status.lost_at || {};
  const rows = (status.targets || []).map((t) => {
    const used = t.capacity ? t.used / t.capacity : 0;
    const speed = speeds[t.id] || {};
    const up = t.state === "up";
    return el("tr", { "data-target": t.id, class: up ? "" : "down" },
      el("td", {}, t.node),
      el("td", { class: "mono" }, t.id),
      el("td", {}, el("span", { class: "state " + t.state }, t.state)),
      el("td", {}, bar(used, `${bytes(t.used)} / ${bytes(t.capacity)}`,
                       used > 0.9 ? "bad" : used > 0.75 ? "warn" : "")),
      el("td", { class: "num" }, t.chunks.toLocaleString()),
      el("td", { class: "num" }, ago(now - t.last_heartbeat),
        lostAt[t.id] ? el("div", { class: "lost-at muted" }, `lost ${until(lostAt[t.id])}`)
                     : null),
      el("td", { class: "num" }, up ? rate(speed.read_bytes_per_second) : "–"),
      el("td", { class: "num" }, up ? rate(speed.write_bytes_per_second) : "–"));
  });
  $("targets").tBodies[0].replaceChildren(...rows);
}

function drawMetas(status) {
  const now = Date.now() / 1000;
  const rows = (status.metas || []).map((m) => el("tr", {
    "data-meta": m.url, class: m.state === "up" ? "" : "down" },
    el("td", { class: "mono" }, m.url),
    el("td", {}, el("span", { class: "state " + m.state }, m.state)),
    el("td", {}, m.duties ? "holds the duties" : "–"),
    el("td", { class: "mono" }, m.store),
    el("td", { class: "num" }, ago(now - m.last_seen))));
  $("metas").tBodies[0].replaceChildren(...rows);
}

function drawRebuild(status) {
  const r = status.rebuild || {};
  const box = $("rebuild");
  // a down target is lost (and its rebuild starts) target_lost_after after it went down
  const waiting = Object.entries(status.lost_at || {}).sort((a, b) => a[1] - b[1]).map(
    ([id, at]) => el("p", { class: "lost-at", "data-lost": id },
      `${id} is down: lost ${until(at)} (${new Date(at * 1000).toLocaleTimeString()}), ` +
      "then its chunks are copied"));
  if (!r.state) {
    box.replaceChildren(el("p", { class: "muted" }, "not reported"), ...waiting);
    return;
  }
  const done = r.bytes_total ? 1 - r.bytes_remaining / r.bytes_total : (r.state === "idle" ? 1 : 0);
  const items = [
    ...waiting,
    el("p", {}, el("span", { class: "state " + (r.state === "idle" ? "up" : "suspect") }, r.state),
      r.lost && r.lost.length ? ` lost: ${r.lost.join(", ")}` : ""),
    bar(done, r.bytes_total ? `${bytes(r.bytes_remaining)} remaining of ${bytes(r.bytes_total)}`
                            : waiting.length ? "waiting for a down target" : "nothing to copy"),
    el("p", {}, `files ${r.files_done} of ${r.files_total} · deferred ${r.files_deferred}` +
                ` · copied ${bytes(r.bytes_copied)} at ${rate(r.rate)}`),
  ];
  if (r.unrecoverable_count) {
    items.push(el("p", { class: "error" }, `${r.unrecoverable_count} files unrecoverable`));
  }
  box.replaceChildren(...items);
}

function drawScrub(status) {
  const repair = status.repair || {};
  const last = repair.last_scrub;
  const now = Date.now() / 1000;
  const items = [];
  const scrubs = Object.entries(status.scrubs || {});
  if (scrubs.length) {
    const states = Object.fromEntries((status.targets || []).map((t) => [t.id, t.state]));
    items.push(el("table", { class: "scrubs" }, el("tbody", {}, ...scrubs.map(([id, p]) => {
      if (states[id] !== "up") {      // no heartbeat, no news: what it said last is stale
        return el("tr", { "data-scrub": id }, el("td", { class: "mono" }, id),
          el("td", {}, el("span", { class: "state " + (states[id] || "down") },
                          states[id] || "gone")),
          el("td", { class: "muted" }, `last pass ${p.passes}; no news while not up`));
      }
      const running = p.state === "running";
      const label = running
        ? `${bytes(p.bytes_remaining)} remaining of ${bytes(p.bytes_total)}`
        : p.finished ? `pass ${p.passes} done ${ago(now - p.finished)}: ${bytes(p.bytes_total)}`
          : "no pass yet";
      return el("tr", { "data-scrub": id },
        el("td", { class: "mono" }, id),
        el("td", {}, el("span", { class: "state " + (running ? "running" : "up") }, p.state)),
        el("td", {}, bar(p.bytes_total ? p.bytes_done / p.bytes_total : (running ? 0 : 1),
                         label, p.corrupt_found ? "bad" : "")));
    }))));
  }
  if (last && last.finished) {
    items.push(el("p", {}, `last full scrub ${ago(now - last.finished)}: ` +
      `${(last.checked || 0).toLocaleString()} chunks, ${bytes(last.bytes)} checked in ` +
      `${(last.seconds || 0).toFixed(1)} s`));
    items.push(el("p", { class: last.corrupt ? "error" : "" },
      `${last.corrupt || 0} corrupt, ${last.repaired || 0} repaired, ` +
      `${last.unrecoverable || 0} unrecoverable`));
  } else {
    items.push(el("p", { class: "muted" }, "no cluster-wide scrub (stager scrub) since this " +
      "server started"));
  }
  const pending = repair.pending || 0;
  items.push(el("p", {}, `repairs: ${repair.repaired || 0} done, ${pending} queued, ` +
    `${repair.deferred || 0} deferred`));
  const fsck = status.fsck;
  if (fsck && fsck.finished) {
    items.push(el("p", {}, `last fsck ${ago(now - fsck.finished)}: ` +
      `${fsck.missing || 0} missing, ${fsck.orphans || 0} orphans`));
  }
  $("scrub").replaceChildren(...items);
}

// a table body's rows, or one muted row saying there are none
function fill(table, rows, none) {
  const width = $(table).tHead.rows[0].cells.length;
  $(table).tBodies[0].replaceChildren(...(rows.length ? rows : [
    el("tr", { class: "none" }, el("td", { class: "muted", colSpan: width }, none))]));
}

function drawAttachments(status) {
  const now = Date.now() / 1000;
  fill("attachments", (status.attachments || []).map((a) => {
    const cached = a.bytes ? a.cached_bytes / a.bytes : 0;
    return el("tr", { "data-attachment": a.path },
      el("td", { class: "mono" }, a.path),
      el("td", { class: "mono" }, a.source),
      el("td", { class: "num" }, a.files.toLocaleString()),
      el("td", {}, bar(cached, `${bytes(a.cached_bytes)} / ${bytes(a.bytes)}`)),
      el("td", { class: "num" }, a.hit_ratio === null || a.hit_ratio === undefined
        ? "–" : pct(a.hit_ratio)),
      el("td", { class: "num" }, a.listed ? ago(now - a.listed) : "never"));
  }), "nothing attached (stager attach SRC DST)");
}

function limit(used, max, show) {
  return max === null || max === undefined ? `${show(used)} (no limit)`
                                           : `${show(used)} / ${show(max)}`;
}

function drawQuotas(status) {
  const count = (n) => n.toLocaleString();
  fill("quotas", (status.quotas || []).map((q) => {
    const used = q.bytes ? q.used_bytes / q.bytes : 0;
    return el("tr", { "data-quota": q.path },
      el("td", { class: "mono" }, q.path),
      el("td", {}, q.bytes === null || q.bytes === undefined
        ? limit(q.used_bytes, null, bytes)
        : bar(used, limit(q.used_bytes, q.bytes, bytes),
              used > 0.9 ? "bad" : used > 0.75 ? "warn" : "")),
      el("td", { class: "num" }, limit(q.used_files, q.files, count)));
  }), "no quota (stager quota set PATH --bytes N)");
  fill("pins", (status.pins || []).map((p) => el("tr", { "data-pin": p.path },
    el("td", { class: "mono" }, p.path),
    el("td", {}, p.expires === null || p.expires === undefined ? "until unpinned"
      : `${new Date(p.expires * 1000).toLocaleString()} (${until(p.expires)})`))),
  "no pin (stager pin PATH)");
}

function slowest(entry) {
  const t = (entry.targets || [])[0];
  if (!t) return "–";
  const ms = t.mean_latency !== undefined ? ` (${(1000 * t.mean_latency).toFixed(1)} ms)` : "";
  return t.target + ms;
}

function drawJobs(list) {
  const box = $("jobs");
  if (list.error) {
    box.replaceChildren(el("p", { class: "error" }, `${list.error}: ${list.message}`));
    return;
  }
  const jobs = list.jobs || [];
  if (!jobs.length) {
    box.replaceChildren(el("p", { class: "muted" }, "no loader is reporting"));
    return;
  }
  box.replaceChildren(...jobs.map((job) => {
    const s = job.summary;
    const stall = s.worst_stall_fraction;
    const cls = stall >= 0.3 ? "bad" : stall >= 0.1 ? "warn" : "ok";
    const head = el("h3", {}, el("span", { class: "job-name" }, job.job),
      el("span", { class: "stall " + cls }, `stall ${pct(stall)}`),
      el("span", { class: "muted" }, ` ${s.state} · ${s.ranks} of ${s.world_size} ranks · ` +
        `${s.samples_per_second.toFixed(1)} samples/s · ${bytes(s.bytes)} read`));
    const rows = job.ranks.map((e) => el("tr", {
      "data-rank": e.rank, class: (e.stall_fraction || 0) >= 0.3 ? "starving" : "" },
      el("td", { class: "num" }, e.rank),
      el("td", { class: "num" }, e.worker === null ? "–" : e.worker),
      el("td", {}, e.host || "–"),
      el("td", { class: "num stall-cell" }, pct(e.stall_fraction)),
      el("td", { class: "num" }, pct(e.recent_stall_fraction)),
      el("td", { class: "num" }, (e.samples_per_second || 0).toFixed(1)),
      el("td", { class: "mono" }, slowest(e)),
      el("td", { class: "num" }, ago(e.age))));
    const table = el("table", { class: "ranks" },
      el("thead", {}, el("tr", {}, ...["rank", "worker", "host", "stall", "recent stall",
        "samples/s", "slowest target", "report"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows));
    return el("section", { class: "job", "data-job": job.job }, head, table);
  }));
}

// -- the loop -----------------------------------------------------------------------------
async function refresh() {
  try {
    const [status, jobs] = await Promise.all([api("/v1/status"), api("/v1/jobs")]);
    if (status.error) throw new Error(`${status.error}: ${status.message}`);
    $("error").hidden = true;
    drawHealth(status);
    drawTargets(status);
    drawMetas(status);
    drawRebuild(status);
    drawScrub(status);
    drawAttachments(status);
    drawQuotas(status);
    drawJobs(jobs);
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    if (err instanceof Unauthorized) {
      sessionStorage.removeItem(TOKEN_KEY);
      askForToken("The metadata server refused that token: give another.");
      return;
    }
    $("error").hidden = false;
    $("error").textContent = "metadata server unreachable: " + err.message;
    $("health").className = "health bad";
    $("health").textContent = "unreachable";
  }
  timer = setTimeout(refresh, refreshMs);
}

function stop() {
  if (timer !== null) clearTimeout(timer);
  timer = null;
}

function start() {
  stop();
  $("login").hidden = true;
  $("board").hidden = false;
  $("logout").hidden = !authOn;
  refresh();
}

async function boot() {
  try {
    const config = await (await fetch("config.json", { cache: "no-store" })).json();
    authOn = Boolean(config.auth);
    refreshMs = 1000 * (config.refresh_seconds || 2);
  } catch (err) {
    $("health").textContent = "metadata server unreachable";
  }
  if (authOn && !token()) askForToken("");
  else start();
}

boot();
