// wmla admin page, fair share: each child plan's fair-share factor and decayed usage over about
// one half-life, from the service's samples (api/v1/shares/history, through charts.js).
// plotly.js is served by the service from the installed plotly package.
"use strict";

(function () {
  const box = document.getElementById("share-charts");
  if (!box) return;  // the usage history is off: the page says so, no chart
  const status = document.getElementById("shares-status");
  const charts = window.wmlaCharts;

  function draw(id, title, unit, x, plans, key, range) {
    const traces = plans.map((p) => ({
      x: x, y: p[key], name: p.plan, mode: "lines", line: { shape: "linear" },
    }));
    const yaxis = { title: { text: unit }, rangemode: "tozero" };
    if (range) yaxis.range = range;
    charts.plot(id, title, yaxis, traces);
  }

  function load() {
    const q = new URLSearchParams({ plan: box.dataset.plan });
    return charts.get(box, "shares/history?" + q.toString()).then((h) => {
      const x = h.t.map((s) => new Date(s * 1000));
      draw("chart-factor", "Fair-share factor, children of " + h.plan, "2^(-U/S)", x,
        h.plans, "fair_share_factor", [0, 1.05]);
      draw("chart-share-usage", "Decayed usage, children of " + h.plan, h.unit, x,
        h.plans, "raw_usage", null);
      const every = h.interval ? ", one every " + Number(h.interval.toPrecision(3)) + " s" : "";
      status.textContent = h.t.length + " samples" + every + " over about one half-life (" +
        h.half_life + " s), then now";
    });
  }
  charts.start(box, status, "the fair-share history", load);
})();
