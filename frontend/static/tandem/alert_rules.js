// The alert rule form shows only the settings the chosen kind uses (alerts.services.SETTINGS_OF_KIND).
(function () {
  "use strict";

  const SETTINGS_OF_KIND = {
    metric_threshold: ["metric", "comparison", "threshold", "steps"],
    trainer_idle: ["threshold", "minutes"],
    no_progress: ["minutes"],
    tools_unused: ["steps"],
  };
  const SETTINGS = ["metric", "comparison", "threshold", "steps", "minutes"];

  const form = document.getElementById("alert-rule-form");
  if (!form) return;
  const kind = form.querySelector("[name=kind]");

  function show() {
    const used = SETTINGS_OF_KIND[kind.value] || [];
    for (const name of SETTINGS) {
      const wrapper = form.querySelector(`.alert-rule-field[data-field="${name}"]`);
      const input = form.querySelector(`[name="${name}"]`);
      const shown = used.includes(name);
      wrapper.hidden = !shown;
      // A hidden setting is not sent: the service refuses settings a kind does not use.
      input.disabled = !shown;
      // Every setting a kind uses is required by it (alerts.services._rule_check).
      input.required = shown;
    }
  }

  kind.addEventListener("change", show);
  show();
})();
