// The run list as a workspace: status badges kept live and new runs added by polling the
// REST list, tags and notes edited in place (PATCH /api/runs/<id>/), and actions on the
// ticked rows: compare them, or cancel them after a confirmation.
//
// Polling (not one WebSocket per run) because the list shows up to a hundred runs; one
// request every few seconds refreshes them all and finds the runs created since.
(function () {
  "use strict";

  const root = document.getElementById("runs-root");
  if (!root) return;
  const POLL_MS = 3000;
  const PAGE_SIZE = 200;
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

  function setStatus(row, run) {
    row.dataset.status = run.status;
    const cell = row.querySelector(".run-status");
    const badge = cell.querySelector(".badge");
    badge.textContent = run.status;
    badge.className = `badge badge-${run.status}`;
    if (run.status_reason) cell.title = run.status_reason;
    else cell.removeAttribute("title");
  }

  function show(run) {
    const row = rows.get(run.id);
    if (!row) return;
    if (row.dataset.status !== run.status) {
      setStatus(row, run);
      state.updates += 1;
    }
    row.querySelector(".run-step").title = `trainer step ${run.trainer_step}`;
    row.querySelector(".run-step").textContent = progressLabel(run);
    row.querySelector(".run-policy").textContent = `v${run.policy_version}`;
  }

  // The same words as runs/summaries.py's progress_label.
  function progressLabel(run) {
    const sft = Number(run.config.sft_steps || 0);
    const rl = Number(run.config.rl_steps || 0);
    const sftDone = Math.min(run.trainer_step, sft);
    const rlDone = Math.min(Math.max(run.trainer_step - sft, 0), rl);
    return sft ? `SFT ${sftDone}/${sft} · RL ${rlDone}/${rl}` : `RL ${rlDone}/${rl}`;
  }

  function cell(className, ...children) {
    const td = document.createElement("td");
    if (className) td.className = className;
    td.append(...children);
    return td;
  }

  function span(className, text) {
    const element = document.createElement("span");
    element.className = className;
    element.textContent = text;
    return element;
  }

  // A row like the template's, for a run created after the page was drawn.
  function addRow(run) {
    const row = document.createElement("tr");
    row.dataset.runId = String(run.id);
    row.dataset.projectId = String(run.project);
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "run-select";
    box.value = String(run.id);
    box.setAttribute("aria-label", `select ${run.name}`);
    const link = document.createElement("a");
    link.href = new URL(run.urls.page, window.location.href).pathname;
    link.textContent = run.name;
    const annotations = document.createElement("div");
    annotations.className = "run-annotations";
    annotations.append(span("run-tags", ""), span("run-notes muted small", ""));
    if (writableProjects.has(run.project)) annotations.append(annotateButton(run.name));
    drawAnnotations(annotations, run.tags || [], run.notes || "");
    const status = cell("run-status", span("badge", ""));
    const created = cell("", "just now");
    created.title = run.created_at;
    row.append(
      cell("", box),
      cell("run-name", link, " ", span("muted", `#${run.id}`), annotations),
      cell("", run.environment),
      status,
      cell("run-step", progressLabel(run)),
      cell("run-reward", span("muted", "none yet")),
      cell("run-duration", "not started"),
      cell("run-policy", `v${run.policy_version}`),
      created,
    );
    setStatus(row, run);
    box.addEventListener("change", refreshSelection);
    body.prepend(row);
    rows.set(run.id, row);
    table.hidden = false;
    const empty = document.getElementById("no-runs");
    if (empty) empty.hidden = true;
    state.added += 1;
  }

  async function poll() {
    try {
      // Newest first, as the list is unless sorted otherwise: the runs that change are the recent ones.
      const response = await fetch(`${root.dataset.runsApiUrl}?page_size=${PAGE_SIZE}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (response.ok) {
        const page = await response.json();
        const newest = rows.size ? Math.max(...rows.keys()) : 0;
        const created = page.results.filter((run) => run.id > newest && !rows.has(run.id));
        if (created.length && filtered) document.getElementById("new-runs-notice").hidden = false;
        else created.reverse().forEach(addRow);
        page.results.forEach(show);
        state.polls += 1;
      }
    } catch (error) {
      // A dropped request is retried at the next poll.
    } finally {
      setTimeout(poll, document.hidden ? POLL_MS * 5 : POLL_MS);
    }
  }
  setTimeout(poll, POLL_MS);

  // --- tags and notes ---------------------------------------------------------

  function annotateButton(name) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "link-button run-annotate";
    button.textContent = "edit";
    button.setAttribute("aria-label", `edit tags and notes of ${name}`);
    return button;
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
        if (response.ok) setStatus(row, answer);
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
