// Destructive forms (data-confirm="<question>") ask before they post; common/confirmation.py
// explains the page that asks when this script does not run.
(function () {
  "use strict";

  const CONFIRMED_FIELD = "confirmed";

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.dataset.confirm) return;
    if (!window.confirm(form.dataset.confirm)) {
      event.preventDefault();
      return;
    }
    let field = form.querySelector(`input[name="${CONFIRMED_FIELD}"]`);
    if (!field) {
      field = document.createElement("input");
      field.type = "hidden";
      field.name = CONFIRMED_FIELD;
      form.appendChild(field);
    }
    field.value = "yes";
  });
})();
