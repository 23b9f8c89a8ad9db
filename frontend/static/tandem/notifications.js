// The navigation's unread badge, live: the user's notification socket (alerts.consumers) sends the
// count when it opens and whenever it changes (a rule fired, a notification was read). On a close it
// reconnects after a backoff from 1 s doubling to 30 s; a closed socket whose credential no longer
// holds (4401, logged out) is not reopened.
(function () {
  "use strict";

  const link = document.getElementById("nav-notifications");
  if (!link || !link.dataset.websocketPath) return;
  const UNAUTHENTICATED = 4401;
  const state = (window.tandemNotifications = { unread: null, messages: 0, socket: null });
  let retryMs = 1000;

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

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${window.location.host}${link.dataset.websocketPath}`);
    state.socket = socket;
    socket.addEventListener("open", () => { retryMs = 1000; });
    socket.addEventListener("message", (event) => {
      const message = JSON.parse(event.data);
      if (message.type !== "notifications.unread") return;
      state.messages += 1;
      draw(message.unread);
    });
    socket.addEventListener("close", (event) => {
      state.socket = null;
      if (event.code === UNAUTHENTICATED) return;
      setTimeout(connect, retryMs * (0.75 + Math.random() / 2));
      retryMs = Math.min(retryMs * 2, 30000);
    });
  }
  connect();
})();
