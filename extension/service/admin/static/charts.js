// wmla admin pages, what their charts share: a GET of the service's API with the user's hub
// login (cookie) and the page's _xsrf value in a header, as the hub requires for script
// requests; one plotly chart with the pages' layout; the page's status line once loaded.
"use strict";

window.wmlaCharts = (function () {
  function get(box, path) {
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

  function plot(id, title, yaxis, traces) {
    const layout = {
      title: { text: title }, margin: { t: 40, r: 20, b: 80, l: 60 }, yaxis: yaxis,
      legend: { orientation: "h", y: -0.3 },
    };
    window.Plotly.newPlot(id, traces, layout, { displaylogo: false, responsive: true });
  }

  // Runs ``load`` once plotly.js is there; the box says ready or error for the tests.
  function start(box, status, what, load) {
    if (!window.Plotly) {
      status.textContent = "plotly.js did not load";
      return;
    }
    load()
      .then(() => { box.dataset.ready = "1"; })
      .catch((err) => {
        status.textContent = "could not load " + what + ": " + err.message;
        status.className = "error";
        box.dataset.ready = "error";
      });
  }

  return { get: get, plot: plot, start: start };
})();
