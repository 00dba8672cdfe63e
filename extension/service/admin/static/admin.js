// wmla admin page, usage charts: requested vs used GPU and CPU over time for one plan.
// Data come from the metering API (api/v1/usage) through charts.js; when metering is not
// loaded, from the plans API's current figures (one point: now). plotly.js is served by the
// service from the installed plotly package.
"use strict";

(function () {
  const box = document.getElementById("usage");
  if (!box) return;
  const charts = window.wmlaCharts;
  const plan = box.dataset.plan;
  const status = document.getElementById("usage-status");
  const windows = { "1h": 3600, "6h": 6 * 3600, "1d": 86400, "7d": 7 * 86400 };
  const seconds = windows[box.dataset.window] || 6 * 3600;

  function draw(id, title, unit, t, requested, used, scale) {
    const x = t.map((s) => new Date(s * 1000));
    const traces = [
      { x: x, y: requested.map((v) => v * scale), name: "requested", mode: "lines",
        line: { shape: "hv", color: "#c9803d" } },
      { x: x, y: used.map((v) => v * scale), name: "used", mode: "lines", fill: "tozeroy",
        line: { shape: "hv", color: "#3d7cc9" } },
    ];
    charts.plot(id, title, { title: { text: unit }, rangemode: "tozero" }, traces);
  }

  function fill(children) {
    const body = document.querySelector("#usage-children tbody");
    body.textContent = "";
    for (const c of children) {
      const tr = document.createElement("tr");
      tr.dataset.path = c.path;
      const req = (c.totals && c.totals.requested) || {};
      const used = (c.totals && c.totals.used) || {};
      for (const v of [c.path, req.gpu_hours, used.gpu_hours, req.cpu_hours, used.cpu_hours]) {
        const td = document.createElement("td");
        td.textContent = typeof v === "number" ? String(Number(v.toPrecision(3))) : v || "0";
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
  }

  function fromUsage() {
    const q = new URLSearchParams({ plan: plan, start: "now-" + seconds + "s" });
    return charts.get(box, "usage?" + q.toString()).then((u) => {
      const s = u.series;
      draw("chart-gpu", "GPU: requested vs used, " + plan, "devices", s.t,
        s.requested.gpu, s.used.gpu, 1);
      draw("chart-cpu", "CPU: requested vs used, " + plan, "cores", s.t,
        s.requested.cpu, s.used.cpu, 0.001);
      fill(u.children || []);
      status.textContent = "from the metering API, step " + u.step + " s";
    });
  }

  function fromPlans() {
    return charts.get(box, "plans").then((p) => {
      const node = plan === "/" ? p.root : p.plans.find((x) => x.path === plan);
      const now = Date.now() / 1000;
      const d = node.demand, a = node.allocated;
      draw("chart-gpu", "GPU now: demand vs allocated, " + plan, "devices", [now],
        [d.gpu || 0], [a.gpu || 0], 1);
      draw("chart-cpu", "CPU now: demand vs allocated, " + plan, "cores", [now],
        [d.cpu || 0], [a.cpu || 0], 0.001);
      status.textContent = "metering is not loaded: current figures from the plans API";
    });
  }

  charts.start(box, status, "usage", box.dataset.source === "usage" ? fromUsage : fromPlans);
})();
