// The navigation's unread badge, live: the user's notification socket (alerts.consumers) sends the
// count when it opens and whenever it changes (a rule fired, a notification was read). It reconnects as
// every socket of the dashboard does (socket.js), but for a close whose credential no longer holds
// (4401, logged out).
(function () {
  "use strict";

  const link = document.getElementById("nav-notifications");
  if (!link || !link.dataset.websocketPath) return;
  const UNAUTHENTICATED = 4401;
  const state = (window.tandemNotifications = { unread: null, messages: 0, socket: null, reconnects: 0 });

  function draw(unread) {
    state.unread = unread;
    let badge = document.getElementById("notification-badge");
    if (!unread) {
      if (badge) badge.remove();
      return;
    }
    if (!badge) {
      badge = document.createElement("span");
      badge.id = "notification-badge";
      badge.className = "badge nav-badge";
      link.append(" ", badge);
    }
    badge.textContent = String(unread);
    badge.title = `${unread} unread`;
  }

  window.tandemSocket.runSocket(link.dataset.websocketPath, state, {
    onMessage: (message) => {
      if (message.type !== "notifications.unread") return;
      state.messages += 1;
      draw(message.unread);
    },
    // A socket closed for its credential (logged out, a revoked token) is not opened again.
    onClose: (event) => event.code !== UNAUTHENTICATED,
  });
})();
