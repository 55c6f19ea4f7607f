/* Draws every <figure data-chart> with uPlot (static/vendor/uplot-1.6.31). The figure carries its data
   (console/charts.py: x "step" or "time", xs, series, unit) in a JSON script element, a log-scale switch
   when the chart offers one, and a sentence for screen readers; polled partials (htmx) are drawn again
   after each swap, keeping the reader's log-scale choice. */
(function () {
  "use strict";
  var COLOURS = ["#1f6feb", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#6e7781"];
  var STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];  // whole steps
  var logScale = {};  // chart id -> the reader's choice, kept across a partial's swaps

  function number(value) {
    if (value == null) return "–";
    var text = Number(value).toPrecision(4);
    return String(Number(text)).length < text.length ? String(Number(text)) : text;
  }

  function draw(figure) {
    if (typeof uPlot === "undefined") return;
    var data = JSON.parse(figure.querySelector("script[type='application/json']").textContent);
    var plot = figure.querySelector(".plot");
    var log = figure.querySelector("input[data-log]");
    if (log) {
      if (figure.id in logScale) log.checked = logScale[figure.id];
      log.onchange = function () { logScale[figure.id] = log.checked; draw(figure); };
    }
    var unit = data.unit ? " " + data.unit : "";
    var options = {
      width: Math.max(240, plot.clientWidth || figure.clientWidth || 600),
      height: 220,
      scales: { x: { time: data.x === "time" }, y: log && log.checked ? { distr: 3 } : {} },
      axes: [
        data.x === "time" ? {} : { label: data.x, incrs: STEPS },
        { label: data.unit || "", size: 64, values: function (u, ticks) { return ticks.map(number); } }
      ],
      legend: { live: true },
      series: [{ label: data.x === "time" ? "time" : data.x }].concat(data.series.map(function (s, i) {
        return { label: s.label, stroke: COLOURS[i % COLOURS.length], width: 2, spanGaps: !!s.span,
                 value: function (u, v) { return v == null ? "–" : number(v) + unit; } };
      }))
    };
    if (figure._chart) figure._chart.destroy();
    plot.textContent = "";
    figure._chart = new uPlot(options, [data.xs].concat(data.series.map(function (s) { return s.values; })), plot);
    figure.dataset.drawn = "true";
  }

  function drawAll(root) {
    (root || document).querySelectorAll("figure[data-chart]").forEach(draw);
  }

  document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
  document.addEventListener("htmx:afterSettle", function (event) { drawAll(event.target); });
  var resizing;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () { drawAll(document); }, 200);
  });
})();
