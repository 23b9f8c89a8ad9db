// The run page's status and facts (see data.js): the badge, the actions on offer, the stall
// flag, the alerts that hold, the policy version, the connection, and the sentence of what the trainer
// waited on.
(function () {
  "use strict";

  const rp = window.tandemRunPageParts;
  if (!rp) return;
  const { TERMINAL, WAITING, el, page, runUrl, actionsByStatus } = rp;

  function showRun(update) {
    // An ended run does not come back to life because of a stale REST answer.
    const ended = TERMINAL.has(page.status) && !TERMINAL.has(update.status);
    if (update.status && update.status !== page.status && !ended) {
      page.status = update.status;
      el.status.textContent = update.status;
      el.status.className = `badge badge-${update.status}`;
      if (TERMINAL.has(update.status) && el.cancelForm) el.cancelForm.remove();
      if (TERMINAL.has(update.status)) showRunEnded();
      // A claimed run's environment passed its probe: the wait is over.
      const waiting = document.getElementById("run-environment-reason");
      if (waiting && !WAITING.has(update.status)) waiting.remove();
      // Only the actions the new status admits stay on offer (the server decided per status).
      const offered = actionsByStatus[update.status] || [];
      for (const form of document.querySelectorAll("#run-actions form[data-action]")) {
        form.hidden = !offered.includes(form.dataset.action);
      }
      refreshFacts().catch(console.error);
    }
    if (update.status_reason !== undefined) el.statusReason.textContent = update.status_reason;
    // The progress watchdog's flag: set while the step stands still, null once it advances.
    if (update.stalled_since !== undefined) {
      el.stalled.hidden = update.stalled_since === null;
      if (update.stalled_since !== null) {
        el.stalledSince.dateTime = update.stalled_since;
        el.stalledSince.textContent = update.stalled_since.replace("T", " ").slice(0, 19);
      }
    }
    // Versions only grow: a REST answer that left before a socket message must not
    // put an older version back on screen.
    const version = update.policy_version;
    if (version !== undefined && version !== null && !(version < page.policyVersion)) {
      page.policyVersion = version;
      el.policyVersion.textContent = String(version);
    }
  }

  // The alerts whose condition holds on the run (runs/detail.html draws them): a badge with the rule's
  // name and what its firing said; an alert that stops holding goes. From the socket ("alert" messages)
  // and from the run's REST answer (its whole list, after a reconnect).
  function alertItem(alert) {
    const item = document.createElement("li");
    item.dataset.rule = String(alert.rule);
    item.dataset.kind = alert.kind;
    const badge = item.appendChild(document.createElement("span"));
    badge.className = "badge badge-alert";
    badge.textContent = alert.name;
    const text = document.createElement("span");
    text.className = "alert-text";
    text.textContent = alert.text;
    item.append(" ", text);
    return item;
  }

  function showAlert(alert) {
    const list = document.getElementById("run-alerts");
    const existing = list.querySelector(`li[data-rule="${Number(alert.rule)}"]`);
    if (alert.active) {
      const item = alertItem(alert);
      if (existing) existing.replaceWith(item);
      else list.appendChild(item);
    } else if (existing) {
      existing.remove();
    }
    list.hidden = list.children.length === 0;
  }

  function showAlerts(alerts) {
    const list = document.getElementById("run-alerts");
    list.replaceChildren(...alerts.map(alertItem));
    list.hidden = alerts.length === 0;
  }

  function showConnection(text) {
    if (TERMINAL.has(page.status)) showRunEnded();
    else el.connection.textContent = text;
  }

  // An ended run sends nothing more: an open socket is no reason to say "live" (runs/detail.html says the same).
  function showRunEnded() {
    el.connection.textContent = `none, the run has ended (${page.status})`;
  }

  // When it started, its trainer and its attempts, as the server draws them: a resume or a claim changes
  // them (a newer answer wins over an older one still on its way).
  let factsAsked = 0;
  async function refreshFacts() {
    const section = document.getElementById("run-attempts-section");
    const asked = ++factsAsked;
    const response = await fetch(section.dataset.factsUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok || asked !== factsAsked) return;
    const facts = await response.json();
    if (asked !== factsAsked) return;
    document.getElementById("run-started").textContent = facts.started;
    document.getElementById("run-trainer").textContent = facts.trainer;
    const wasOpen = section.querySelector("#run-attempts")?.open;
    section.innerHTML = facts.attempts_html;
    const attempts = section.querySelector("#run-attempts");
    if (attempts && wasOpen) attempts.open = true;
    page.factRefreshes = (page.factRefreshes || 0) + 1;
  }

  async function refreshRun() {
    const response = await fetch(runUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) return;
    const run = await response.json();
    showRun(run);
    refreshFacts().catch(console.error);  // after a reconnect: what changed while the socket was down
    if (run.alerts) showAlerts(run.alerts);
  }

  // The sentence of what the trainer waited on, asked again at most every IDLE_REFRESH_MS while steps come.
  const IDLE_REFRESH_MS = 5000;
  let idleRefreshDue = null;
  let idleRefreshAgain = false; // a step came while a read was due or under way: read once more after it
  function refreshIdle() {
    const idle = document.getElementById("run-idle");
    if (!idle) return;
    if (idleRefreshDue !== null) {
      idleRefreshAgain = true;
      return;
    }
    idleRefreshDue = setTimeout(async () => {
      try {
        const response = await fetch(idle.dataset.idleUrl, { credentials: "same-origin" });
        if (!response.ok) return;
        const summary = (await response.json()).idle;
        idle.textContent = summary ? summary.sentence : "";
        idle.hidden = !summary;
        page.idleRefreshes += 1;
      } catch (error) {
        console.warn("the idle summary could not be read", error);
      } finally {
        idleRefreshDue = null;
        if (idleRefreshAgain) {
          idleRefreshAgain = false;
          refreshIdle();
        }
      }
    }, page.idleRefreshes === 0 ? 0 : IDLE_REFRESH_MS);
  }

  Object.assign(rp, { showRun, showAlert, showConnection, showRunEnded, refreshRun, refreshIdle });
})();
