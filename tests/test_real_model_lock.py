"""Real-model tests of two suites on one host take turns (tests/conftest.py's host-wide lock)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from tests.conftest import _host_wide_lock

# Holds the lock a while, then says so in a file before it lets go: whoever takes the lock next
# must find the file. (Not the holder's exit: a process lets go of its locks when its files close,
# a moment before it has exited, and a loaded host can be seen in that moment.)
HOLD_THEN_RELEASE = """
import fcntl, pathlib, sys, time
handle = open(sys.argv[1], "a")
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(2)
pathlib.Path(sys.argv[2]).write_text("released")
fcntl.flock(handle, fcntl.LOCK_UN)
"""


def test_a_real_model_test_waits_until_another_suites_lets_go(tmp_path):
    lock, released = tmp_path / "real-model.lock", tmp_path / "released"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THEN_RELEASE, str(lock), str(released)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    never_asked = SimpleNamespace(config=None, nodeid="x")  # only a wait past its bound writes to the terminal
    with _host_wide_lock(lock, wait_s=120, item=never_asked):
        assert released.exists(), "the lock was taken while another process held it"
    assert holder.wait(timeout=30) == 0
    holder.stdout.close()
