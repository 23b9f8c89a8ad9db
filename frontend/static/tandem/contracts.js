// The contracts' vocabularies (run statuses, evaluation metrics) as the platform renders them on every
// page (base.html, common/templatetags/vocabulary.py): the dashboard's scripts read them from
// window.tandemContracts and keep no copy of their own.
(function () {
  "use strict";
  const script = document.getElementById("tandem-contracts");
  window.tandemContracts = script ? JSON.parse(script.textContent) : null;
})();
