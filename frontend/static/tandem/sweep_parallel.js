// A sweep's trials in parallel coordinates (sweeps/detail.html): an axis per parameter, then the metric;
// each trial a line through its values, darker the better its metric (towards the sweep's goal); pruned
// and failed trials dashed grey, through the axes they have. Categorical values sit evenly on their axis.
(function () {
  "use strict";

  const svg = document.getElementById("sweep-parallel");
  const source = document.getElementById("sweep-chart");
  if (!svg || !source) return;
  const chart = JSON.parse(source.textContent);
  const NS = "http://www.w3.org/2000/svg";
  const WIDTH = 900, HEIGHT = 300, PAD = 40;
  const axes = [...chart.parameters, chart.metric];
  const valueOf = (trial, axis) => (axis === chart.metric ? trial.value : trial.params[axis]);
  const state = (window.tandemSweep = { lines: 0, axes });

  function scaleFor(axis) {
    const values = chart.trials.map((trial) => valueOf(trial, axis)).filter((value) => value !== null && value !== undefined);
    if (!values.length) return { labels: [], at: () => HEIGHT / 2 };  // the metric before any trial has one
    if (values.every((value) => typeof value === "number")) {
      const low = Math.min(...values), high = Math.max(...values);
      const span = high - low || 1;
      return { labels: [low, high], at: (value) => HEIGHT - PAD - ((value - low) / span) * (HEIGHT - 2 * PAD) };
    }
    const levels = [...new Set(values.map(String))];
    return { labels: levels, at: (value) => HEIGHT - PAD - ((levels.indexOf(String(value)) + 0.5) / levels.length) * (HEIGHT - 2 * PAD) };
  }

  function element(name, attributes, text) {
    const node = document.createElementNS(NS, name);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  }

  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
  const withValue = chart.trials.filter((trial) => trial.value !== null);
  document.getElementById("sweep-parallel-empty").hidden = chart.trials.length > 0;
  if (!chart.trials.length) return;
  const x = (index) => PAD + (index * (WIDTH - 2 * PAD)) / Math.max(axes.length - 1, 1);
  const scales = axes.map(scaleFor);
  const values = withValue.map((trial) => trial.value);
  const low = Math.min(...values), high = Math.max(...values);
  const goodness = (value) => {
    const share = (value - low) / (high - low || 1);
    return chart.goal === "maximize" ? share : 1 - share;
  };
  for (const trial of chart.trials) {
    const points = axes.map((axis, index) => [axis, index]).filter(([axis]) => {
      const value = valueOf(trial, axis);
      return value !== null && value !== undefined;
    }).map(([axis, index]) => `${x(index)},${scales[index].at(valueOf(trial, axis))}`);
    const ended = trial.state === "pruned" || trial.state === "failed";
    const lightness = trial.value === null ? 70 : Math.round(75 - 50 * goodness(trial.value));
    element("polyline", {
      points: points.join(" "), fill: "none", "stroke-width": 2,
      stroke: ended ? "#9ca3af" : `hsl(220, 80%, ${lightness}%)`,
      "stroke-dasharray": ended ? "4 3" : "none", "data-trial": trial.number, class: "sweep-line",
    });
    state.lines += 1;
  }
  axes.forEach((axis, index) => {
    element("line", { x1: x(index), x2: x(index), y1: PAD, y2: HEIGHT - PAD, stroke: "#111827" });
    element("text", { x: x(index), y: PAD - 16, "text-anchor": "middle", "font-size": 12 }, axis);
    const labels = scales[index].labels;
    const format = (value) => (typeof value === "number" ? Number(value.toPrecision(3)) : value);
    labels.forEach((label) => element("text", {
      x: x(index) + 4, y: scales[index].at(label) + 4, "font-size": 10, fill: "#6b7280",
    }, String(format(label))));
  });
})();
