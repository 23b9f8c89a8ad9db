"""Run logs: how many lines of each run the platform keeps, and how long it drains an ended run's stream."""

from .env_vars import env_float, env_str

# Lines kept per run; past it the oldest are deleted and counted (shown on the run page and in the
# API). About 300 bytes a line: the default keeps some 15 MB of a chatty run.
TANDEM_RUN_LOG_LINES_MAX = int(env_str("TANDEM_RUN_LOG_LINES_MAX", "50000"))
# An ended run's stream is still drained this long: its producers finish their tasks (and log) after it.
TANDEM_RUN_LOG_DRAIN_AFTER_END_S = env_float("TANDEM_RUN_LOG_DRAIN_AFTER_END_S", 600.0)
