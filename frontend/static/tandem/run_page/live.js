// The run page's live feed (see data.js): history from the REST API, paged by a step cursor,
// and the run's WebSocket, kept open by the dashboard's one loop (charts.js). On every
// (re)connect the REST backfill runs again: steps already drawn are skipped.
(function () {
  "use strict";

  const rp = window.tandemRunPageParts;
  if (!rp) return;
  const { TERMINAL, page, metricsUrl, websocketPath, stored, ingestStep } = rp;
  const { metricPages } = window.tandemCharts;
  let restCursor = -1; // last step the REST API returned: everything up to it is drawn

  // --- REST backfill ------------------------------------------------------

  let backfilling = null;
  let backfillAgain = false;

  // Drain the REST API from the cursor; a call during a drain runs one more after it,
  // so a reconnect's backfill always starts after the socket is subscribed.
  function backfill() {
    if (backfilling) {
      backfillAgain = true;
      return backfilling;
    }
    backfilling = (async () => {
      do {
        backfillAgain = false;
        await drainMetrics();
      } while (backfillAgain);
    })().finally(() => {
      backfilling = null;
    });
    return backfilling;
  }

  // The series the charts draw, of those the run logged. A run also logs series only the metric
  // explorer shows (it reads them bucketed): paging through their raw points here would read
  // millions of them on a long run, to keep none.
  async function chartedNames() {
    const response = await fetch(`${metricsUrl}names/`, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(`series names of ${metricsUrl}: HTTP ${response.status}`);
    return (await response.json()).names.filter(stored);
  }

  async function drainMetrics() {
    const names = await chartedNames();
    if (names.length === 0) return; // nothing charted logged yet; the socket brings the first steps
    await metricPages(metricsUrl, {
      afterStep: restCursor,
      names,
      onPage: (points, nextAfterStep) => {
        let step = null;
        let values = {};
        for (const point of points) {
          if (point.step !== step) {
            if (step !== null) ingestStep(step, values);
            step = point.step;
            values = {};
          }
          values[point.name] = point.value;
        }
        ingestStep(step, values);
        restCursor = nextAfterStep;
      },
    });
  }

  // --- WebSocket ----------------------------------------------------------

  let openedBefore = false; // the first open follows the page's render: its evaluations are on it

  function connect() {
    window.tandemCharts.runSocket(websocketPath, page, {
      onOpen: () => {
        rp.showConnection("live");
        // Catch up on what happened while we were not subscribed.
        backfill().catch(console.error);
        rp.refreshRun().catch(console.error);
        if (openedBefore) {
          rp.backfillEvaluations().catch(console.error);
          window.dispatchEvent(new CustomEvent("tandem:run-reconnected")); // messages may have been dropped
        }
        openedBefore = true;
      },
      onMessage: (message) => {
        if (message.type === "metrics") {
          ingestStep(message.step, message.values);
          // The metric explorer's panels follow the run on this socket rather than a second one of their own.
          window.dispatchEvent(new CustomEvent("tandem:run-metrics", { detail: { step: message.step, values: message.values } }));
          rp.showRun({ status: message.status, policy_version: message.policy_version });
          rp.refreshIdle();
        } else if (message.type === "status") {
          rp.showRun(message);
        } else if (message.type === "evaluation") {
          rp.showEvaluation(message);
        } else if (message.type === "alert") {
          rp.showAlert(message);
        }
      },
      onClose: () => {
        if (!TERMINAL.has(page.status)) return true;
        rp.showRunEnded();
        backfill().catch(console.error);
        return false;
      },
      onRetry: (text) => rp.showConnection(text),
    });
  }

  rp.scheduleRedraw(); // the empty charts' placeholders, before any point arrives
  backfill()
    .catch(console.error)
    .finally(connect);
})();
