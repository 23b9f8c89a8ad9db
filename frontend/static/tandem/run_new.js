// The generated new-run form: the picked environment's health, and checks on blur from the
// schema's bounds (the server validates again with RunConfig and shows its errors inline).
(function () {
  "use strict";
  const form = document.getElementById("new-run-form");
  if (!form) return;

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

  function problem(input) {
    const text = input.value.trim();
    if (input.dataset.json) {
      if (!text) return "";
      try { JSON.parse(text); } catch (error) { return "Not valid JSON."; }
      return "";
    }
    if (input.type !== "number" || !text) return "";
    const number = Number(text);
    if (!Number.isFinite(number)) return "Enter a number.";
    if (input.dataset.integer && !Number.isInteger(number)) return "Enter a whole number.";
    const data = input.dataset;
    if (data.min !== undefined && number < Number(data.min)) return "Must be at least " + data.min + ".";
    if (data.max !== undefined && number > Number(data.max)) return "Must be at most " + data.max + ".";
    if (data.exclusiveMin !== undefined && number <= Number(data.exclusiveMin)) return "Must be greater than " + data.exclusiveMin + ".";
    if (data.exclusiveMax !== undefined && number >= Number(data.exclusiveMax)) return "Must be less than " + data.exclusiveMax + ".";
    return "";
  }

  function showErrors(box, messages, kind) {
    box.querySelectorAll(".field-error").forEach((node) => node.remove());
    box.classList.toggle("has-error", messages.length > 0);
    messages.forEach((message) => {
      const line = document.createElement("p");
      line.className = "error field-error " + kind;
      line.textContent = message;
      // Under the input, above the help text, where the submit puts its errors too.
      box.insertBefore(line, box.querySelector(".help"));
    });
  }

  function check(input) {
    const message = problem(input);
    showErrors(input.closest(".config-field"), message ? [message] : [], "client-error");
    return !message;
  }

  // The whole config as a submit would check it (rules across fields too), creating nothing.
  let pending = null;
  async function checkOnServer() {
    const request = fetch(form.dataset.validateUrl, {
      method: "POST", body: new FormData(form), credentials: "same-origin",
      headers: {"X-CSRFToken": form.elements.csrfmiddlewaretoken.value},
    });
    pending = request;
    const response = await request;
    if (pending !== request || !response.ok) return;  // a newer check is under way, or none to show
    const result = await response.json();
    form.querySelectorAll(".config-field[data-path]").forEach((box) => {
      const input = box.querySelector("[data-default]");
      if (input && problem(input)) return;  // the browser's own message stays
      showErrors(box, result.errors[box.dataset.path] || [], "server-check");
    });
    form.querySelectorAll(".config-section[data-path]").forEach((section) => {
      section.querySelectorAll(":scope > .section-error").forEach((node) => node.remove());
      (result.errors[section.dataset.path] || []).forEach((message) => {
        const line = document.createElement("p");
        line.className = "error section-error server-check";
        line.textContent = message;
        section.querySelector(".config-grid").before(line);
      });
    });
  }

  function markChanged(input) {
    const box = input.closest(".config-field");
    const value = input.type === "checkbox" ? String(input.checked) : input.value.trim();
    let fallback = input.dataset.default;
    if (fallback === "None") fallback = "";
    box.classList.toggle("changed", value !== fallback && !(input.type === "number" && Number(value) === Number(fallback) && value !== ""));
  }

  // Picking an algorithm shows its preset (dapo: epsilon_high 0.28, overlong shaping, ...),
  // the values the trainer would use, which the user may then change.
  const presets = JSON.parse(document.getElementById("algorithm-presets").textContent);
  const algorithm = document.getElementById("id_config_algorithm__name");
  if (algorithm) algorithm.addEventListener("change", () => {
    const preset = presets[algorithm.value] || {};
    Object.entries(preset).forEach(([name, value]) => {
      const input = form.elements["config.algorithm." + name];
      if (!input || name === "name") return;
      if (input.type === "checkbox") input.checked = Boolean(value);
      else if (input.dataset.json) input.value = value === null ? "" : JSON.stringify(value);
      else input.value = value === null ? "" : String(value);
      markChanged(input);
      check(input);
    });
  });

  form.querySelectorAll("[data-default]").forEach((input) => {
    markChanged(input);
    input.addEventListener("blur", () => { if (check(input)) checkOnServer(); });
    input.addEventListener("change", () => markChanged(input));
    input.addEventListener("input", () => markChanged(input));
  });
})();
