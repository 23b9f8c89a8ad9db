"""The ReAct agent of openai_react_agent.py as an HTTP agent service: ``POST /episodes`` with the episode's
task, endpoint and key runs one episode through the ``openai`` client and answers ``{"reward": float}``.
No Tandem import; the tests start it on a free port (:func:`running`)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from openai import OpenAI

from tests.agents.openai_react_agent import play


class _Server(ThreadingHTTPServer):
    # Episodes arrive together: a short listen queue would drop connections into a 1 s SYN retry.
    request_queue_size = 256
    daemon_threads = True


# One client for the service's life, as a long-lived service keeps one: each episode's copy
# (``with_options``) shares its connection pool and TLS setup, and only changes the endpoint and key.
_CLIENT = OpenAI(base_url="http://127.0.0.1:1/v1", api_key="unset", max_retries=0)


class _Episodes(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the http.server API
        if self.path != "/episodes":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        client = _CLIENT.with_options(base_url=body["base_url"], api_key=body["api_key"])
        reward = play(body["task"], client, body["model"])
        payload = json.dumps({"reward": reward}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def running() -> Iterator[str]:
    """The service on a free loopback port, for the ``with`` block; its base URL."""
    server = _Server(("127.0.0.1", 0), _Episodes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="The ReAct agent as an HTTP agent service.")
    parser.add_argument("--port", type=int, required=True)
    _Server(("127.0.0.1", parser.parse_args().port), _Episodes).serve_forever()
