// The dashboard's one WebSocket loop: a run's live updates (charts.js re-exports it for the run page's
// scripts, run_logs.js and metric_explorer.js) and the user's own unread count (notifications.js).
// Loaded on every signed-in page (base.html), before those scripts.
(function () {
  "use strict";

  const SOCKET_RETRY_MIN_MS = 1000;
  const SOCKET_RETRY_MAX_MS = 15000;

  // Keeps a WebSocket to `path` (this host, ws: or wss: as the page) open: on a close it
  // reconnects after a backoff from 1 s doubling to 15 s, jittered, back to 1 s once one opens.
  // `state.socket` is the socket now open or opening (null while none is), `state.reconnects`
  // counts the reconnections. `onOpen(socket)` at every open, `onMessage(message)` with each
  // message's parsed JSON; `onClose(event)` at a close, which says whether to reconnect (true
  // unless it returns false) and may return the text to show meanwhile through `onRetry(text)`.
  function runSocket(path, state, { onOpen = () => {}, onMessage, onClose = () => true, onRetry = () => {} }) {
    let retryMs = SOCKET_RETRY_MIN_MS;
    function connect() {
      const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
      const socket = new WebSocket(`${scheme}//${window.location.host}${path}`);
      state.socket = socket;
      socket.addEventListener("open", () => {
        retryMs = SOCKET_RETRY_MIN_MS;
        onOpen(socket);
      });
      socket.addEventListener("message", (event) => onMessage(JSON.parse(event.data)));
      socket.addEventListener("close", (event) => {
        if (state.socket !== socket) return;
        state.socket = null;
        if (onClose(event) === false) return;
        onRetry(`reconnecting in ${Math.round(retryMs / 1000)} s…`);
        const delay = retryMs * (0.75 + Math.random() / 2);
        retryMs = Math.min(retryMs * 2, SOCKET_RETRY_MAX_MS);
        setTimeout(() => {
          state.reconnects += 1;
          connect();
        }, delay);
      });
    }
    connect();
  }

  window.tandemSocket = { runSocket };
})();
