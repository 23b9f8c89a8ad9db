"""The tests' bounded waits: a condition polled a bounded number of times, never a clock compared.

How long a run or a server takes is a benchmark's business (bench/); a test only needs to
wait for something it observes through records, and to give up, loudly, if it never comes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest


def poll_until(condition: Callable[[], object], *, timeout_s: float, what: str | Callable[[], str],
               interval_s: float = 0.1, between: Callable[[], None] | None = None,
               ignoring: tuple[type[BaseException], ...] = ()) -> object:
    """``condition()``'s first truthy value, polled every ``interval_s`` about ``timeout_s`` long.

    ``between`` runs after each miss (it may raise: a process that died, say); ``ignoring``
    are exceptions that mean "not yet" (a server still starting). Out of tries, the test
    fails saying ``what`` was waited for (a callable: its text then, a log tail say).
    """
    for _ in range(max(1, math.ceil(timeout_s / interval_s))):
        try:
            value = condition()
        except ignoring:
            value = None
        if value:
            return value
        if between is not None:
            between()
        time.sleep(interval_s)
    pytest.fail(f"gave up after about {timeout_s:g}s waiting for {what() if callable(what) else what}")
