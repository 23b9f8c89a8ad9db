"""Whether every process of a multi-process trainer still lives, seen from process 0.

A collective waits for every process of the JAX job. When one is killed in the middle of a train
step, Gloo's all-reduce on CPU never fails: the leader waited in ``jax.device_get`` until the JAX
coordination service's heartbeat timeout ended it abruptly, with its run still ``running`` and
no reason given. So every follower also beats, from a thread of its own, in the key-value store
of the coordination service the job already runs (nothing new to deploy or to reach). The
leader's :class:`FollowerWatch` acts on a follower silent for :func:`follower_lapse_s`: a third
of the job's heartbeat timeout, so that it acts before the coordination service does.

Beats are counters, not timestamps: the hosts' clocks need not agree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: How often a follower beats.
BEAT_S = 1.0
# The store's keys: one counter per follower process.
_BEATS_DIRECTORY = "tandem/process_beats/"


def follower_lapse_s(heartbeat_timeout_s: float) -> float:
    """How long a follower may stay silent before the leader counts it lost: a third of the job's
    heartbeat timeout (JAX's coordination service ends every process at the full timeout), and never
    under five beats."""
    return max(5 * BEAT_S, heartbeat_timeout_s / 3)


def _client():
    # The job's own coordination-service client; its key-value store is not part of JAX's public
    # API, but it is what Orbax and JAX's multihost utilities use between processes.
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("no JAX job to beat in: initialize_distributed() first")
    return client


class ProcessBeat(threading.Thread):
    """A follower's beats: a counter in the job's key-value store, raised every ``beat_s``."""

    def __init__(self, process_id: int, *, beat_s: float = BEAT_S):
        super().__init__(name=f"process-beat-{process_id}", daemon=True)
        self._key = f"{_BEATS_DIRECTORY}{process_id}"
        self._beat_s = beat_s
        self._stopped = threading.Event()

    def run(self) -> None:
        client = _client()
        while True:
            try:
                client.key_value_increment(self._key, 1)
            except Exception as exc:  # noqa: BLE001 - the coordinator is gone: the follower's next order fails too
                logger.warning("process beat stopped: %s", exc)
                return
            if self._stopped.wait(self._beat_s):
                return

    def stop(self) -> None:
        self._stopped.set()


def read_beats() -> dict[int, str]:
    """Every follower's latest beat in the job's store, by process id."""
    return {int(key.rsplit("/", 1)[1]): value for key, value in _client().key_value_dir_get(_BEATS_DIRECTORY)}


class FollowerWatch(threading.Thread):
    """Process 0's watch on its followers' beats: ``on_silent(process_id, silent_s)`` once, when one has
    not beaten for ``lapse_s``; the handler is expected to end the process.

    ``read`` and ``clock`` default to the job's store and ``time.monotonic``; a follower that has not
    beaten yet counts as silent since the watch began.
    """

    def __init__(self, followers: list[int], *, lapse_s: float, on_silent: Callable[[int, float], None],
                 read: Callable[[], dict[int, str]] = read_beats, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = BEAT_S):
        super().__init__(name="follower-watch", daemon=True)
        self._followers = list(followers)
        self._lapse_s = lapse_s
        self._on_silent = on_silent
        self._read = read
        self._clock = clock
        self._poll_s = poll_s
        self._stopped = threading.Event()

    def check(self, seen: dict[int, tuple[str | None, float]]) -> tuple[int, float] | None:
        """One look at the beats: updates ``seen`` (last value and when it changed, per follower) and
        returns the first follower silent past the lapse, with how long, or None."""
        beats = self._read()
        now = self._clock()
        for process_id in self._followers:
            value = beats.get(process_id)
            last_value, changed_at = seen.setdefault(process_id, (None, now))
            if value != last_value:
                seen[process_id] = (value, now)
            elif now - changed_at >= self._lapse_s:
                return process_id, now - changed_at
        return None

    def run(self) -> None:
        seen: dict[int, tuple[str | None, float]] = {}
        while not self._stopped.is_set():
            try:
                silent = self.check(seen)
            except Exception as exc:  # noqa: BLE001 - the store is in this process: a failure here is the job's end
                logger.warning("the watch on the trainer's other processes stopped: %s", exc)
                return
            if silent is not None:
                process_id, silent_s = silent
                logger.error("process %d of the trainer's JAX job has not beaten for %.0f s", process_id, silent_s)
                self._on_silent(process_id, silent_s)
                return
            self._stopped.wait(self._poll_s)

    def stop(self) -> None:
        self._stopped.set()
