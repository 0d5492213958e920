// corral dashboard: plain ES module, no dependencies, no build step.
// Every piece of user or peer text goes into the page with textContent (through el() below), never as markup.
"use strict";

const POLL_MS = 2000;
const LOG_TAIL = 64 * 1024;      // bytes of a log shown when a job is opened
const LOG_KEEP = 256 * 1024;     // characters of log kept in the page while following
const EXPLAIN_MOST = 50;         // queued jobs explained per update (the oldest first)
const FINAL = new Set(["succeeded", "failed", "cancelled", "lost"]);

const state = { me: null, paused: false, timer: null, view: null, job: null, instance: 0, report: null, log: null, busy: false, again: false };

// ------------------------------------------------------------------ building the page safely
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  return node;
}

const $ = (id) => document.getElementById(id);

// ------------------------------------------------------------------ formatting
function mib(value) {
  if (value === null || value === undefined) return "not measured";
  return value >= 1024 ? `${(value / 1024).toFixed(value % 1024 ? 1 : 0)} GiB` : `${value} MiB`;
}

// Booleans in words, everywhere (never `true`/`false`).
function yesNo(value) {
  return value ? "yes" : "no";
}

// Decayed usage (resource-seconds, corral.queue.fairshare) in hours: GPU-hours, CPU-hours, GiB-hours.
const USAGE = {
  gpu_milli: (v) => `${hours(v / 1000)} GPU-hours`, gpu_memory_mib: (v) => `${hours(v / 1024)} GiB-hours of GPU memory`,
  cpu_milli: (v) => `${hours(v / 1000)} CPU-hours`, memory_mib: (v) => `${hours(v / 1024)} GiB-hours of memory`,
};

function hours(seconds) {
  const h = seconds / 3600;
  return h === 0 ? "0" : h < 0.01 ? "< 0.01" : h < 100 ? h.toFixed(2) : h.toFixed(0);
}

function usageText(usage) {
  const parts = Object.entries(usage || {}).filter(([k, v]) => USAGE[k] && v > 0).map(([k, v]) => USAGE[k](v));
  return parts.length ? parts.join(", ") : "none";
}

function gpusText(milli) {
  const whole = milli / 1000;
  return Number.isInteger(whole) ? String(whole) : whole.toFixed(2).replace(/0+$/, "");
}

function when(epoch) {
  if (epoch === null || epoch === undefined) return el("span", { class: "muted", text: "-" });
  const iso = new Date(epoch * 1000).toISOString().replace(/\.\d+Z$/, "Z");
  const s = Math.round(Date.now() / 1000 - epoch);
  const abs = Math.abs(s);
  const amount = abs < 60 ? `${abs} s` : abs < 3600 ? `${Math.round(abs / 60)} min` :
    abs < 86400 ? `${(abs / 3600).toFixed(1)} h` : `${(abs / 86400).toFixed(1)} d`;
  return el("time", { datetime: iso, title: iso, text: s >= 0 ? `${amount} ago` : `in ${amount}` });
}

// A command as a POSIX shell would need it quoted (what `corral show` prints).
function shellQuote(args) {
  return args.map((a) => (a !== "" && /^[A-Za-z0-9_@%+=:,./-]+$/.test(a) ? a : `'${a.replaceAll("'", "'\"'\"'")}'`)).join(" ");
}

// An ISO 8601 instant as the peers' APIs give it, shown as `when` shows epoch seconds.
function whenIso(text) {
  const ms = text ? Date.parse(text) : NaN;
  return Number.isNaN(ms) ? el("span", { class: "muted", text: text || "-" }) : when(ms / 1000);
}

function stateBadge(name) {
  const symbol = { running: "▶", starting: "▷", queued: "…", succeeded: "✓", failed: "✗", lost: "?", cancelled: "■" }[name] || "";
  return el("span", { class: `state state-${name}` }, `${symbol} ${name}`);
}

function jobLink(id) {
  return el("a", { href: `#job/${encodeURIComponent(id)}`, "aria-label": `job ${id}` }, `#${id}`);
}

function grantText(g) {
  return g.milli >= 1000 ? `GPU ${g.index}` : `GPU ${g.index}: ${g.milli}m, ${mib(g.memory_mib)}`;
}

function table(caption, headers, rows, empty) {
  if (!rows.length) return el("p", { class: "muted", text: empty });
  return el("table", {},
    el("caption", { text: caption }),
    el("thead", {}, el("tr", {}, headers.map(([h, cls]) => el("th", { scope: "col", class: cls || null, text: h })))),
    el("tbody", {}, rows));
}

// ------------------------------------------------------------------ talking to the daemon
class Unauthorised extends Error {}

// The session's second half (corral.dashboard.sessions): in this origin's storage, sent beside the HttpOnly cookie.
const CHECK_KEY = "corral-session-check";

async function get(path, kind = "json") {
  const headers = { Accept: "application/json" };
  const check = localStorage.getItem(CHECK_KEY);
  if (check) headers["X-Corral-Session"] = check;
  const answer = await fetch(path, { credentials: "same-origin", headers });
  if (answer.status === 401) throw new Unauthorised("log in");
  if (!answer.ok) {
    let message = `${answer.status}`;
    try { const body = await answer.json(); message = body.detail?.message || body.message || message; } catch { /* not JSON */ }
    const problem = new Error(message);
    problem.status = answer.status;
    throw problem;
  }
  return kind === "json" ? answer.json() : answer;
}

// The one write the page makes: cancelling one of the viewer's own jobs (POST /v1/jobs/ID/cancel). Over TCP the
// session's check goes with it (corral.dashboard.sessions: without it, or from another origin, the daemon answers 401).
async function cancelJob(id) {
  if (!window.confirm(`Cancel job ${id}? Its processes are stopped.`)) return;
  const headers = { Accept: "application/json" };
  const check = localStorage.getItem(CHECK_KEY);
  if (check) headers["X-Corral-Session"] = check;
  const answer = await fetch(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST", credentials: "same-origin", headers });
  let message = `${answer.status}`;
  try { const body = await answer.json(); message = body.detail?.message || message; } catch { /* not JSON */ }
  notice(answer.ok ? `Job ${id}: cancel requested.` : `Could not cancel job ${id}: ${message}`, !answer.ok);
  render(false);
}

// What the page's last action did; stays until the view changes.
function notice(text, bad) {
  $("notice").textContent = text;
  $("notice").className = bad ? "notice problem" : "notice";
  $("notice").hidden = !text;
}

// A cancel button on the viewer's own jobs that have not ended (root's button too: only on root's own).
function cancelButton(job) {
  if (FINAL.has(job.state) || !state.me || job.user !== state.me.user) return null;
  return el("button", { type: "button", class: "cancel", "aria-label": `Cancel job ${job.id}`, onclick: () => cancelJob(job.id) }, "Cancel");
}

async function optional(path) {
  try { return await get(path); } catch (e) { if (e.status === 404) return null; throw e; }
}

// ------------------------------------------------------------------ views
// A holder of a GPU share in words: the job, its name (the caller's own jobs, or root's view), its user.
function holder(h, names) {
  const name = names.get(String(h.job));
  return [h.user === null ? el("span", { text: `#${h.job}` }) : jobLink(h.job),
    ...(name ? [" · ", el("span", { class: "job-name", text: name })] : []), " · ",
    h.user === null ? el("span", { class: "muted", text: "another user" }) : el("span", { text: h.user })];
}

function shareText(h, gpu) {
  return h.milli >= 1000 ? `whole GPU, ${mib(gpu.memory_mib)}` : `${h.milli}m of the GPU, ${mib(h.memory_mib)}`;
}

// Who holds which GPU, one row per share (a free GPU: one row saying so).
function holdersTable(gpus, names) {
  const rows = gpus.flatMap((g) => (g.held.length ? g.held : [null]).map((h) => el("tr", {},
    el("td", { class: "num", text: g.index }), el("td", { class: "mono", text: g.uuid }), el("td", { text: g.model }),
    h === null ? el("td", { colspan: 5, class: "muted", text: "free: no share granted" }) : [
      el("td", {}, h.user === null ? `#${h.job}` : jobLink(h.job)),
      el("td", { text: names.get(String(h.job)) || (h.user === null ? "(not shown)" : "-") }),
      el("td", { text: h.user === null ? "another user" : h.user }),
      el("td", { class: "num", text: h.milli >= 1000 ? "whole GPU" : `${h.milli}m` }),
      el("td", { class: "num", text: mib(h.milli >= 1000 && !h.memory_mib ? g.memory_mib : h.memory_mib) })])));
  return table("One row per share: the GPU, the job holding it and its user (other users' jobs by number only)",
    [["GPU", "num"], ["UUID"], ["Model"], ["Job"], ["Name"], ["User"], ["Share", "num"], ["Memory", "num"]], rows, "No GPUs.");
}

async function viewGpus() {
  const [gpus, history, mine] = await Promise.all([get("/v1/gpus"), get("/ui/api/history"),
    get("/v1/jobs?all=true&state=starting,running&limit=10000")]);
  // Job names come from the jobs the caller may see (their own; root: all): /v1/gpus names no job.
  const names = new Map(mine.filter((j) => j.name).map((j) => [String(j.id), j.name]));
  const samples = new Map(history.gpus.map((g) => [g.index, g.samples]));
  const cards = gpus.map((g) => {
    const granted = g.held.reduce((sum, h) => sum + (h.memory_mib || (h.milli >= 1000 ? g.memory_mib : 0)), 0);
    const shareBar = el("div", { class: "meter", role: "img", "aria-label": `${gpusText(g.granted_milli)} of 1 GPU granted` }, el("span"));
    shareBar.firstChild.style.width = `${Math.min(100, g.granted_milli / 10)}%`;
    const memBar = el("div", { class: "meter mem", role: "img", "aria-label": `${mib(granted)} of ${mib(g.memory_mib)} granted` }, el("span"));
    memBar.firstChild.style.width = `${Math.min(100, (100 * granted) / g.memory_mib)}%`;
    const shares = g.held.length
      ? el("ul", { class: "shares", "aria-label": `shares of GPU ${g.index}` }, g.held.map((h) => el("li", {},
          holder(h, names), " · ", shareText(h, g))))
      : el("p", { class: "label", text: "free: no share granted" });
    return el("article", { class: "card", "aria-labelledby": `gpu-${g.index}` },
      el("h3", { id: `gpu-${g.index}` }, `GPU ${g.index} · ${g.model}`),
      el("div", { class: "label mono", text: g.uuid }),
      el("div", { class: "label", text: `granted: ${gpusText(g.granted_milli)} of the GPU (${g.granted_milli}m)` }), shareBar,
      el("div", { class: "label", text: `memory: used ${mib(g.used_memory_mib)}, granted ${mib(granted)} of ${mib(g.memory_mib)}` +
        (g.foreign_memory_mib ? `, outside corral ${mib(g.foreign_memory_mib)}` : "") }), memBar,
      sparkline(g, samples.get(g.index) || []),
      shares);
  });
  return [el("h2", { tabindex: "-1", text: `GPUs (${gpus.length})` }), el("div", { class: "grid" }, cards),
    el("h3", { text: "Who holds which GPU" }), holdersTable(gpus, names)];
}

function sparkline(gpu, samples) {
  const width = 260, height = 40;
  const measured = samples.some((s) => s[3] !== null);
  const label = `last ${samples.length} samples: share granted (solid)` +
    (measured ? ", utilisation (dashed)" : "; utilisation not measured on this GPU");
  const box = svg("svg", { class: "spark", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img", "aria-label": `GPU ${gpu.index}: ${label}` });
  box.append(svg("rect", { x: 0.5, y: 0.5, width: width - 1, height: height - 1 }));
  const line = (values, cls) => {
    if (values.length < 2) return;
    const step = (width - 4) / (values.length - 1);
    const points = values.map((v, i) => `${(2 + i * step).toFixed(1)},${(height - 2 - (Math.min(100, v) / 100) * (height - 4)).toFixed(1)}`);
    box.append(svg("polyline", { class: cls, points: points.join(" ") }));
  };
  line(samples.map((s) => s[1] / 10), "granted");
  if (measured) line(samples.map((s) => s[3] ?? 0), "util");
  const last = samples.length ? samples[samples.length - 1] : null;
  const caption = el("div", { class: "label" }, last && last[3] !== null ? `utilisation ${last[3]}% now` : "utilisation: not measured (simulated GPU, or no NVML)");
  return el("figure", { class: "spark-fig" }, box, caption);
}

async function viewQueue() {
  const queued = await get("/v1/jobs?all=true&state=queued&limit=500");
  const explained = new Map();
  await Promise.all(queued.slice(0, EXPLAIN_MOST).map(async (j) => {
    try { explained.set(j.id, await get(`/v1/jobs/${encodeURIComponent(j.id)}/explain`)); } catch (e) { if (e instanceof Unauthorised) throw e; }
  }));
  const order = (j) => explained.get(j.id)?.position ?? Infinity;
  queued.sort((a, b) => order(a) - order(b) || Number(a.id) - Number(b.id));
  const rows = queued.map((j) => {
    const x = explained.get(j.id) || {};
    const wants = j.request ? `${j.request.gpu_count ? `${j.request.gpu_count} × ${j.request.gpu_milli >= 1000 ? "GPU" : `${j.request.gpu_milli}m` + (j.request.gpu_memory_mib ? `/${mib(j.request.gpu_memory_mib)}` : "")}` : "no GPU"}, ${j.request.cpu_milli / 1000} CPU, ${mib(j.request.memory_mib)}` : "";
    const start = x.estimated_start ? when(x.estimated_start) :
      x.reservation ? el("span", { class: "muted", text: `after job ${x.reservation.job} (head, reserved)` }) : el("span", { class: "muted", text: "not estimated" });
    return el("tr", {},
      el("td", { class: "num", text: x.position ? `${x.position} of ${x.queued}` : "-" }),
      el("td", {}, jobLink(j.id)), el("td", { text: j.user }), el("td", { text: j.name || "" }), el("td", { text: wants }),
      el("td", { class: "reason" }, el("span", { text: j.reason || "waiting for its first round" }),
        x.story ? el("div", { class: "label", text: x.story }) : null),
      el("td", {}, start), el("td", {}, when(j.submitted_at)));
  });
  return [el("h2", { tabindex: "-1", text: `Queue (${queued.length} waiting)` }),
    table("Queued jobs in the order they start, why each waits, and the head's estimated start",
      [["Position", "num"], ["Job"], ["User"], ["Name"], ["Wants"], ["Why it waits"], ["Estimated start"], ["Submitted"]],
      rows, "Nothing is waiting.")];
}

// Resource amounts as the queues API gives them ({"gpus": 2, "gpu_memory": 40960, ...}), in words.
const AMOUNT = {
  gpus: (v) => `${v} GPU${v === 1 ? "" : "s"}`, gpu_milli: (v) => `${gpusText(v)} GPU (${v}m)`,
  gpu_memory: (v) => `${mib(v)} GPU memory`, gpu_memory_mib: (v) => `${mib(v)} GPU memory`,
  cpus: (v) => `${v / 1000} CPU`, cpu_milli: (v) => `${v / 1000} CPU`, memory: (v) => mib(v), memory_mib: (v) => mib(v),
};

function amounts(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value === "boolean") return yesNo(value);
  if (Array.isArray(value)) return value.length ? value.map((v) => amounts(v)).join(", ") : "none";
  if (typeof value !== "object") return typeof value === "number" && !Number.isInteger(value) ? value.toFixed(3) : String(value);
  const parts = Object.entries(value).filter(([, v]) => v !== null && v !== 0)
    // gpus may be a fraction (shares count by their part: 1.8 GPUs); the other amounts are whole base units
    .map(([k, v]) => (AMOUNT[k] && typeof v === "number" ? AMOUNT[k](k === "gpus" ? v : Math.round(v)) : `${k} ${amounts(v)}`));
  return parts.length ? parts.join(", ") : "none";
}

function queuesTable(body) {
  // GET /v1/queues: {"default_queue", "fair_share", "queues": [{"name", "weight", "in_use", "limit", ...}]}
  const list = Array.isArray(body) ? body : body.queues || [];
  const known = ["name", "weight", "max_priority", "running", "pending", "in_use", "guarantee", "limit", "borrow_limit", "borrowing", "borrowing_jobs", "below_guarantee"];
  const extra = [...new Set(list.flatMap((q) => Object.keys(q)))].filter((k) => !known.includes(k) && k !== "default" && k !== "missing");
  const columns = [...known.filter((k) => list.some((q) => k in q)), ...extra];
  // borrowing_jobs: the ids of the running jobs above the guarantee (a list: each one a link, none when empty)
  const cell = (q, k) => k === "name" ? `${q.name}${q.default ? " (default)" : ""}${q.missing ? " (removed: jobs still wait in it)" : ""}` :
    k === "borrowing_jobs" && Array.isArray(q[k]) ? (q[k].length ? q[k].flatMap((id, i) => [i ? ", " : null, jobLink(id)]) : "none") :
    amounts(q[k]);
  const rows = list.map((q) => el("tr", {}, columns.map((k) => el("td", { class: typeof q[k] === "number" ? "num" : null }, cell(q, k)))));
  return table(`Queues${body.fair_share === false ? " (fair share off)" : ""}`, columns.map((k) => [k.replaceAll("_", " ")]), rows, "No queues are defined.");
}

function sharesTable(body) {
  // GET /v1/shares (sshare): {"accounts": [{"queue", "user" (null: the queue's own row), "weight", "norm_shares", ...}]}
  const rows = (body.accounts || []).map((a) => el("tr", {},
    el("td", { text: a.queue }), el("td", { text: a.user === null ? "(the queue)" : a.user }),
    ["weight", "norm_shares", "dominant_share", "effective_usage", "fairshare_factor"].map((k) => el("td", { class: "num", text: amounts(a[k]) })),
    el("td", { text: usageText(a.usage) })));
  return table("Fair share: each queue, and each user in it (usage decays with a half-life" +
    (body.half_life_s ? ` of ${(body.half_life_s / 86400).toFixed(1)} days)` : ")"),
    [["Queue"], ["User"], ["Weight", "num"], ["Normalised shares", "num"], ["Dominant share", "num"], ["Effective usage", "num"], ["Fair-share factor", "num"], ["Usage (decayed, in hours)"]],
    rows, "No usage recorded yet.");
}

async function viewUsers() {
  const [jobs, gpus, queues, shares] = await Promise.all([
    get("/v1/jobs?all=true&state=queued,starting,running&limit=10000"), get("/v1/gpus"), optional("/v1/queues"), optional("/v1/shares")]);
  const users = new Map();
  const row = (name) => users.get(name) || users.set(name, { running: 0, queued: 0, milli: 0, memory: 0 }).get(name);
  const sizes = new Map(gpus.map((g) => [g.index, g.memory_mib]));
  for (const j of jobs) {
    const u = row(j.user);
    if (j.state === "queued") u.queued += 1; else u.running += 1;
    for (const g of j.gpus) { u.milli += g.milli; u.memory += g.memory_mib || (g.milli >= 1000 ? sizes.get(g.index) || 0 : 0); }
  }
  // Other users' shares show in /v1/gpus without a name: counted together, as the API shows them.
  for (const g of gpus) for (const h of g.held) if (h.user === null) {
    const u = row("(other users)");
    u.milli += h.milli; u.memory += h.memory_mib || (h.milli >= 1000 ? g.memory_mib : 0);
  }
  const total = gpus.length * 1000 || 1;
  const rows = [...users.entries()].sort((a, b) => b[1].milli - a[1].milli || a[0].localeCompare(b[0])).map(([name, u]) =>
    el("tr", {}, el("td", { text: name }), el("td", { class: "num", text: name === "(other users)" ? "-" : u.running }),
      el("td", { class: "num", text: name === "(other users)" ? "-" : u.queued }),
      el("td", { class: "num", text: `${gpusText(u.milli)} (${Math.round((100 * u.milli) / total)}% of ${gpus.length})` }),
      el("td", { class: "num", text: mib(u.memory) })));
  const parts = [el("h2", { tabindex: "-1", text: "Users" }),
    table(state.me?.root ? "Every user's work now" : "Your work now (other users' shares without names)",
      [["User"], ["Running", "num"], ["Queued", "num"], ["GPUs held", "num"], ["GPU memory granted", "num"]], rows, "Nobody runs or waits now.")];
  parts.push(el("h3", { text: "Queues and fair share" }));
  if (queues === null && shares === null) {
    parts.push(el("p", { class: "muted", text: "This daemon has no queues (GET /v1/queues is not there): no fair-share figures to show." }));
  }
  if (queues !== null) parts.push(queuesTable(queues));
  if (shares !== null) parts.push(sharesTable(shares));
  return parts;
}

async function viewJobs() {
  const jobs = await get("/v1/jobs?all=true&order=newest&limit=100");
  const rows = jobs.map((j) => el("tr", {},
    el("td", {}, jobLink(j.id)), el("td", {}, stateBadge(j.state)), el("td", { text: j.user }), el("td", { text: j.name || "" }),
    el("td", { class: "mono", text: shellQuote(j.command) }), el("td", { text: j.gpus.map(grantText).join(", ") || "-" }),
    el("td", {}, when(j.submitted_at)), el("td", { class: "num", text: j.exit_code ?? "-" }), el("td", {}, cancelButton(j))));
  return [el("h2", { tabindex: "-1", text: `Jobs (newest ${jobs.length})` }),
    table("Your jobs, newest first" + (state.me?.root ? " (root: everyone's)" : ""),
      [["Job"], ["State"], ["User"], ["Name"], ["Command"], ["GPUs"], ["Submitted"], ["Exit", "num"], ["Action"]], rows, "No jobs yet.")];
}

// Where instance K of a gang writes its log (corral.daemon.gang.instance_log): "7.log" is instance 0's, "7.2.log" 2's.
function instanceLogPath(path, k) {
  if (!path || k === 0) return path;
  const slash = path.lastIndexOf("/") + 1, dot = path.lastIndexOf(".");
  return dot > slash ? `${path.slice(0, dot)}.${k}${path.slice(dot)}` : `${path}.${k}`;
}

// A gang's instances, one row each: its number (a link that shows its log below), its GPUs and whether it is shown.
// The job's `gpus` lists every instance's grants, instance by instance (k each).
function instancesTable(job, shown) {
  const n = job.instances, k = job.gpus.length % n === 0 ? job.gpus.length / n : null;
  const rows = [];
  for (let i = 0; i < n; i++) {
    const grants = k === null ? null : job.gpus.slice(i * k, (i + 1) * k);
    const here = i === shown;
    rows.push(el("tr", { class: here ? "selected" : null },
      el("th", { scope: "row" }, el("a", { href: `#job/${encodeURIComponent(job.id)}/instance/${i}`, "aria-current": here ? "true" : null,
        "aria-label": `instance ${i} of job ${job.id}${here ? " (its log is shown)" : ""}` }, `instance ${i}`)),
      el("td", { text: grants === null ? "(not known per instance)" : grants.map(grantText).join(", ") || "-" }),
      el("td", { text: here ? "shown below" : "-" })));
  }
  return table(`A gang: ${n} processes started together, each with its own grant and its own log (choose one to see it)`,
    [["Instance"], ["GPUs"], ["Log"]], rows, "");
}

async function viewJob(id, instance = 0) {
  let job;
  try { job = await get(`/v1/jobs/${encodeURIComponent(id)}`); } catch (e) {
    if (e.status === 404) return [el("h2", { tabindex: "-1", text: `Job ${id}` }), el("p", { text: `No job ${id} that you may see.` })];
    throw e;
  }
  const explain = await get(`/v1/jobs/${encodeURIComponent(id)}/explain`);
  const n = job.instances || 1, gang = n > 1;
  const exists = instance < n;
  if (state.log?.id !== job.id || state.log.instance !== instance) state.log = { id: job.id, instance, text: "", next: null, decoder: new TextDecoder() };
  const log = state.log;
  if (exists) {
    const base = `/v1/jobs/${encodeURIComponent(id)}/logs?` + (gang ? `instance=${instance}&` : "");
    const answer = await get(base + (log.next === null ? `tail=${LOG_TAIL}` : `offset=${log.next}`), "raw");
    const fresh = log.decoder.decode(new Uint8Array(await answer.arrayBuffer()), { stream: true });
    if (log.next === null && Number(answer.headers.get("X-Corral-Next-Offset")) > LOG_TAIL) log.text = `[… earlier output not shown: the last ${LOG_TAIL / 1024} KiB follow]\n`;
    log.text = (log.text + fresh).slice(-LOG_KEEP);
    log.next = Number(answer.headers.get("X-Corral-Next-Offset"));
  }
  const r = job.request || {};
  const field = (name, value) => [el("dt", { text: name }), el("dd", {}, value)];
  const whose = gang ? `instance ${instance} of job ${job.id}` : `job ${job.id}`;
  const pre = el("pre", { class: "log", tabindex: "0", "aria-label": `log of ${whose}` }, log.text || "(no output yet)");
  const live = !FINAL.has(job.state);
  const which = gang ? ` of instance ${instance}` : "";
  return [
    el("h2", { tabindex: "-1" }, `Job ${job.id} `, stateBadge(job.state)),
    el("p", { class: "actions" }, el("a", { href: "#jobs" }, "← all jobs"), " ", cancelButton(job)),
    el("dl", { class: "fields" },
      field("Name", job.name || "-"), field("User", job.user), field("Command", el("code", { text: shellQuote(job.command) })),
      field("Why", el("span", { class: "reason", text: [explain.reason, explain.story].filter(Boolean).join("\n") || "-" })),
      field("Position", explain.position ? `${explain.position} of ${explain.queued}` : "-"),
      field("Estimated start", explain.estimated_start ? when(explain.estimated_start) : "-"),
      field("GPUs", job.gpus.map(grantText).join(", ") || "-"),
      field("Asked for", (gang ? `${n} instances, each ` : "") + `${r.gpu_count || 0} GPU${r.gpu_count === 1 ? "" : "s"}` + (r.gpu_count && r.gpu_milli < 1000 ? ` of ${r.gpu_milli}m, ${mib(r.gpu_memory_mib)}${gang && r.gpu_count === 1 ? "" : " each"}` : "") +
        `, ${(r.cpu_milli || 0) / 1000} CPU, ${mib(r.memory_mib || 0)}` + (r.gpu_models ? `, models ${r.gpu_models.join(", ")}` : "")),
      field("Time limit", r.time_limit_s ? `${r.time_limit_s} s` : "none"), field("Working directory", el("code", { text: r.cwd || "/" })),
      field("Environment", `${r.env_count ?? 0} variables (values are not shown)`),
      field("Submitted", when(job.submitted_at)), field("Started", when(job.started_at)), field("Finished", when(job.finished_at)),
      field("Exit code", job.exit_code ?? "-"), field("Attempts", job.attempts),
      field("Preemptible", yesNo(job.preemptible)),
      field(gang ? `Log file${which}` : "Log file", el("code", { text: (exists && instanceLogPath(job.log_path, instance)) || "-" }))),
    gang && el("h3", { text: `Instances (${n})` }),
    gang && instancesTable(job, instance),
    exists ? el("h3", {}, (live ? "Log (live: the last lines, following)" : "Log (the job has ended)").replace("Log", `Log${which}`))
      : el("p", { class: "problem", role: "alert", text: `Job ${job.id} has ${n === 1 ? "instance 0 only" : `instances 0 to ${n - 1}`}, not instance ${instance}.` }),
    exists && pre,
  ];
}

// ------------------------------------------------------------------ Marathon apps and job definitions (read-only)
// What the API lets the viewer see, as the API shows it: their own apps and definitions (root: everyone's).
const APPS = "/marathon/v2/apps";

function appLink(id) {
  return el("a", { href: `#app${id}` }, id);  // Marathon ids start with "/"
}

function gpuCount(n) {
  return `${n || 0} GPU${n === 1 ? "" : "s"}`;
}

// Marathon's port definitions (port 0: any free port, chosen at each launch) or a task's ports.
function ports(list) {
  return (list || []).map((p) => (p.port ?? p) === 0 ? "any free port" : p.port ?? p).join(", ") || "-";
}

async function viewApps() {
  const { apps } = await get(`${APPS}?embed=apps.tasks&corral=true`);
  apps.sort((a, b) => a.id.localeCompare(b.id));
  const rows = apps.map((a) => el("tr", {},
    el("td", {}, appLink(a.id)), el("td", { text: a.corral?.user ?? "-" }),
    el("td", { class: "num", text: `${a.tasksRunning} of ${a.instances}` }),
    el("td", { text: a.deployments.length ? "deploying" : "at its target" }),
    el("td", { class: "mono", text: a.cmd ?? (a.args ? shellQuote(a.args) : a.container?.docker?.image ?? "-") }),
    el("td", { text: `${gpuCount(a.gpus)}, ${a.cpus} CPU, ${mib(a.mem)}` }),
    el("td", { class: "reason", text: a.corral?.waiting || "-" })));
  return [el("h2", { tabindex: "-1", text: `Marathon apps (${apps.length})` }),
    table("Long-running services made through Marathon's API (read-only here: change them with a Marathon client)" +
      (state.me?.root ? " (root: everyone's)" : ""),
      [["App"], ["User"], ["Running", "num"], ["Deployment"], ["Command"], ["Each instance asks for"], ["Why instances wait"]],
      rows, "No Marathon apps.")];
}

async function viewApp(id) {
  let app;
  try { ({ app } = await get(`${APPS}${id.split("/").map(encodeURIComponent).join("/")}?corral=true`)); } catch (e) {
    if (e.status === 404) return [el("h2", { tabindex: "-1", text: `App ${id}` }), el("p", { text: `No app ${id} that you may see.` })];
    throw e;
  }
  const field = (name, value) => [el("dt", { text: name }), el("dd", {}, value)];
  const labels = Object.entries(app.labels || {});
  const tasks = (app.tasks || []).map((t) => el("tr", {},
    el("td", { class: "mono", text: t.id }), el("td", { text: t.state.replace(/^TASK_/, "").toLowerCase() }),
    el("td", {}, t.corral?.job ? jobLink(t.corral.job) : "-"),
    el("td", { text: (t.corral?.gpus || []).map((g) => `GPU ${g.index} (${g.model})`).join(", ") || "-" }),
    el("td", { text: ports(t.ports) }), el("td", {}, whenIso(t.startedAt)),
    el("td", { text: t.healthCheckResults.length ? t.healthCheckResults.map((h) => `healthy: ${yesNo(h.alive)}`).join(", ") : "no health checks" })));
  return [
    el("h2", { tabindex: "-1", text: `App ${app.id}` }),
    el("p", {}, el("a", { href: "#apps" }, "← all apps")),
    el("dl", { class: "fields" },
      field("User", app.corral?.user ?? "-"), field("Instances", `${app.tasksRunning} running of ${app.instances}` +
        ` (${app.tasksHealthy} healthy, ${app.tasksUnhealthy} unhealthy, ${app.tasksStaged} staged)`),
      field("Deployment", app.deployments.length ? "deploying (not yet at its target)" : "at its target"),
      field("Command", el("code", { text: app.cmd ?? (app.args ? shellQuote(app.args) : "-") })),
      field("Image", app.container?.docker?.image ?? "-"),
      field("Each instance asks for", `${gpuCount(app.gpus)}, ${app.cpus} CPU, ${mib(app.mem)}`),
      field("Ports", ports(app.portDefinitions)),
      field("Labels", labels.length ? labels.map(([k, v]) => `${k}=${v}`).join(", ") : "-"),
      field("Health checks", (app.healthChecks || []).length ? `${app.healthChecks.length}` : "none"),
      field("Why instances wait", el("span", { class: "reason", text: app.corral?.waiting || "-" })),
      field("Version", app.version)),
    el("h3", { text: "Instances" }),
    table(`Instances of ${app.id}`, [["Task"], ["State"], ["Job"], ["GPUs"], ["Ports"], ["Started"], ["Health"]], tasks, "No instances."),
  ];
}

function definitionLink(name) {
  return el("a", { href: `#definition/${encodeURIComponent(name)}` }, name);
}

const SOURCE = { metronome: "Metronome", chronos: "Chronos" };

function schedulesText(d) {
  const rules = d.schedules.map((r) => `${r.expression}${r.timezone ? ` (${r.timezone})` : ""}${r.enabled ? "" : " (disabled)"}`);
  if (d.parents.length) rules.push(`after ${d.parents.join(", ")}`);
  return rules.join("; ") || "on demand";
}

async function viewDefinitions() {
  const defs = await get("/v1/definitions");
  const rows = defs.map((d) => el("tr", {},
    el("td", {}, definitionLink(d.name)), el("td", { text: SOURCE[d.source] || d.source }), el("td", { text: d.user }),
    el("td", { text: schedulesText(d) }), el("td", {}, whenIso(d.next_run_at)),
    el("td", { class: "num", text: d.active_runs }), el("td", { text: d.last_status ?? "never ran" }),
    el("td", { class: "num", text: `${d.success_count} / ${d.failure_count}` }),
    el("td", { class: "mono", text: shellQuote(d.command) })));
  return [el("h2", { tabindex: "-1", text: `Job definitions (${defs.length})` }),
    table("Named jobs made through Metronome's or Chronos' API or `corral job` (read-only here)" + (state.me?.root ? " (root: everyone's)" : ""),
      [["Name"], ["From"], ["User"], ["Schedule"], ["Next run"], ["Active runs", "num"], ["Last run"], ["Succeeded / failed", "num"], ["Command"]],
      rows, "No job definitions.")];
}

async function viewDefinition(name) {
  let d;
  try { d = await get(`/v1/definitions/${encodeURIComponent(name)}`); } catch (e) {
    if (e.status === 404) return [el("h2", { tabindex: "-1", text: `Definition ${name}` }), el("p", { text: `No job definition ${name} that you may see.` })];
    throw e;
  }
  const field = (label, value) => [el("dt", { text: label }), el("dd", {}, value)];
  const runs = [...d.runs].reverse().map((r) => el("tr", {},
    el("td", { class: "mono", text: r.id }), el("td", { text: r.status }), el("td", { text: r.trigger ?? "-" }),
    el("td", {}, whenIso(r.createdAt)), el("td", {}, whenIso(r.completedAt)),
    el("td", {}, r.tasks.length ? r.tasks.flatMap((t, i) => [i ? ", " : null, jobLink(t.id), ` ${t.status}`]) : "-"),
    el("td", { class: "reason", text: r.reason || "-" })));
  return [
    el("h2", { tabindex: "-1", text: `Definition ${d.name}` }),
    el("p", {}, el("a", { href: "#definitions" }, "← all definitions")),
    el("dl", { class: "fields" },
      field("From", SOURCE[d.source] || d.source), field("User", d.user), field("Description", d.description || "-"),
      field("Command", el("code", { text: shellQuote(d.command) })), field("Image", d.image ?? "-"),
      field("Asks for", `${gpuCount(d.gpus)}, ${d.cpus} CPU, ${mib(d.memory_mib)}`),
      field("Schedule", schedulesText(d)), field("Next run", whenIso(d.next_run_at)),
      field("Schedules enabled", d.schedules.length ? d.schedules.map((r) => `${r.id}: ${yesNo(r.enabled)}`).join(", ") : "-"),
      field("Runs", `${d.active_runs} active; ${d.success_count} succeeded, ${d.failure_count} failed, ${d.missed_ticks} missed`),
      field("Created", whenIso(d.created_at))),
    el("h3", { text: "Runs (newest first)" }),
    table(`Runs of ${d.name}`, [["Run"], ["Status"], ["Trigger"], ["Created"], ["Completed"], ["Jobs"], ["Reason"]], runs, "No runs yet."),
    el("h3", { text: `As ${SOURCE[d.source] || d.source} shows it` }),
    el("pre", { class: "spec", tabindex: "0", "aria-label": `definition of ${d.name}` }, JSON.stringify(d.spec, null, 2)),
  ];
}

async function viewReports() {
  if (!state.me?.reports) {
    return [el("h2", { tabindex: "-1", text: "Simulation reports" }),
      el("p", { class: "muted" }, "This daemon shows no reports: start it with ", el("code", { text: "corral serve --reports DIR" }),
        ", DIR being where ", el("code", { text: "corral sim ... --out" }), " wrote them.")];
  }
  const reports = await get("/ui/api/reports");
  if (state.report === null && reports.length) state.report = reports[0].path;
  const list = el("ul", { "aria-label": "reports" }, reports.map((r) => el("li", {},
    el("button", { type: "button", "aria-current": r.path === state.report ? "true" : "false",
      onclick: () => { state.report = r.path; render(true); } }, r.path))));
  const frame = state.report === null ? el("p", { class: "muted", text: "No reports in the folder yet." }) :
    el("iframe", { class: "report", sandbox: "", referrerpolicy: "no-referrer", title: `report ${state.report}`,
      src: `/ui/reports/${state.report.split("/").map(encodeURIComponent).join("/")}` });
  return [el("h2", { tabindex: "-1", text: `Simulation reports (${reports.length})` }), el("div", { class: "reports" }, el("nav", { "aria-label": "report list" }, list), frame)];
}

// ------------------------------------------------------------------ routing and updates
function route() {
  const hash = decodeURIComponent(location.hash.replace(/^#/, "")) || "gpus";
  // A gang's instance K: #job/ID/instance/K (instance 0 when not given: the job's own log, as before).
  const gang = /^job\/([^/]+)\/instance\/(\d+)$/.exec(hash);
  if (gang) return { view: "job", job: gang[1], instance: Number(gang[2]) };
  if (hash.startsWith("job/")) return { view: "job", job: hash.slice(4) };
  if (hash.startsWith("app/")) return { view: "app", job: hash.slice(3) };
  if (hash.startsWith("definition/")) return { view: "definition", job: hash.slice(11) };
  return { view: ["gpus", "queue", "users", "jobs", "apps", "definitions", "reports"].includes(hash) ? hash : "gpus", job: null };
}

async function render(focus) {
  if (state.busy) { state.again = true; return; }
  state.busy = true;
  const { view, job, instance = 0 } = route();
  // The page's first view leaves the keyboard at the top (skip link, then the views); a view chosen later takes it.
  const changed = state.view !== null && (view !== state.view || job !== state.job);
  // Another instance of the same gang: its log from the end, and the keyboard stays on the instance links.
  const switched = !changed && view === "job" && instance !== state.instance;
  state.view = view; state.job = job; state.instance = instance;
  if (view !== "job") state.log = null;
  if (changed) notice("");  // (compared before state.view changed: a notice belongs to the view it was given on)
  for (const a of document.querySelectorAll("nav a[data-view]")) {
    const parent = { job: "jobs", app: "apps", definition: "definitions" }[view];
    if (a.dataset.view === view || a.dataset.view === parent) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  try {
    const make = { gpus: viewGpus, queue: viewQueue, users: viewUsers, jobs: viewJobs, job: () => viewJob(job, instance),
      apps: viewApps, app: () => viewApp(job), definitions: viewDefinitions, definition: () => viewDefinition(job), reports: viewReports }[view];
    const parts = await make();
    const target = $("view");
    // Keep the keyboard where it was across a live update: remember the focused link or button by its text.
    const active = document.activeElement && target.contains(document.activeElement) && !changed && (!focus || switched)
      ? [document.activeElement.tagName, document.activeElement.textContent] : null;
    const logBox = target.querySelector("pre.log");
    const atBottom = logBox ? logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 4 : true;
    target.replaceChildren(...parts);
    const newLog = target.querySelector("pre.log");
    if (newLog && (changed || switched || atBottom)) newLog.scrollTop = newLog.scrollHeight;
    if (active) {
      const again = [...target.querySelectorAll(active[0])].find((n) => n.textContent === active[1]);
      if (again) again.focus();
    } else if (changed || focus) {
      const heading = target.querySelector("h2");
      if (heading && changed) heading.focus();
    }
    $("problem").hidden = true;
    $("status").textContent = `Updated ${new Date().toLocaleTimeString()}${state.paused ? " (updates paused)" : ", every 2 s"}`;
    document.title = `corral: ${job !== null ? `${view} ${job}` : view}${instance ? ` instance ${instance}` : ""}`;
  } catch (e) {
    if (e instanceof Unauthorised) { showLogin(); return; }
    $("problem").textContent = `Could not update: ${e.message}`;
    $("problem").hidden = false;
  } finally {
    state.busy = false;
    // A view asked for while an update was on its way (a key, a click) is drawn now, not at the next update.
    if (state.again) { state.again = false; render(true); }
  }
}

function schedule() {
  clearTimeout(state.timer);
  if (state.paused || state.me === null) return;
  state.timer = setTimeout(async () => {
    if (!document.hidden) await render(false);
    schedule();
  }, POLL_MS);
}

function showLogin(message) {
  state.me = null;
  clearTimeout(state.timer);
  $("nav").hidden = true; $("who").hidden = true; $("view").replaceChildren();
  $("login").hidden = false;
  $("login-error").hidden = !message; $("login-error").textContent = message || "";
  $("token").focus();
}

async function start() {
  // A token in the fragment (#token=corral_...: never sent to the server or its logs) logs in once, then is dropped.
  const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
  if (fragment.get("token")) {
    const token = fragment.get("token");
    history.replaceState(null, "", location.pathname + "#gpus");
    await login(token);
    return;
  }
  try {
    state.me = await get("/ui/api/me");
  } catch (e) {
    if (e instanceof Unauthorised) { showLogin(); return; }
    $("problem").textContent = `The daemon does not answer: ${e.message}`; $("problem").hidden = false;
    return;
  }
  $("login").hidden = true; $("nav").hidden = false; $("who").hidden = false;
  $("whoami").textContent = `${state.me.user}${state.me.root ? " (root: sees every job)" : ""}`;
  $("host").textContent = state.me.host;
  $("logout").hidden = state.me.via !== "session";
  await render(true);
  schedule();
}

async function login(token) {
  const answer = await fetch("/ui/login", { method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }) });
  if (!answer.ok) {
    let message = `${answer.status}`;
    try { message = (await answer.json()).detail.message; } catch { /* not JSON */ }
    showLogin(`Not logged in: ${message}`);
    return;
  }
  $("token").value = "";
  localStorage.setItem(CHECK_KEY, (await answer.json()).check);
  await start();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (event) => { event.preventDefault(); login($("token").value.trim()); });
  $("logout").addEventListener("click", async () => {
    await fetch("/ui/logout", { method: "POST", credentials: "same-origin" });
    localStorage.removeItem(CHECK_KEY);
    showLogin("Logged out.");
  });
  $("pause").addEventListener("click", () => togglePause());
  window.addEventListener("hashchange", () => { state.report = state.view === "reports" ? state.report : null; render(true); });
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || state.me === null) return;
    if (event.target.closest && event.target.closest("input, textarea, select")) return;
    const views = { g: "gpus", q: "queue", u: "users", j: "jobs", a: "apps", d: "definitions", r: "reports" };
    if (views[event.key]) { location.hash = views[event.key]; event.preventDefault(); }
    else if (event.key === "p") { togglePause(); event.preventDefault(); }
  });
  start();
});

function togglePause() {
  state.paused = !state.paused;
  $("pause").setAttribute("aria-pressed", String(state.paused));
  $("pause").textContent = state.paused ? "Resume updates" : "Pause updates";
  if (state.paused) clearTimeout(state.timer); else { render(false); schedule(); }
}
