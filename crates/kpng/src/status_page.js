// The status page's script (http.rs serves it as /status/page.js: its policy allows no inline
// script). It reads /status/status.json and /status/trace.json, as `kpng status` and `kpng trace` do.
"use strict";
const $ = (id) => document.getElementById(id);
const text = (tag, value, cls) => {
  const el = document.createElement(tag);
  el.textContent = value;
  if (cls) el.className = cls;
  return el;
};
let status = null;
// Ports per answer: enough to read, small enough for the node agent to build every 5 s.
const PAGE_PORTS = 500;
// Answers rendered so far (the Services table body's data-answers): the page refreshes every 5 s
// and its filters, namespace and toggle stay as they are across refreshes.
let answers = 0;
// Namespaces seen in answers, offered by the namespace field.
const namespaces = new Set();
// Which page of the selection is shown (0: its first PAGE_PORTS ports); a new selection starts
// at the first.
let pageIndex = 0;
// Requests sent so far, and the number of the one whose answer is shown. Why: an answer can
// arrive late (a slow node agent at 30k Services, a periodic refresh after the engineer
// changed the filter); an answer to an older request or to another selection than the one
// now in the fields must never replace what is shown.
let asked = 0;
let renderedRequest = 0;
// The request in flight: its number, its query and how to abort it (a new selection aborts
// it; a periodic refresh waits for it instead of piling up on a slow node agent).
let inflight = null;

function frontends(p) {
  const f = [p.clusterIp + ":" + p.port];
  if (p.nodePort) f.push("node port " + p.nodePort);
  (p.externalIps || []).forEach((ip) => f.push("external " + ip));
  (p.loadBalancerIps || []).forEach((ip) => f.push("load balancer " + ip));
  return f.join(", ");
}

// A cell of lines: the first as it is, the others (detail) under it.
function cell(lines, cls, detailCls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  lines.forEach((l, i) => td.appendChild(text("div", l, i ? detailCls : "")));
  return td;
}

// The values dropped from port p's Service (a frontend lost to another Service among them:
// the port is not reachable there), this node's and its brain's, as kpng status lists them.
function droppedOf(p) {
  const report = status.brainReports;
  return (status.dropped || []).concat((report && report.dropped) || [])
    .filter((d) => d.service === p.service);
}

function endpointCell(p) {
  const td = document.createElement("td");
  td.className = "ep";
  if (p.withoutEndpoints) td.appendChild(text("div", p.withoutEndpoints, "unused"));
  for (const e of p.endpoints) {
    const state = e.ready ? "ready" : e.serving && e.terminating ? "terminating" : e.serving ? "serving" : "not serving";
    const where = e.local ? "local" : "remote";
    const used = e.usedBy.length ? "used (" + e.usedBy.join(", ") + ")" : "unused: " + (e.reason || "");
    td.appendChild(text("div", e.address + " " + state + " " + where + " " + used, e.usedBy.length ? "" : "unused"));
  }
  return td;
}

function render() {
  if (!status) return;
  const last = status.lastSync;
  $("header").textContent = "node " + status.node + " · backend " + status.backend +
    " · last sync " + (last ? last.at + (last.ok ? " ok" : " FAILED") : "never") +
    " · pending changes " + status.pendingPortChanges +
    (status.lastError ? " · last error: " + status.lastError : "") +
    (status.repairs && status.repairs.count ? " · repaired " + status.repairs.count + "× after changes by someone else, the last at " +
      status.repairs.lastAt + " (" + status.repairs.lastChange + ")" : "") +
    (status.conntrack ? " · conntrack table " +
      Math.floor(status.conntrack.entries * 100 / Math.max(status.conntrack.max, 1)) + " % full (" +
      status.conntrack.entries + " of " + status.conntrack.max + " entries)" : "");
  // The previous kpng of this network namespace ended without a clean shutdown (killed,
  // OOM): information, not a problem of this run (`kpng status`'s "previous run:" line).
  $("previousrun").hidden = !status.previousRun;
  $("previousrun").textContent = status.previousRun ? "previous run: " + status.previousRun : "";
  const ct = status.conntrack;
  $("header").className = ct && ct.max > 0 && ct.entries * 10 >= ct.max * 9 ? "bad" : "";
  // Someone else keeps changing the data plane and repairs are delayed (as `kpng status`
  // prints it under the repairs line).
  // A change by someone else not repaired yet comes first: the node may serve no Service.
  const repairProblems = status.repairs
    ? [status.repairs.unrepaired, status.repairs.problem].filter((p) => p) : [];
  $("repairs").hidden = repairProblems.length === 0;
  $("repairs").textContent = repairProblems.map((p) => "PROBLEM: " + p).join("\n");
  const input = status.input;
  const problems = (input ? input.problems || [] : []).slice();
  // Values dropped from objects in use are problems of the input too, as `kpng status` counts
  // them ("2 VALUES DROPPED"), listed apart below.
  const dropped = status.dropped || [];
  const inputState = [];
  if (problems.length) inputState.push(problems.length + " problem" + (problems.length === 1 ? "" : "s"));
  if (dropped.length) inputState.push(dropped.length + " VALUE" + (dropped.length === 1 ? "" : "S") + " DROPPED");
  $("input").textContent = input
    ? "input " + input.source + " · " + (inputState.length ? inputState.join(", ") : "ok") +
      " · last good input " +
      (input.lastGood ? input.lastGood + (input.detail ? " (" + input.detail + ")" : "") : "never")
    : "";
  $("input").className = problems.length || dropped.length ? "bad" : "";
  // On a node fed by a brain: what the brain reports about its own input, which the node never
  // sees itself (its problems join the problems table, its rejections the rejected table).
  const report = status.brainReports;
  const reported = report ? report.problems || [] : [];
  const total = report ? report.rejectedTotal || 0 : 0;
  const droppedTotal = report ? report.droppedTotal || 0 : 0;
  // The last report received: out of date while the brain is away or, on a new connection,
  // until the brain sends its state.
  const stale = report && (problems.length > 0 || report.fromEarlierConnection);
  $("brain").textContent = report
    ? (stale ? "brain reported (may be out of date): " : "brain reports: ") + "its input " +
      report.source + " · " + (reported.length ? reported.length +
      " problem" + (reported.length === 1 ? "" : "s") : "ok") + " · it rejects " + total +
      " object" + (total === 1 ? "" : "s") +
      (droppedTotal ? " · it dropped " + droppedTotal + " value" + (droppedTotal === 1 ? "" : "s") : "")
    : "";
  $("brain").className = reported.length ? "bad" : "";
  problems.push(...reported.map((p) => Object.assign({}, p, { what: "brain: " + p.what })));
  // The backend's own lines (to-local ebpf: its programs and maps).
  $("dataplane").replaceChildren(...(status.dataPlane || []).map((d) =>
    text("div", d.what + ": " + d.state + (d.problem ? " · PROBLEM: " + d.problem : ""), d.problem ? "bad" : "")));
  $("problems").hidden = problems.length === 0;
  const rows = $("problems").querySelector("tbody");
  rows.replaceChildren();
  for (const p of problems) {
    const tr = document.createElement("tr");
    tr.appendChild(text("td", p.what));
    tr.appendChild(text("td", p.since));
    tr.appendChild(text("td", p.message, "bad"));
    rows.appendChild(tr);
  }
  const waiting = status.waitingFor || [];
  $("waiting").hidden = waiting.length === 0;
  $("waiting").textContent = "nothing is programmed until the first complete lists of " +
    waiting.join(", ") + " arrive";
  const rejected = (status.rejected || []).concat(((report && report.rejected) || []).map((r) =>
    Object.assign({}, r, { location: "rejected by the brain" + (r.location ? ": " + r.location : "") })));
  $("rejected").hidden = rejected.length === 0;
  const bad = $("rejected").querySelector("tbody");
  bad.replaceChildren();
  for (const r of rejected) {
    const tr = document.createElement("tr");
    tr.className = "rejected";
    tr.appendChild(text("td", r.object));
    tr.appendChild(text("td", r.location || ""));
    tr.appendChild(text("td", "field " + r.field + ": " + r.message, "bad"));
    tr.appendChild(text("td", r.kept ? "its last good version" : "nothing: no earlier version"));
    bad.appendChild(tr);
  }
  // On a node fed by a brain: the values the brain dropped (this node got the rest of each
  // object), in the same table, marked as the brain's.
  const droppedAll = dropped.concat(((report && report.dropped) || []).map((d) =>
    Object.assign({}, d, { object: d.object + " · dropped by the brain" })));
  $("dropped").hidden = droppedAll.length === 0;
  const droppedRows = $("dropped").querySelector("tbody");
  droppedRows.replaceChildren();
  for (const d of droppedAll) {
    const tr = document.createElement("tr");
    tr.appendChild(text("td", d.object));
    tr.appendChild(text("td", d.field));
    tr.appendChild(text("td", d.message, "bad"));
    droppedRows.appendChild(tr);
  }
  const checks = status.healthChecksNotServed || [];
  $("healthchecks").hidden = checks.length === 0;
  const unserved = $("healthchecks").querySelector("tbody");
  unserved.replaceChildren();
  for (const c of checks) {
    const tr = document.createElement("tr");
    tr.appendChild(text("td", c.service));
    tr.appendChild(text("td", String(c.port)));
    tr.appendChild(text("td", c.since));
    tr.appendChild(text("td", c.message, "bad"));
    unserved.appendChild(tr);
  }
  // kpng filters and caps the list itself (the whole list is tens of MB on a large cluster).
  const matching = status.matchingPorts ?? status.services.length;
  const what = $("problemsonly").checked ? " ports with a problem" : " matching ports";
  const from = pageIndex * PAGE_PORTS;
  $("shown").textContent = !status.services.length && from
    ? "page " + (pageIndex + 1) + " is past the " + matching + what + ": go back"
    : status.services.length < matching
    ? "showing " + (status.services.length ? from + 1 : 0) + "–" + (from + status.services.length) +
      " of " + matching + what + " (" + status.totalPorts + " in all)"
    : matching + " of " + (status.totalPorts ?? matching) + " ports";
  // The previous and next pages of the selection (with "problems only", of its ports with a
  // problem: kpng selects them over every port before it pages).
  $("previous").hidden = pageIndex === 0;
  $("next").hidden = from + status.services.length >= matching;
  // kpng counts the ports with a problem over the whole selection, as `kpng status` does.
  $("problemsline").hidden = !status.problemsLine;
  $("problemsline").textContent = status.problemsLine || "";
  $("problemsline").classList.toggle("bad", status.problemPorts > 0);
  $("notshown").hidden = !status.rejectedNotShown;
  $("notshown").textContent = status.rejectedNotShown
    ? "(" + status.rejectedNotShown + " other object" + (status.rejectedNotShown === 1 ? "" : "s") +
      " rejected, not shown: clear the namespace to list them)" : "";
  const body = $("services").querySelector("tbody");
  body.replaceChildren();
  for (const p of status.services) {
    namespaces.add(p.service.split("/")[0]);
    const problems = p.problems || [];
    const tr = document.createElement("tr");
    tr.className = "service" + (problems.length ? " problem" : "");
    tr.appendChild(cell([p.service].concat(problems.length ? ["PROBLEM: " + problems.join(", ")] : []), "", "bad"));
    tr.appendChild(text("td", (p.portName ? p.portName + "/" : "") + p.protocol));
    tr.appendChild(text("td", p.family));
    // The frontends in use, then the values dropped from the Service (a frontend lost to
    // another Service is one: it is not among the frontends).
    tr.appendChild(cell([frontends(p)].concat(droppedOf(p).map((d) =>
      "DROPPED " + d.field + ": " + d.message)), "frontends", "bad"));
    // The POLICY cell and its detail, computed by kpng as `kpng status` prints them.
    tr.appendChild(cell([p.policyCell || ""].concat(p.policyDetails || []), "policy", "detail"));
    tr.appendChild(endpointCell(p));
    body.appendChild(tr);
  }
  $("legend").textContent = status.policyLegend || "";
  const known = $("namespaces");
  known.replaceChildren(...[...namespaces].sort().map((n) => Object.assign(document.createElement("option"), { value: n })));
  answers += 1;
  body.dataset.answers = String(answers);
  const syncs = $("syncs").querySelector("tbody");
  syncs.replaceChildren();
  for (const s of status.recentSyncs || []) {
    const tr = document.createElement("tr");
    tr.appendChild(text("td", s.at));
    tr.appendChild(text("td", s.ok ? "ok" : "failed: " + (s.error || ""), s.ok ? "ok" : "bad"));
    tr.appendChild(text("td", s.full ? "full" : "partial"));
    tr.appendChild(text("td", String(s.operations)));
    tr.appendChild(text("td", (s.durationSeconds * 1000).toFixed(1) + " ms"));
    tr.appendChild(text("td", s.changes));
    syncs.appendChild(tr);
  }
}

// The status answer's query for what the page's fields select now.
function selection() {
  const q = new URLSearchParams({ limit: String(PAGE_PORTS), q: $("filter").value.trim() });
  // A namespace name holds no "/": `NAMESPACE/` selects all of its Services (`kpng status -n`).
  const ns = $("namespace").value.trim().replace(/\/.*$/, "");
  if (ns) q.set("service", ns + "/");
  if ($("problemsonly").checked) q.set("problems", "true");
  if (pageIndex) q.set("offset", String(pageIndex * PAGE_PORTS));
  return { ns, query: q.toString() };
}

// Asks for the selection and shows the answer, unless a newer one was shown meanwhile or the
// selection changed. `periodic`: the 5-s refresh, which does not ask again while an answer to
// the same selection is on its way.
async function refresh(periodic) {
  const { ns, query } = selection();
  if (inflight && inflight.query === query && periodic === true) return;
  if (inflight) inflight.controller.abort();
  const request = { number: ++asked, query, controller: new AbortController() };
  inflight = request;
  try {
    keepInAddress(ns);
    const r = await fetch("status/status.json?" + query, { signal: request.controller.signal });
    if (!r.ok) throw new Error(await r.text());
    const answer = await r.json();
    if (request.number < renderedRequest || query !== selection().query) return;
    renderedRequest = request.number;
    status = answer;
    render();
  } catch (e) {
    // An aborted request was replaced by a newer one, which says what there is to say.
    if (e.name === "AbortError" || request.number < renderedRequest) return;
    if (query !== selection().query) return;
    renderedRequest = request.number;
    $("header").textContent = "kpng does not answer: " + e.message;
  } finally {
    if (inflight === request) inflight = null;
  }
}

// A new selection is shown from its first page.
function reselect() {
  pageIndex = 0;
  refresh();
}

async function trace() {
  const q = new URLSearchParams({ from: $("from").value.trim(), to: $("to").value.trim(), proto: $("proto").value });
  if ($("iif").value.trim()) q.set("iif", $("iif").value.trim());
  const out = $("trace-result");
  try {
    const r = await fetch("status/trace.json?" + q);
    if (!r.ok) throw new Error(await r.text());
    const t = await r.json();
    const lines = ["verdict: " + t.verdict.toUpperCase()];
    if (t.service) lines.push("service: " + t.service + " (via " + t.frontend + ")");
    if (t.verdict === "dnat") {
      lines.push("endpoints: " + t.endpointList + " list: " + t.endpoints.join(", "));
      lines.push("masquerade: " + (t.hairpin && t.onlyItself
        ? "yes (hairpin: the client is the only endpoint it can pick)"
        : (t.masquerade ? "yes" : "no") + (t.translatedAtSocket
          ? " (translated at the socket: no NAT, the endpoint sees the client's address)"
          : t.atSocketIfInCgroup || t.atSocketIfInNetns
            ? " through the rules; no from a process " + [
                t.atSocketIfInCgroup && "in cgroup " + t.atSocketIfInCgroup + "'s subtree",
                t.atSocketIfInNetns && "in kpng's network namespace " + t.atSocketIfInNetns + " (not the host's)",
              ].filter(Boolean).join(" and ") + " (translated at the socket)"
          : t.hairpin ? " (hairpin when the client picks itself)" : "")));
    }
    if (t.affinityTimeoutSeconds) lines.push("affinity: ClientIP, " + t.affinityTimeoutSeconds + " s");
    lines.push("why: " + t.reason);
    if (t.interface) lines.push("interface: " + t.interface);
    if (t.rejected) lines.push("note: the Service's latest version is rejected (field " + t.rejected.field + ": " +
      t.rejected.message + "), so this traces its last good version");
    if (t.healthCheckNotServed) lines.push("note: this node does not serve the Service's health check (healthCheckNodePort " +
      t.healthCheckNotServed.port + ": " + t.healthCheckNotServed.message + "): load balancers see it as unhealthy and send this Service's traffic to other nodes");
    out.textContent = lines.join("\n");
    out.dataset.verdict = t.verdict;
  } catch (e) {
    out.textContent = "trace failed: " + e.message;
  }
}

// The page's selection in its address, so that a reload or a copied link shows the same.
function keepInAddress(ns) {
  const params = new URLSearchParams(location.search);
  const set = (k, v) => { if (v) params.set(k, v); else params.delete(k); };
  set("filter", $("filter").value.trim());
  set("namespace", ns);
  set("problems", $("problemsonly").checked ? "1" : "");
  set("page", pageIndex ? String(pageIndex + 1) : "");
  const search = params.toString();
  if (search !== location.search.replace(/^\?/, "")) {
    history.replaceState(null, "", location.pathname + (search ? "?" + search : ""));
  }
}

let typing;
const typed = () => { clearTimeout(typing); typing = setTimeout(reselect, 250); };
$("filter").addEventListener("input", typed);
$("namespace").addEventListener("input", typed);
$("problemsonly").addEventListener("change", reselect);
$("previous").addEventListener("click", () => { pageIndex = Math.max(pageIndex - 1, 0); refresh(); });
$("next").addEventListener("click", () => { pageIndex += 1; refresh(); });
$("trace-form").addEventListener("submit", (e) => { e.preventDefault(); trace(); });
// Deep links: /status?filter=web&namespace=shop&problems=1&page=2&from=10.244.1.5&to=10.96.0.10:80
// fills the page in.
const params = new URLSearchParams(location.search);
if (params.get("filter")) $("filter").value = params.get("filter");
if (params.get("namespace")) $("namespace").value = params.get("namespace");
$("problemsonly").checked = params.get("problems") === "1";
pageIndex = Math.max(parseInt(params.get("page") || "1", 10) - 1, 0) || 0;
for (const k of ["from", "to", "proto", "iif"]) if (params.get(k)) $(k).value = params.get(k);
refresh().then(() => { if (params.get("from") && params.get("to")) trace(); });
setInterval(() => refresh(true), 5000);
