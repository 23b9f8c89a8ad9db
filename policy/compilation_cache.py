"""JAX's persistent compilation cache, shared by the trainer and the rollout workers of a host.

Every Tandem process compiles the same programs again: the trainer its train
step for each run, each rollout worker its prefill and decode buckets. With
this cache XLA writes what it compiled to a directory, and a later process
(or engine) with the same program, JAX version and devices loads it instead
of compiling: a nano model's 21 inference buckets take 11 s to compile on two
CPU cores and 1.6 s to load. Compiling mid-run stalls every episode of the
worker, which is what made the first steps of each run slow.

``TANDEM_COMPILATION_CACHE_DIR`` names the directory (default
``$XDG_CACHE_HOME/tandem/jax``, i.e. ``~/.cache/tandem/jax``); ``off`` leaves
the cache off. Entries are never evicted: clear the directory to reclaim the
space (a nano model's entries take about 1 MB).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jax

logger = logging.getLogger(__name__)

CACHE_DIR_VARIABLE = "TANDEM_COMPILATION_CACHE_DIR"

# Programs that compile faster than this are not written: tiny ones (an eager
# op, a cast) would cost more to store and read back than to compile.
MIN_COMPILE_TIME_S = 0.2


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tandem" / "jax"


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> Path | None:
    """Point JAX at the persistent cache; returns its directory, or None when it is off.

    Call it before the process compiles anything: JAX reads the setting when
    it first compiles. Calling it again with the same directory changes nothing.
    """
    value = str(directory) if directory is not None else os.environ.get(CACHE_DIR_VARIABLE, "")
    if value.strip().lower() == "off":
        return None
    path = Path(value).expanduser() if value.strip() else default_cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # A read-only home must not stop training: it only compiles every time.
        logger.warning("JAX compilation cache off: cannot create %s (%s)", path, exc)
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    return path
