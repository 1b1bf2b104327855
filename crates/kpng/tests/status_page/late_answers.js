// A harness for the status page's script (observability.rs loads it in headless Chromium from
// file://, before the page's own script): `fetch` answers only when this file says so, so
// that an answer to an older request arrives after the answer to a newer one, deterministically.
"use strict";
const requests = [];
window.fetch = (url, options) => new Promise((resolve, reject) => {
  const request = { url: String(url), resolve };
  requests.push(request);
  const signal = options && options.signal;
  if (signal) signal.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError")));
});
// An answer of the node agent holding one port of Service `service`.
const answer = (service) => ({
  ok: true,
  json: async () => ({
    node: "node1", backend: "file", pendingPortChanges: 0, totalPorts: 2, matchingPorts: 1,
    recentSyncs: [],
    services: [{
      service, portName: "http", protocol: "TCP", family: "IPv4", clusterIp: "10.96.0.10",
      port: 80, endpoints: [], policyCell: "C/C", policyDetails: [], problems: [],
    }],
  }),
});
const at = (ms, step) => setTimeout(step, ms);
// The page asked for everything; the engineer types "zonal" before that answer comes.
at(100, () => {
  const filter = document.getElementById("filter");
  filter.value = "zonal";
  filter.dispatchEvent(new Event("input"));
});
// The answer to "zonal" comes first, then the late answer to the first request.
at(1000, () => requests[1].resolve(answer("default/zonal")));
at(1500, () => requests[0].resolve(answer("default/web")));
at(2000, () => {
  document.body.dataset.requests = JSON.stringify(requests.map((r) => r.url));
  document.body.dataset.harness = "done";
});
