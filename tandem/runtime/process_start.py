"""What each of Tandem's long-lived processes does as it starts: find Redis, and stop cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_url(explicit: str | None = None) -> str:
    """``explicit`` (a ``--redis-url``), else ``$REDIS_URL``, else :data:`DEFAULT_REDIS_URL`."""
    return explicit or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)


def stop_on_sigterm() -> None:
    """Turn SIGTERM (and Ctrl-C) into KeyboardInterrupt so ``finally`` blocks run on a clean stop."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    # A shell that starts us in the background hands SIGINT down as ignored;
    # Ctrl-C must still stop everything cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
