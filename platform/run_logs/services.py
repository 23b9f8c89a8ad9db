"""Writes of run logs: draining the runs' Redis streams into the database, under a cap per run."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

import pydantic
import redis
from django.conf import settings
from django.db import transaction
from django.db.models import F

from tandem.contracts import RUN_LOG_LEVELS, RunLogRecord, SchemaVersionError, run_log_stream

from .models import RunLogLine, RunLogState
from .realtime import run_logs_broadcast_on_commit
from .selectors import run_log_streams_to_drain

logger = logging.getLogger(__name__)

#: Stream entries one drain reads per run at most; a longer backlog is read at the next drains.
DRAIN_ENTRIES_PER_RUN = 5000


@dataclass(frozen=True)
class StreamSnapshot:
    """A run's stream as one drain read it: its entries after the cursor and its counters."""

    entries: list[tuple[str, dict]]
    entries_added: int
    length: int


def run_logs_drain(*, client: redis.Redis | None = None) -> dict[int, int]:
    """Store what the streams of every run that may still log hold; returns run id -> lines stored.

    Called by the beat task ``tandem.platform.drain_run_logs``. A Redis that is away
    costs this drain only: the streams keep their entries for the next.
    """
    own_client = client is None
    if own_client:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)
    stored: dict[int, int] = {}
    try:
        for run_id in run_log_streams_to_drain():
            snapshot = _read_stream(client, run_id)
            if snapshot is None:
                continue
            count, last_entry_id = run_log_lines_store(run_id=run_id, snapshot=snapshot)
            if last_entry_id is not None:
                # Stored (committed): they leave the stream. Ids are "<ms>-<seq>"; MINID keeps those at or after it.
                milliseconds, sequence = last_entry_id.split("-")
                deleted = client.xtrim(run_log_stream(run_id), minid=f"{milliseconds}-{int(sequence) + 1}",
                                       approximate=False)
                RunLogState.objects.filter(run_id=run_id).update(
                    stream_entries_deleted=F("stream_entries_deleted") + deleted)
            if count:
                stored[run_id] = count
    finally:
        if own_client:
            client.close()
    return stored


def _read_stream(client: redis.Redis, run_id: int) -> StreamSnapshot | None:
    """The run's stream after its cursor, or None when it has no stream."""
    key = run_log_stream(run_id)
    try:
        info = client.xinfo_stream(key)
    except redis.ResponseError:
        return None  # no such key: nothing was logged for the run (or it expired)
    cursor = RunLogState.objects.filter(run_id=run_id).values_list("stream_cursor", flat=True).first() or "0-0"
    entries = client.xrange(key, min=f"({cursor}", max="+", count=DRAIN_ENTRIES_PER_RUN)
    return StreamSnapshot(
        entries=[(_text(entry_id), fields) for entry_id, fields in entries],
        entries_added=int(info.get("entries-added", 0)),
        length=int(info.get("length", 0)),
    )


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@transaction.atomic
def run_log_lines_store(*, run_id: int, snapshot: StreamSnapshot) -> tuple[int, str | None]:
    """Store the snapshot's entries as the run's lines, keep the run under its cap, count what Redis trimmed.

    Returns ``(lines stored, id of the last entry stored or None)``. An entry that cannot be
    read (a newer writer's schema, a malformed payload) is stored as a warning saying so.
    """
    state, _ = RunLogState.objects.select_for_update().get_or_create(run_id=run_id)
    _count_trimmed(state, snapshot)
    lines = [_line(run_id, entry_id, fields) for entry_id, fields in snapshot.entries]
    if lines:
        RunLogLine.objects.bulk_create(lines)
        state.stream_cursor = snapshot.entries[-1][0]
        state.lines_kept += len(lines)
    cap = settings.TANDEM_RUN_LOG_LINES_MAX
    if state.lines_kept > cap:
        excess = state.lines_kept - cap
        oldest_kept = (RunLogLine.objects.filter(run_id=run_id).order_by("id")
                       .values_list("id", flat=True)[excess:excess + 1].first())
        deleted, _ = RunLogLine.objects.filter(run_id=run_id, id__lt=oldest_kept).delete()
        state.lines_kept -= deleted
        state.lines_deleted += deleted
    state.save()
    if lines:
        run_logs_broadcast_on_commit(run_id=run_id, last_line_id=lines[-1].pk, lines=len(lines))
    return len(lines), (snapshot.entries[-1][0] if lines else None)


def _count_trimmed(state: RunLogState, snapshot: StreamSnapshot) -> None:
    """Add to ``lines_lost`` the entries Redis trimmed (the stream's MAXLEN) before the platform read them."""
    if snapshot.entries_added < state.stream_entries_added or (
            snapshot.entries_added < state.stream_entries_deleted + snapshot.length):
        # The stream expired (or was deleted) and was made again: its counters start over.
        state.stream_entries_deleted = state.stream_entries_trimmed = 0
    trimmed = max(snapshot.entries_added - state.stream_entries_deleted - snapshot.length, 0)
    if trimmed > state.stream_entries_trimmed:
        state.lines_lost += trimmed - state.stream_entries_trimmed
        state.stream_entries_trimmed = trimmed
    state.stream_entries_added = snapshot.entries_added


def _line(run_id: int, entry_id: str, fields: dict) -> RunLogLine:
    try:
        record = RunLogRecord.from_stream_fields(fields)
    except (pydantic.ValidationError, SchemaVersionError, TypeError, ValueError) as exc:
        return RunLogLine(run_id=run_id, logged_at=_entry_time(entry_id), level=RUN_LOG_LEVELS["WARNING"],
                          role="platform", hostname="", pid=0, logger=__name__,
                          message=f"log entry {entry_id} could not be read: {str(exc)[:500]}")
    return RunLogLine(
        run_id=run_id, logged_at=datetime.fromtimestamp(record.created, tz=UTC),
        level=RUN_LOG_LEVELS[record.level], role=record.role, hostname=record.hostname[:255], pid=record.pid,
        logger=record.logger[:255], message=record.message, traceback=record.traceback,
    )


def _entry_time(entry_id: str) -> datetime:
    return datetime.fromtimestamp(int(entry_id.split("-")[0]) / 1000, tz=UTC)
