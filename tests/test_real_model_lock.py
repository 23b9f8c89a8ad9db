"""Real-model tests of two suites on one host take turns (tests/conftest.py's host-wide lock)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from tests.conftest import _host_wide_lock

HOLD_THEN_EXIT = """
import fcntl, sys, time
handle = open(sys.argv[1], "a")
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(2)
"""


def test_a_real_model_test_waits_until_another_suites_lets_go(tmp_path):
    lock = tmp_path / "real-model.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THEN_EXIT, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    never_asked = SimpleNamespace(config=None, nodeid="x")  # only a wait past its bound writes to the terminal
    with _host_wide_lock(lock, wait_s=120, item=never_asked):
        assert holder.poll() is not None, "the lock was taken while another process held it"
    holder.wait(timeout=30)
    holder.stdout.close()
