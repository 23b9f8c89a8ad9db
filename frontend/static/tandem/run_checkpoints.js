// The checkpoints section of the run page (runs/_checkpoints.html): list, export, download, delete.
(function () {
  "use strict";
  const root = document.getElementById("checkpoints");
  if (!root) return;
  const listUrl = root.dataset.listUrl;
  const canWrite = root.dataset.canWrite === "true";
  const csrf = document.querySelector("#checkpoints-csrf [name=csrfmiddlewaretoken]").value;
  const body = root.querySelector("tbody");
  const error = document.getElementById("checkpoints-error");
  let timer = null;
  // The contracts' CheckpointStatus and CheckpointExportStatus (window.tandemContracts).
  const CHECKPOINT = window.tandemContracts.checkpoint_statuses.by_name;
  const EXPORT = window.tandemContracts.checkpoint_export_statuses.by_name;

  function megabytes(bytes) {
    return (bytes / 1e6).toFixed(1) + " MB";
  }

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function button(label, onClick, className) {
    const element = document.createElement("button");
    element.type = "button";
    element.textContent = label;
    if (className) element.className = className;
    element.addEventListener("click", onClick);
    return element;
  }

  async function act(method, url) {
    error.hidden = true;
    const response = await fetch(url, {
      method, credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRFToken": csrf },
    });
    if (!response.ok) {
      const answer = await response.json().catch(() => ({}));
      error.textContent = (answer.error && answer.error.message) || `${method} failed (${response.status})`;
      error.hidden = false;
    }
    load();
  }

  function render(checkpoints) {
    body.replaceChildren();
    if (!checkpoints.length) {
      const row = body.insertRow();
      cell(row, "No checkpoint yet.").colSpan = 6;
      return;
    }
    for (const checkpoint of checkpoints) {
      const row = body.insertRow();
      row.dataset.step = checkpoint.step;
      cell(row, checkpoint.step);
      // -1: saved before the trainer published any policy, i.e. during SFT.
      cell(row, checkpoint.policy_version < 0 ? "none yet (SFT)" : checkpoint.policy_version);
      cell(row, megabytes(checkpoint.size_bytes));
      cell(row, checkpoint.status === CHECKPOINT.DELETED
        ? `${CHECKPOINT.DELETED} (${checkpoint.deleted_reason})` : checkpoint.status);
      const exportCell = cell(row, checkpoint.export_status === EXPORT.FAILED
        ? `${EXPORT.FAILED}: ${checkpoint.export_error}` : checkpoint.export_status);
      const actions = cell(row, "");
      if (checkpoint.status !== CHECKPOINT.AVAILABLE) continue;
      const url = `${listUrl}${checkpoint.step}/`;
      if (checkpoint.download_url) {
        const link = document.createElement("a");
        link.className = "button";
        link.href = checkpoint.download_url;
        link.textContent = "Download";
        exportCell.append(" ", link);
      }
      if (canWrite) {
        if (checkpoint.export_status !== EXPORT.EXPORTING) {
          actions.appendChild(button("Export", () => act("POST", url + "export/")));
        }
        actions.appendChild(button("Delete", () => {
          if (window.confirm(`Delete the checkpoint of step ${checkpoint.step}?`)) act("DELETE", url);
        }, "danger"));
      }
    }
  }

  async function load() {
    clearTimeout(timer);
    const response = await fetch(listUrl + "?page_size=100", {
      credentials: "same-origin", headers: { Accept: "application/json" },
    });
    if (!response.ok) return;
    const page = await response.json();
    render(page.results);
    // Exports finish on the export worker; checkpoints arrive while the run trains.
    timer = setTimeout(load, page.results.some((c) => c.export_status === EXPORT.EXPORTING) ? 2000 : 15000);
  }

  load();
})();
