// The run list: status badges kept live by polling the REST list, and picking runs to compare.
//
// Polling (not one WebSocket per run) because the list shows up to a hundred
// runs; one request every few seconds refreshes them all.
(function () {
  "use strict";

  const root = document.getElementById("runs-root");
  if (!root) return;
  const POLL_MS = 3000;
  const PAGE_SIZE = 200;

  const state = (window.tandemRunList = { polls: 0, updates: 0 });
  const rows = new Map(
    [...document.querySelectorAll("#run-table tbody tr[data-run-id]")].map((row) => [Number(row.dataset.runId), row]),
  );

  function show(run) {
    const row = rows.get(run.id);
    if (!row) return;
    if (row.dataset.status !== run.status) {
      row.dataset.status = run.status;
      const badge = row.querySelector(".run-status .badge");
      badge.textContent = run.status;
      badge.className = `badge badge-${run.status}`;
      state.updates += 1;
    }
    row.querySelector(".run-step").textContent = String(run.trainer_step);
    row.querySelector(".run-policy").textContent = `v${run.policy_version}`;
  }

  async function poll() {
    try {
      // Newest first, as the list is unless sorted otherwise: the runs that change are the recent ones.
      const response = await fetch(`${root.dataset.runsApiUrl}?page_size=${PAGE_SIZE}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (response.ok) {
        const body = await response.json();
        body.results.forEach(show);
        state.polls += 1;
      }
    } finally {
      setTimeout(poll, document.hidden ? POLL_MS * 5 : POLL_MS);
    }
  }
  if (rows.size) setTimeout(poll, POLL_MS);

  // --- compare --------------------------------------------------------------

  const button = document.getElementById("compare-button");
  const boxes = [...document.querySelectorAll(".compare-select")];
  function selected() {
    return boxes.filter((box) => box.checked).map((box) => box.value);
  }
  function refreshButton() {
    const count = selected().length;
    button.disabled = count < 2;
    button.textContent = count ? `Compare selected (${count})` : "Compare selected";
  }
  boxes.forEach((box) => box.addEventListener("change", refreshButton));
  button.addEventListener("click", () => {
    const ids = selected();
    if (ids.length >= 2) window.location.href = `${root.dataset.compareUrl}?runs=${ids.join(",")}`;
  });
  refreshButton();
})();
