// The run list as a workspace: rows kept live and new runs added by polling the list's rows as
// the server draws them (runs/rows/), tags and notes edited in place (PATCH /api/runs/<id>/), and actions on the
// ticked rows: compare them, or cancel them after a confirmation.
//
// Polling (not one WebSocket per run) because the list shows up to a hundred runs; one
// request every few seconds refreshes them all and finds the runs created since.
(function () {
  "use strict";

  const root = document.getElementById("runs-root");
  if (!root) return;
  const POLL_MS = 3000;
  // The statuses a run may be cancelled from, as the contracts have them (tandem.contracts.CANCELLABLE_RUN_STATUSES).
  const CANCELLABLE = new Set(window.tandemContracts.run_statuses.cancellable);

  const state = (window.tandemRunList = { polls: 0, updates: 0, added: 0 });
  const table = document.getElementById("run-table");
  const body = table.querySelector("tbody");
  const writableProjects = new Set((root.dataset.writableProjects || "").split(",").filter(Boolean).map(Number));
  // A filtered or sorted list cannot tell where a new run belongs: it offers a reload instead.
  const filtered = root.dataset.filtered === "yes";
  const rows = new Map([...body.querySelectorAll("tr[data-run-id]")].map((row) => [Number(row.dataset.runId), row]));
  const csrfToken = () => (document.querySelector("[name=csrfmiddlewaretoken]") || {}).value || "";

  // Rows come drawn by the server (runs/rows/, the page's own row template): a live row is what a
  // reload would show, project, progress, reward, duration and ETA included.
  function parseRow(html) {
    const holder = document.createElement("tbody");
    holder.innerHTML = html.trim();
    return holder.firstElementChild;
  }

  // Every cell but the tick box (the reader's choice), and the name cell while its tags and notes are
  // being edited there.
  function update(row, fresh) {
    if (row.dataset.status !== fresh.dataset.status) state.updates += 1;
    row.dataset.status = fresh.dataset.status;
    const editing = row.querySelector(".annotation-editor") !== null;
    [...fresh.children].forEach((cell, index) => {
      if (index === 0 || (editing && cell.classList.contains("run-name"))) return;
      const old = row.children[index];
      if (old && old.outerHTML !== cell.outerHTML) old.replaceWith(cell);
    });
  }

  function addRow(fresh) {
    body.prepend(fresh);
    rows.set(Number(fresh.dataset.runId), fresh);
    table.hidden = false;
    const empty = document.getElementById("no-runs");
    if (empty) empty.hidden = true;
    state.added += 1;
  }

  async function poll() {
    try {
      const response = await fetch(`${root.dataset.rowsUrl}${window.location.search}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (response.ok) {
        const page = await response.json();
        const newest = rows.size ? Math.max(...rows.keys()) : 0;
        const created = [];
        for (const { id, html } of page.rows) {
          const fresh = parseRow(html);
          if (rows.has(id)) update(rows.get(id), fresh);
          else if (id > newest) created.push(fresh);
        }
        if (created.length && filtered) document.getElementById("new-runs-notice").hidden = false;
        else created.reverse().forEach(addRow);
        state.polls += 1;
      }
    } catch (error) {
      // A dropped request is retried at the next poll.
    } finally {
      setTimeout(poll, document.hidden ? POLL_MS * 5 : POLL_MS);
    }
  }
  setTimeout(poll, POLL_MS);

  function setStatus(row, run) {
    row.dataset.status = run.status;
    const cell = row.querySelector(".run-status");
    const badge = cell.querySelector(".badge");
    badge.textContent = run.status;
    badge.className = `badge badge-${run.status}`;
  }

  // --- tags and notes ---------------------------------------------------------

  function span(className, text) {
    const element = document.createElement("span");
    element.className = className;
    element.textContent = text;
    return element;
  }

  function drawAnnotations(annotations, tags, notes) {
    annotations.dataset.tags = tags.join(", ");
    annotations.dataset.notes = notes;
    const tagList = annotations.querySelector(".run-tags");
    tagList.replaceChildren(...tags.map((tag) => span("tag", tag)));
    const noteText = annotations.querySelector(".run-notes");
    noteText.textContent = notes.length > 80 ? `${notes.slice(0, 79)}…` : notes;
    noteText.title = notes;
  }

  function openEditor(annotations) {
    if (annotations.querySelector(".annotation-editor")) return;
    const row = annotations.closest("tr");
    const form = document.createElement("form");
    form.className = "annotation-editor";
    form.innerHTML =
      '<label>Tags <input name="tags" placeholder="comma, separated"></label>' +
      '<label>Notes <textarea name="notes" rows="2"></textarea></label>' +
      '<button type="submit" class="primary">Save</button> <button type="button" class="annotation-close">Close</button>' +
      ' <span class="error small annotation-error" role="alert"></span>';
    form.elements.tags.value = annotations.dataset.tags || "";
    form.elements.notes.value = annotations.dataset.notes || "";
    form.querySelector(".annotation-close").addEventListener("click", () => form.remove());
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const tags = form.elements.tags.value.split(",").map((tag) => tag.trim()).filter(Boolean);
      const response = await fetch(`${root.dataset.runsApiUrl}${row.dataset.runId}/`, {
        method: "PATCH",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
        body: JSON.stringify({ tags, notes: form.elements.notes.value }),
      });
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) {
        form.querySelector(".annotation-error").textContent =
          (answer.error && answer.error.message) || `Not saved (${response.status}).`;
        return;
      }
      drawAnnotations(annotations, answer.tags, answer.notes);
      form.remove();
    });
    annotations.append(form);
    form.elements.tags.focus();
  }

  body.addEventListener("click", (event) => {
    const button = event.target.closest(".run-annotate");
    if (button) openEditor(button.closest(".run-annotations"));
  });

  // --- selection: compare, cancel -------------------------------------------

  const compareButton = document.getElementById("compare-button");
  const cancelButton = document.getElementById("bulk-cancel-button");
  const selectAll = document.getElementById("select-all");
  const message = document.getElementById("bulk-message");
  const boxes = () => [...body.querySelectorAll(".run-select")];
  const selectedRows = () => boxes().filter((box) => box.checked).map((box) => box.closest("tr"));
  // Runs a writer may cancel: theirs to change and not yet ended.
  const cancellable = (row) => CANCELLABLE.has(row.dataset.status) && writableProjects.has(Number(row.dataset.projectId));

  function refreshSelection() {
    const picked = selectedRows();
    document.getElementById("selection-count").textContent = picked.length
      ? `${picked.length} run${picked.length === 1 ? "" : "s"} selected`
      : "No runs selected";
    compareButton.disabled = picked.length < 2;
    compareButton.textContent = picked.length ? `Compare selected (${picked.length})` : "Compare selected";
    if (cancelButton) {
      const count = picked.filter(cancellable).length;
      cancelButton.disabled = count === 0;
      cancelButton.textContent = count ? `Cancel selected (${count})` : "Cancel selected";
    }
  }

  body.addEventListener("change", (event) => {
    if (event.target.classList.contains("run-select")) refreshSelection();
  });
  selectAll.addEventListener("change", () => {
    boxes().forEach((box) => (box.checked = selectAll.checked));
    refreshSelection();
  });
  compareButton.addEventListener("click", () => {
    const ids = selectedRows().map((row) => row.dataset.runId);
    if (ids.length >= 2) window.location.href = `${root.dataset.compareUrl}?runs=${ids.join(",")}`;
  });

  if (cancelButton) {
    cancelButton.addEventListener("click", async () => {
      const picked = selectedRows().filter(cancellable);
      if (!picked.length) return;
      const names = picked.map((row) => `#${row.dataset.runId}`).join(", ");
      // The same native confirmation as confirm.js's data-confirm forms.
      if (!window.confirm(`Cancel ${picked.length} run${picked.length === 1 ? "" : "s"} (${names})? A cancelled run cannot be resumed.`)) {
        return;
      }
      cancelButton.disabled = true;
      const failures = [];
      for (const row of picked) {
        const response = await fetch(`${root.dataset.runsApiUrl}${row.dataset.runId}/cancel/`, {
          method: "POST",
          credentials: "same-origin",
          headers: { Accept: "application/json", "X-CSRFToken": csrfToken() },
        });
        const answer = await response.json().catch(() => ({}));
        if (response.ok) setStatus(row, answer);  // the next poll draws the rest of the row
        else failures.push(`#${row.dataset.runId}: ${(answer.error && answer.error.message) || response.status}`);
      }
      message.textContent = failures.length
        ? `Cancelled ${picked.length - failures.length}; not cancelled: ${failures.join("; ")}`
        : `Cancelled ${picked.length} run${picked.length === 1 ? "" : "s"}.`;
      refreshSelection();
    });
  }
  refreshSelection();
})();
