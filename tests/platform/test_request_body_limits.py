"""Request bodies past their route's cap or deadline, refused by a real uvicorn before Django reads
them (common/request_limits.py): nothing spooled to disk, no connection held by a trickle.

The server runs with small caps (TANDEM_DATASET_MAX_BYTES and TANDEM_REQUEST_MAX_BYTES below),
still larger than Django's in-memory spool (FILE_UPLOAD_MAX_MEMORY_SIZE, 2.5 MiB), so a body
that reached Django's handler would land in the server's temporary directory, which the tests
measure: the files there and the deleted ones the server still holds open.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from tandem.runtime.local_ports import free_local_port
from tests.polling import poll_until
from tests.processes import stop_process

from .conftest import REPO_ROOT

DATASET_MAX_BYTES = 3 * 2**20
REQUEST_MAX_BYTES = 3 * 2**20
# What the settings add to the dataset cap for the form around the file.
UPLOAD_FORM_OVERHEAD_BYTES = 2**20
BODY_TIMEOUT_S = 2


class Server:
    def __init__(self, base: str, process: subprocess.Popen, spool: Path):
        self.base = base
        self.port = int(base.rsplit(":", 1)[1])
        self.process = process
        self.spool = spool

    def spooled_bytes(self) -> int:
        """Bytes of the temporary files under the server's TMPDIR: those listed, and those it
        holds open after deleting them (Django's spooled body rolls over into such a file)."""
        total = sum(path.stat().st_size for path in self.spool.rglob("*") if path.is_file())
        fd_dir = Path(f"/proc/{self.process.pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
                if target.startswith(str(self.spool)) and target.endswith("(deleted)"):
                    total += os.stat(fd).st_size
            except FileNotFoundError:
                continue  # closed meanwhile
        return total


@pytest.fixture
def limited_server(transactional_db, tmp_path):
    """uvicorn serving the platform from the test database with small body caps and deadline,
    its temporary files in a directory of the test's own."""
    db = connection.settings_dict
    spool = tmp_path / "spool"
    spool.mkdir()
    port = free_local_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "TANDEM_TEST_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "PYTHONPATH": str(REPO_ROOT),
        "TMPDIR": str(spool),
        "TANDEM_DATASET_MAX_BYTES": str(DATASET_MAX_BYTES),
        "TANDEM_REQUEST_MAX_BYTES": str(REQUEST_MAX_BYTES),
        "TANDEM_REQUEST_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
    }
    log = tmp_path / "uvicorn.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT / "platform", env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"

    def started():
        assert process.poll() is None, log.read_text()
        return httpx.get(f"{base}/api/", timeout=1).status_code == 200

    try:
        poll_until(started, timeout_s=30, what=lambda: f"uvicorn to start:\n{log.read_text()}",
                   ignoring=(httpx.TransportError,))
        yield Server(base, process, spool)
    finally:
        stop_process(process)
        print(log.read_text()[-4000:])  # shown when the test fails


def _request_head(method: str, path: str, port: int, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer_if_any(sock: socket.socket) -> bytes | None:
    """The server's whole answer once it has closed the connection after it; None while it has not answered."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return None
    return _read_until_closed(sock) or None


def _read_until_closed(sock: socket.socket, received: bytes = b"") -> bytes:
    """What the server sent before it closed. A server that closes with some of the request
    still unread in its buffer resets the connection (RFC 1122 4.2.2.13) after its answer, so a
    reset ends the answer as a close does; a reset before any answer is still an error."""
    chunks = [received]
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        if not any(chunks):
            raise
    return b"".join(chunks)


def _status_and_body(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_an_unauthenticated_upload_past_the_cap_is_refused_before_its_body_is_read(limited_server):
    # A multipart upload declaring more than the dataset route takes, without credentials (which would
    # be a 401 after Django read the body). It asks to continue (Expect: 100-continue), so the server
    # says whether it reads the body before the client sends any of it.
    declared = DATASET_MAX_BYTES + UPLOAD_FORM_OVERHEAD_BYTES + 1
    with socket.create_connection(("127.0.0.1", limited_server.port), timeout=30) as sock:
        sock.sendall(_request_head("POST", "/api/datasets/", limited_server.port, {
            "Content-Type": "multipart/form-data; boundary=x", "Content-Length": str(declared),
            "Expect": "100-continue"}))
        answer = sock.recv(65536)
        if answer.startswith(b"HTTP/1.1 100"):
            # It reads the body: most of it, past Django's in-memory spool, is sent to see where it goes.
            sent = 0
            while sent < declared - 2**20:
                sock.sendall(b"x" * 65536)
                sent += 65536
            poll_until(lambda: limited_server.spooled_bytes() >= sent, timeout_s=30,
                       what="the body to reach the server's temporary directory")
            pytest.fail(f"the server read the refused body into {limited_server.spooled_bytes()} bytes of "
                        "temporary files")
        answer = _read_until_closed(sock, answer)

    status, body = _status_and_body(answer)
    assert status == 413, answer[:300]
    assert body["error"]["code"] == "too_large"
    assert limited_server.spooled_bytes() == 0


def test_a_chunked_body_is_refused_at_the_first_byte_past_the_cap(limited_server):
    # No Content-Length: the cap is only found while the body streams. The login form's route
    # takes the default cap; exactly one byte past it is sent, then the test waits.
    with socket.create_connection(("127.0.0.1", limited_server.port), timeout=30) as sock:
        sock.sendall(_request_head("POST", "/login/", limited_server.port, {
            "Content-Type": "application/x-www-form-urlencoded", "Transfer-Encoding": "chunked"}))
        chunk = b"u" * 2**20
        for _ in range(REQUEST_MAX_BYTES // len(chunk)):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sock.sendall(b"1\r\nu\r\n")
        answer = poll_until(
            lambda: _answer_if_any(sock) or limited_server.spooled_bytes() >= REQUEST_MAX_BYTES,
            timeout_s=30, what="an answer, or the body spooled to disk")

    assert answer is not True, f"the server spooled at least {REQUEST_MAX_BYTES} bytes of the refused body"
    status, body = _status_and_body(answer)
    assert status == 413, answer[:300]
    assert body["error"]["code"] == "too_large"
    assert limited_server.spooled_bytes() == 0


def test_a_trickling_body_is_cut_off_at_its_deadline(limited_server):
    # One byte at a time of a login form declared at 1000 bytes: the server gives up on it
    # (after BODY_TIMEOUT_S), long before the trickle would end (1000 sends apart).
    with socket.create_connection(("127.0.0.1", limited_server.port), timeout=30) as sock:
        sock.sendall(_request_head("POST", "/login/", limited_server.port, {
            "Content-Type": "application/x-www-form-urlencoded", "Content-Length": "1000"}))
        answer = None
        for _ in range(1000):
            answer = _answer_if_any(sock)
            if answer:
                break
            sock.sendall(b"u")
            time.sleep(0.1)
        else:
            pytest.fail("the server was still reading the trickling body after 1000 bytes of it")

    status, body = _status_and_body(answer)
    assert status == 408, answer[:300]
    assert body["error"]["code"] == "request_timeout"


def test_the_dataset_route_still_takes_an_upload_of_its_whole_cap(limited_server, make_user, make_project):
    user = make_user()
    make_project(owner=user)
    row = json.dumps({"messages": [{"role": "user", "content": "q" * 60_000},
                                   {"role": "assistant", "content": "a"}]}).encode() + b"\n"
    file = row * (DATASET_MAX_BYTES // len(row))
    assert DATASET_MAX_BYTES - len(row) < len(file) <= DATASET_MAX_BYTES  # larger than the default cap too

    response = httpx.post(f"{limited_server.base}/api/datasets/", headers={"Authorization": f"Token {user.raw_token}"},
                          data={"name": "whole-cap"}, files={"file": ("rows.jsonl", file)}, timeout=120)

    assert response.status_code in (201, 202), response.text[:500]


def test_a_small_body_and_a_websocket_less_get_pass_as_before(limited_server):
    assert httpx.get(f"{limited_server.base}/api/", timeout=10).status_code == 200
    # An unauthenticated small post reaches Django and gets its usual 401.
    assert httpx.post(f"{limited_server.base}/api/runs/", json={"x": 1}, timeout=10).status_code == 401
