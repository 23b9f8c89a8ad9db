// Overlaid charts of several runs: one line per run for each metric, by trainer step.
//
// Each run's history comes from its REST metrics endpoint, paged by the step
// cursor; uPlot wants one shared x column, so the runs' steps are merged and a
// run has null (a gap) at steps it has no point for.
(function () {
  "use strict";

  const root = document.getElementById("compare-root");
  const series = JSON.parse(document.getElementById("compare-series").textContent);
  if (!root || series.length === 0) return;

  // The metrics it charts are the platform's (telemetry/charts.py COMPARE_CHARTS), one chart each.
  const METRICS = [...root.querySelectorAll(".chart[data-metric]")].map((chart) => chart.dataset.metric);
  const { STEP_INCREMENTS, colour, metricPages, yRange, pointsWhenAlone } = window.tandemCharts;
  // yRanges: metric -> [min, max] of its chart's y axis.
  const state = (window.tandemCompare = { loaded: 0, points: {}, charts: 0, yRanges: {} });

  series.forEach((run, index) => {
    const swatch = document.querySelector(`#compare-runs li[data-run-id="${run.id}"] .swatch`);
    if (swatch) swatch.style.background = colour(index);
  });

  async function history(run) {
    const byStep = new Map(); // step -> {name: value}
    await metricPages(run.metrics_url, {
      names: METRICS,
      onPage: (points) => {
        for (const point of points) {
          if (!byStep.has(point.step)) byStep.set(point.step, {});
          byStep.get(point.step)[point.name] = point.value;
        }
      },
    });
    return byStep;
  }

  function draw(histories) {
    const steps = [...new Set(histories.flatMap((byStep) => [...byStep.keys()]))].sort((a, b) => a - b);
    for (const metric of METRICS) {
      const container = document.getElementById(`compare-${metric}`);
      const columns = histories.map((byStep) =>
        steps.map((step) => (byStep.has(step) && byStep.get(step)[metric] !== undefined ? byStep.get(step)[metric] : null)),
      );
      state.points[metric] = columns.map((column) => column.filter((value) => value !== null).length);
      new uPlot(
        {
          width: Math.max(container.clientWidth, 300),
          height: 240,
          scales: { x: { time: false }, y: { range: yRange } },
          series: [
            { label: "step" },
            ...series.map((run, index) => ({
              label: `${run.name} #${run.id}`,
              stroke: colour(index),
              width: 2,
              spanGaps: true,
              points: { show: pointsWhenAlone },
            })),
          ],
          // Steps are whole numbers: no tick at 1.5.
          axes: [{ label: "step", incrs: STEP_INCREMENTS }, {}],
          // uPlot sets its scales as it draws, after a microtask.
          hooks: { draw: [(u) => { state.yRanges[metric] = [u.scales.y.min, u.scales.y.max]; }] },
        },
        [steps, ...columns],
        container,
      );
      state.charts += 1;
    }
  }

  Promise.all(series.map(history)).then((histories) => {
    state.loaded = histories.length;
    draw(histories);
  });
})();
