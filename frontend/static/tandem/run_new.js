// The generated new-run form (runs/new.html): the picked environment's health, optional sections'
// toggles, repeatable rows, presets, checks in the browser and on the server (every error at once,
// each at its field, the page scrolled to the first), and the review step before the run starts.
// The server stays the authority: the submit validates again and shows its errors inline.
(function () {
  "use strict";
  const form = document.getElementById("new-run-form");
  if (!form) return;
  const body = document.getElementById("form-body");
  const review = document.getElementById("review");

  // --- The environment picker shows the picked version's health. ---
  const picker = document.getElementById("id_environment");
  function showHealth() {
    const option = picker.selectedOptions[0];
    const panel = document.getElementById("environment-health");
    if (!option || !option.dataset.status) { panel.hidden = true; return; }
    panel.hidden = false;
    const badge = document.getElementById("environment-health-status");
    badge.className = "badge badge-" + option.dataset.status;
    badge.textContent = option.dataset.statusLabel;
    document.getElementById("environment-health-reason").textContent = option.dataset.reason;
    const probed = document.getElementById("environment-health-probed");
    probed.textContent = option.dataset.probedAgo || "never";
    probed.title = option.dataset.probedAt;
  }
  if (picker) picker.addEventListener("change", showHealth);

  // --- Optional sections (evaluation, algorithm.kl, ...): their toggle shows or hides their fields. ---
  function showSection(toggle) {
    const section = toggle.closest(".config-section");
    section.querySelector(":scope > [data-section-body]").hidden = !toggle.checked;
  }
  function isOff(input) {
    return Boolean(input.closest("[data-section-body][hidden]"));
  }

  // --- Repeatable rows (sft.datasets, evaluation.datasets): names carry the row's index. ---
  function renumber(rows) {
    const path = rows.dataset.rows;
    rows.querySelectorAll(":scope > .config-row").forEach((row, index) => {
      row.dataset.rowIndex = String(index);
      const pattern = new RegExp("(" + path.replace(/\./g, "[.]") + "[.])(\\d+|__index__)([.])");
      const idPattern = new RegExp("(" + path.replace(/\./g, "__") + "__)(\\d+|__index__)(__)");
      row.querySelectorAll("[name]").forEach((input) => { input.name = input.name.replace(pattern, "$1" + index + "$3"); });
      row.querySelectorAll("[id]").forEach((node) => { node.id = node.id.replace(idPattern, "$1" + index + "$3"); });
      row.querySelectorAll("label[for]").forEach((label) => { label.htmlFor = label.htmlFor.replace(idPattern, "$1" + index + "$3"); });
      row.querySelectorAll(".config-field[data-path]").forEach((box) => {
        box.dataset.path = box.dataset.path.replace(pattern, "$1" + index + "$3");
      });
    });
  }
  function addRow(button) {
    const box = button.closest(".config-field");
    const rows = box.querySelector(".config-rows");
    const copy = box.querySelector("template[data-row-template]").content.firstElementChild.cloneNode(true);
    rows.appendChild(copy);
    renumber(rows);
    watchInputs(copy);
    const first = copy.querySelector("input, select, textarea");
    if (first) first.focus();
    markAll();
  }
  function removeRow(button) {
    const rows = button.closest(".config-rows");
    button.closest(".config-row").remove();
    renumber(rows);
    markAll();
  }
  form.addEventListener("click", (event) => {
    const target = event.target;
    if (target.matches("[data-rows-add]")) addRow(target);
    else if (target.matches(".row-remove")) removeRow(target);
  });

  // --- Checks in the browser: every number, list and JSON input, from the schema's bounds. ---
  function numberProblem(text, data) {
    const number = Number(text);
    if (!Number.isFinite(number)) return "Enter a number.";
    if (data.integer && !Number.isInteger(number)) return "Enter a whole number.";
    if (data.min !== undefined && number < Number(data.min)) return "Must be at least " + data.min + ".";
    if (data.max !== undefined && number > Number(data.max)) return "Must be at most " + data.max + ".";
    if (data.exclusiveMin !== undefined && number <= Number(data.exclusiveMin)) return "Must be greater than " + data.exclusiveMin + ".";
    if (data.exclusiveMax !== undefined && number >= Number(data.exclusiveMax)) return "Must be less than " + data.exclusiveMax + ".";
    return "";
  }
  function problem(input) {
    const text = input.value.trim();
    if (!text || isOff(input)) return "";
    if (input.dataset.json) {
      try { JSON.parse(text); } catch (error) { return "Not valid JSON: " + error.message; }
      return "";
    }
    if (input.dataset.list && input.dataset.itemType !== "string") {
      const items = text.split(input.dataset.list === "line" ? "\n" : ",").map((item) => item.trim()).filter(Boolean);
      const whole = input.dataset.itemType === "integer";
      const bad = items.filter((item) => !Number.isFinite(Number(item)) || (whole && !Number.isInteger(Number(item))));
      return bad.length ? bad.join(", ") + ": not " + (whole ? "a whole number." : "a number.") : "";
    }
    if (input.dataset.number) return numberProblem(text, input.dataset);
    return "";
  }

  function fieldBox(input) { return input.closest(".config-field"); }

  function showErrors(box, messages, kind) {
    box.querySelectorAll(":scope > .field-error").forEach((node) => node.remove());
    box.classList.toggle("has-error", messages.length > 0);
    messages.forEach((message) => {
      const line = document.createElement("p");
      line.className = "error field-error " + kind;
      line.textContent = message;
      // Under the input, above the help text, where the submit puts its errors too.
      box.insertBefore(line, box.querySelector(":scope > .help"));
    });
  }

  function check(input) {
    const message = problem(input);
    showErrors(fieldBox(input), message ? [message] : [], "client-error");
    return !message;
  }

  function configInputs() {
    return Array.from(body.querySelectorAll("[data-default]"));
  }

  // --- The summary of every error above the form, and scrolling to the first one. ---
  function labelOf(box) {
    const row = box.closest(".config-row");
    if (!row) return box.dataset.label;
    const list = row.closest(".config-field");
    return list.dataset.label + ", row " + (Number(row.dataset.rowIndex) + 1) + ": " + box.dataset.label;
  }
  function targetOf(node) {
    const input = node.matches(".config-section") ? node : node.querySelector("[id]");
    return input ? input.id : "";
  }
  function summarise(formErrors) {
    const list = document.getElementById("form-error-list");
    list.replaceChildren();
    const flagged = Array.from(form.querySelectorAll(".config-field.has-error, .config-section"))
      .filter((node) => node.matches(".config-field") || node.querySelector(":scope > .section-error"));
    let count = 0;
    flagged.forEach((node) => {
      const messages = node.matches(".config-field")
        ? node.querySelectorAll(":scope > .field-error") : node.querySelectorAll(":scope > .section-error");
      const label = node.matches(".config-field") ? labelOf(node)
        : node.querySelector(".section-title, legend").textContent.trim();
      messages.forEach((message) => {
        const item = document.createElement("li");
        const link = document.createElement("a");
        link.href = "#" + targetOf(node);
        link.dataset.target = targetOf(node);
        link.textContent = label;
        item.append(link, ": " + message.textContent);
        list.appendChild(item);
        count += 1;
      });
    });
    (formErrors || []).forEach((message) => {
      const item = document.createElement("li");
      item.className = "form-error";
      item.textContent = message;
      list.appendChild(item);
      count += 1;
    });
    document.getElementById("form-error-count").textContent = String(count);
    document.getElementById("form-error-summary").hidden = count === 0;
    return count;
  }

  function reveal(node) {
    // A flagged field in a folded section opens it; in an optional section that is off, nothing can hide it.
    for (let details = node.closest("details"); details; details = details.parentElement.closest("details")) {
      details.open = true;
    }
  }
  function scrollToFirstError() {
    // The first message on the page: a section's own comes before its fields'.
    const first = form.querySelector(".config-field.has-error > .field-error, .config-section > .section-error");
    if (!first) return;
    form.querySelectorAll(".config-field.has-error, .section-error").forEach(reveal);
    const box = first.classList.contains("section-error") ? first : first.parentElement;
    box.scrollIntoView({block: "center"});
    const input = box.querySelector("input:not([type=hidden]), select, textarea");
    if (input) input.focus({preventScroll: true});
  }

  // --- The server's verdict (RunConfig's rules, across fields too), creating nothing. ---
  let pending = null;
  async function checkOnServer() {
    const request = fetch(form.dataset.validateUrl, {
      method: "POST", body: new FormData(form), credentials: "same-origin",
      headers: {"X-CSRFToken": form.elements.csrfmiddlewaretoken.value},
    });
    pending = request;
    const response = await request;
    if (pending !== request || !response.ok) return null;  // a newer check is under way, or none to show
    const result = await response.json();
    showServerErrors(result.errors);
    summarise(result.form_errors);
    return result;
  }

  // The server reports every field it finds wrong, so a field flagged earlier and still wrong stays flagged.
  function showServerErrors(errors) {
    form.querySelectorAll(".config-field[data-path]").forEach((box) => {
      if (!box.querySelector("[data-default], .config-rows")) return;  // environment and name: not the config's
      const own = Array.from(box.querySelectorAll("[data-default]")).find((input) => fieldBox(input) === box);
      if (own && problem(own)) return;  // the browser's own message stays
      showErrors(box, errors[box.dataset.path] || [], "server-check");
    });
    form.querySelectorAll(".config-section[data-path]").forEach((section) => {
      section.querySelectorAll(":scope > .section-error").forEach((node) => node.remove());
      if (!section.dataset.path) return;  // errors of the whole config are listed above the form
      (errors[section.dataset.path] || []).forEach((message) => {
        const line = document.createElement("p");
        line.className = "error section-error server-check";
        line.textContent = message;
        section.querySelector(":scope > .section-body").before(line);
      });
    });
  }

  // --- What differs from the default: marked, and counted on each folded section. ---
  function markChanged(input) {
    const box = fieldBox(input);
    const value = input.type === "checkbox" ? String(input.checked) : input.value.trim();
    let fallback = input.dataset.default;
    if (fallback === "None" || fallback === "empty" || fallback === "none") fallback = "";
    const sameNumber = input.dataset.number && value !== "" && Number(value) === Number(fallback);
    box.classList.toggle("changed", value !== fallback && !sameNumber && !box.closest("template"));
  }
  function markAll() {
    configInputs().forEach(markChanged);
    form.querySelectorAll("details.config-section").forEach((section) => {
      const changed = section.querySelectorAll(".config-field.changed").length
        + section.querySelectorAll("[data-section-toggle]:checked").length
        + section.querySelectorAll(".config-row").length;
      const count = section.querySelector(":scope > summary .changed-count");
      count.hidden = changed === 0;
      count.textContent = changed + " changed";
    });
  }

  // --- Presets: fill the fields, then say what changed. ---
  const presets = JSON.parse(document.getElementById("form-presets").textContent);
  function currentText(input) {
    if (input.type === "checkbox") return input.checked ? "on" : "off";
    return input.value.trim() === "" ? "none" : input.value.trim();
  }
  function applyPreset(key, alreadyChanged) {
    const preset = presets[key];
    if (!preset) return;
    const changes = alreadyChanged ? [alreadyChanged] : [];
    Object.entries(preset.inputs).forEach(([name, value]) => {
      const input = form.elements[name];
      if (!input || input.nodeName === undefined) return;
      const before = currentText(input);
      if (input.type === "checkbox") input.checked = Boolean(value);
      else input.value = value;
      const after = currentText(input);
      if (input.matches("[data-section-toggle]")) showSection(input);
      if (before !== after) {
        const box = input.matches("[data-section-toggle]") ? null : fieldBox(input);
        const label = box ? labelOf(box) : input.closest("label").textContent.trim();
        changes.push(label + " " + before + " → " + after);
      }
      if (!input.matches("[data-section-toggle]")) check(input);
    });
    markAll();
    const summary = document.getElementById("preset-summary");
    summary.hidden = false;
    summary.textContent = preset.label + ": " + (changes.length ? "changed " + changes.join("; ") + "."
      : "every field already had its value.");
    if (algorithm) algorithmBefore = algorithm.value;
    document.querySelectorAll("button.preset").forEach((button) => button.classList.toggle("applied", button.dataset.preset === key));
  }
  document.querySelectorAll("button[data-preset]").forEach((button) => {
    button.addEventListener("click", () => {
      // An algorithm preset picks the algorithm too; the select's own change fills the rest.
      applyPreset(button.dataset.preset);
    });
  });
  // Picking an algorithm shows its preset (dapo: epsilon_high 0.28, overlong shaping, ...),
  // the values the trainer would use, which the user may then change.
  const algorithm = document.getElementById("id_config_algorithm__name");
  let algorithmBefore = algorithm ? algorithm.value : "";
  if (algorithm) algorithm.addEventListener("change", () => {
    const picked = "Algorithm " + algorithmBefore + " → " + algorithm.value;
    algorithmBefore = algorithm.value;
    applyPreset("algorithm-" + algorithm.value, picked);
  });

  // --- The review step: everything checked, then what the run changes from the defaults. ---
  async function showReview() {
    // The browser's messages stay where it finds one; the server's mark every other field.
    configInputs().forEach(check);
    const result = await checkOnServer();
    if (result === null) return;
    const count = summarise(result.form_errors);
    if (count > 0) { scrollToFirstError(); return; }
    const rows = review.querySelector("#review-table tbody");
    rows.replaceChildren();
    result.review.forEach((line) => {
      const row = document.createElement("tr");
      row.dataset.path = line.path;
      [line.label, line.default, line.value].forEach((text, index) => {
        const cell = document.createElement("td");
        if (index === 0) {
          cell.textContent = text + " ";
          const code = document.createElement("code");
          code.className = "muted";
          code.textContent = line.path;
          cell.appendChild(code);
        } else {
          cell.textContent = text;
        }
        row.appendChild(cell);
      });
      rows.appendChild(row);
    });
    review.querySelector("#review-table").hidden = result.review.length === 0;
    document.getElementById("review-empty").hidden = result.review.length > 0;
    document.getElementById("review-environment").textContent = picker && picker.selectedOptions[0]
      ? picker.selectedOptions[0].textContent : "none";
    document.getElementById("review-name").textContent = form.elements.name.value.trim() || "(the environment's name and the time)";
    body.hidden = true;
    document.getElementById("presets").hidden = true;  // nothing changes the fields behind the review
    review.hidden = false;
    review.scrollIntoView({block: "start"});
  }
  document.getElementById("review-run").addEventListener("click", showReview);
  // Enter in a field asks for the review too: a run starts only from it.
  form.addEventListener("submit", (event) => {
    if (review.hidden) { event.preventDefault(); showReview(); }
  });
  document.getElementById("review-back").addEventListener("click", () => {
    review.hidden = true;
    body.hidden = false;
    document.getElementById("presets").hidden = false;
  });
  // A link of the error summary opens the folded section its field is in, and goes to it.
  document.getElementById("form-error-list").addEventListener("click", (event) => {
    const link = event.target.closest("a[data-target]");
    const target = link && document.getElementById(link.dataset.target);
    if (!target) return;
    event.preventDefault();
    reveal(target);
    target.scrollIntoView({block: "center"});
    if (target.focus) target.focus({preventScroll: true});
  });

  function watchInputs(root) {
    root.querySelectorAll("[data-default]").forEach((input) => {
      input.addEventListener("blur", () => { if (check(input)) checkOnServer(); else summarise(); });
      input.addEventListener("change", () => markAll());
      input.addEventListener("input", () => markChanged(input));
    });
  }
  form.querySelectorAll("[data-section-toggle]").forEach((toggle) => {
    toggle.addEventListener("change", () => { showSection(toggle); markAll(); });
  });
  watchInputs(body);
  markAll();
  // A submit the server refused: its errors are at their fields; go to the first.
  if (!document.getElementById("form-error-summary").hidden) scrollToFirstError();
})();
