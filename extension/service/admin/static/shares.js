// wmla admin page, fair share: each child plan's fair-share factor and decayed usage over about
// one half-life, from the service's samples (api/v1/shares/history, with the user's hub login
// and the page's _xsrf value in a header). plotly.js is served by the service from the
// installed plotly package.
"use strict";

(function () {
  const box = document.getElementById("share-charts");
  if (!box) return;  // the usage history is off: the page says so, no chart
  const status = document.getElementById("shares-status");

  function get(path) {
    return fetch(box.dataset.api + path, {
      credentials: "same-origin",
      headers: { "X-XSRFToken": box.dataset.xsrf, Accept: "application/json" },
    }).then((r) =>
      r.json().then((body) => {
        if (!r.ok) throw new Error(body.error || r.statusText);
        return body;
      })
    );
  }

  function draw(id, title, unit, x, plans, key, range) {
    const traces = plans.map((p) => ({
      x: x, y: p[key], name: p.plan, mode: "lines", line: { shape: "linear" },
    }));
    const yaxis = { title: { text: unit }, rangemode: "tozero" };
    if (range) yaxis.range = range;
    const layout = {
      title: { text: title }, margin: { t: 40, r: 20, b: 80, l: 60 }, yaxis: yaxis,
      legend: { orientation: "h", y: -0.3 },
    };
    window.Plotly.newPlot(id, traces, layout, { displaylogo: false, responsive: true });
  }

  function start() {
    if (!window.Plotly) {
      status.textContent = "plotly.js did not load";
      return;
    }
    const q = new URLSearchParams({ plan: box.dataset.plan });
    get("shares/history?" + q.toString())
      .then((h) => {
        const x = h.t.map((s) => new Date(s * 1000));
        draw("chart-factor", "Fair-share factor, children of " + h.plan, "2^(-U/S)", x,
          h.plans, "fair_share_factor", [0, 1.05]);
        draw("chart-share-usage", "Decayed usage, children of " + h.plan, h.unit, x,
          h.plans, "raw_usage", null);
        const every = h.interval ? ", one every " + Number(h.interval.toPrecision(3)) + " s" : "";
        status.textContent = h.t.length + " samples" + every + " over about one half-life (" +
          h.half_life + " s), then now";
        box.dataset.ready = "1";
      })
      .catch((err) => {
        status.textContent = "could not load the fair-share history: " + err.message;
        status.className = "error";
        box.dataset.ready = "error";
      });
  }
  start();
})();
