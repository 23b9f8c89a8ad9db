"""A run's log lines: what its trainer and producers log while they work on it.

Each process ships the records it logs inside a run's scope (``tandem/runtime/run_logs.py``)
to the run's bounded stream :func:`~tandem.contracts.keys.run_log_stream`, one
:class:`RunLogRecord` per entry; the platform drains the streams into its database
and serves them on the run's page and API.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tandem.contracts.schema import StreamRecord

#: Longest message and traceback a record carries; longer ones are cut, saying so.
RUN_LOG_MESSAGE_CHARS = 8000
RUN_LOG_TRACEBACK_CHARS = 32000

#: Entries a run's stream keeps at most (approximately: Redis trims whole nodes). The platform
#: drains it every few seconds; only a flood while the platform worker is away reaches this.
RUN_LOG_STREAM_MAX_ENTRIES = 20000

RunLogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]

#: The levels in increasing severity, with the numbers of Python's ``logging``.
RUN_LOG_LEVELS: dict[str, int] = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}

#: The roles of processes that log into a run (``ProcessRole``'s that work on runs).
RunLogRole = Literal["trainer", "rollout_worker"]


def run_log_level_name(levelno: int) -> RunLogLevel:
    """The named level at or below ``levelno`` (a custom level 25 reads as INFO)."""
    name = "DEBUG"
    for candidate, number in RUN_LOG_LEVELS.items():
        if levelno >= number:
            name = candidate
    return name  # type: ignore[return-value]


class RunLogRecord(StreamRecord):
    """One log record of a process, attributed to the run it was logged for."""

    run_id: int
    created: float = Field(description="Unix time the record was logged, by its process's clock.")
    level: RunLogLevel
    logger: str = Field(description="The logger's name (`tandem.trainer`, `workers.producer` ...).")
    message: str = Field(max_length=RUN_LOG_MESSAGE_CHARS, description="The formatted message, secrets redacted.")
    traceback: str = Field("", max_length=RUN_LOG_TRACEBACK_CHARS,
                           description="The exception's traceback (and stack) when there is one, secrets redacted.")
    role: RunLogRole
    hostname: str
    pid: int
