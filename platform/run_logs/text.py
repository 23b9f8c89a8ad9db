"""A run's log as plain text: the download's format."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tandem.contracts import run_log_level_name

from .models import RunLogLine, RunLogState


def run_log_line_text(line: RunLogLine) -> str:
    """``<time> <LEVEL> <role> <host>:<pid> <logger>: <message>``, the traceback indented below."""
    text = (f"{line.logged_at.isoformat(timespec='milliseconds')} {run_log_level_name(line.level):<8} "
            f"{line.role} {line.hostname}:{line.pid} {line.logger}: {line.message}\n")
    if line.traceback:
        text += "".join(f"    {row}\n" for row in line.traceback.splitlines())
    return text


def run_log_text(*, run_id: int, state: RunLogState, lines: Iterable[RunLogLine]) -> Iterator[str]:
    """The header, then every line; streamed, so a long log never sits whole in memory."""
    yield f"# run {run_id}: {state.lines_kept} lines kept\n"
    if state.lines_deleted:
        yield f"# {state.lines_deleted} older lines were deleted to keep the run under TANDEM_RUN_LOG_LINES_MAX\n"
    if state.lines_lost:
        yield f"# {state.lines_lost} lines were trimmed from the run's Redis stream before they were stored\n"
    for line in lines:
        yield run_log_line_text(line)
