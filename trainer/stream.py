"""Reading a run's trajectory stream through the trainer's consumer group.

Entries are acknowledged only after the update that used them, so a trainer
that dies mid-step leaves them pending, and the next trainer re-reads its
pending entries before new ones. Groups are assembled here: GRPO needs every
episode of a group before any of them can be trained on.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import redis
from pydantic import ValidationError

from tandem.contracts import (
    TRAINER_CONSUMER_GROUP,
    SchemaVersionError,
    TrajectoryRecord,
    dead_letter_stream,
    trajectory_stream,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamEntry:
    entry_id: str
    record: TrajectoryRecord


class TrajectoryStreamReader:
    def __init__(self, client: redis.Redis, *, run_id: int, consumer: str):
        self._redis = client
        self.stream = trajectory_stream(run_id)
        self._dead_letters = dead_letter_stream(run_id)
        self._consumer = consumer
        self._own_pending_drained = False
        try:
            self._redis.xgroup_create(self.stream, TRAINER_CONSUMER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, *, block_ms: int, count: int = 256) -> list[StreamEntry]:
        """Entries this consumer has not trained on: its own pending ones first."""
        if not self._own_pending_drained:
            entries = self._read_from("0", block_ms=None, count=count)
            if entries:
                return entries
            self._own_pending_drained = True
        return self._read_from(">", block_ms=block_ms, count=count)

    def _read_from(self, start: str, *, block_ms: int | None, count: int) -> list[StreamEntry]:
        response = self._redis.xreadgroup(
            TRAINER_CONSUMER_GROUP, self._consumer, {self.stream: start}, count=count, block=block_ms
        )
        entries = []
        for _, messages in response or []:
            for raw_id, fields in messages:
                entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                if not fields:  # trimmed while pending: nothing left to train on
                    self.ack([entry_id])
                    continue
                try:
                    entries.append(StreamEntry(entry_id, TrajectoryRecord.from_stream_fields(fields)))
                except (ValidationError, SchemaVersionError, KeyError, ValueError) as exc:
                    self._dead_letter(entry_id, fields, f"{type(exc).__name__}: {exc}")
        return entries

    def _dead_letter(self, entry_id: str, fields: dict, reason: str) -> None:
        logger.error("trajectory %s is unreadable, moved to %s: %s", entry_id, self._dead_letters, reason)
        payload = {k: v for k, v in fields.items()}
        payload.update({"original_id": entry_id, "reason": reason})
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self._dead_letters, payload)
            pipe.xack(self.stream, TRAINER_CONSUMER_GROUP, entry_id)
            pipe.execute()

    def ack(self, entry_ids: list[str]) -> int:
        return self._redis.xack(self.stream, TRAINER_CONSUMER_GROUP, *entry_ids) if entry_ids else 0


class GroupAssembler:
    """Holds trajectories until their whole group has arrived; hands out whole groups, oldest first."""

    def __init__(self) -> None:
        self._partial: OrderedDict[str, list[StreamEntry]] = OrderedDict()
        self._trained: set[str] = set()
        self.duplicates: list[str] = []

    def add(self, entry: StreamEntry) -> None:
        group_id = entry.record.group_id
        if group_id in self._trained:
            # A redelivered rollout task produced this group again; train on it once.
            self.duplicates.append(entry.entry_id)
            return
        self._partial.setdefault(group_id, []).append(entry)

    def complete_groups(self) -> int:
        return sum(1 for entries in self._partial.values() if len(entries) >= entries[0].record.group_size)

    def take(self, num_groups: int) -> list[list[StreamEntry]]:
        taken = []
        for group_id, entries in list(self._partial.items()):
            if len(taken) == num_groups:
                break
            group_size = entries[0].record.group_size
            if len(entries) >= group_size:
                del self._partial[group_id]
                self._trained.add(group_id)
                # Extra copies of a group (redelivery) are dropped, not trained twice.
                self.duplicates.extend(entry.entry_id for entry in entries[group_size:])
                taken.append(entries[:group_size])
        return taken

    def take_duplicates(self) -> list[str]:
        duplicates, self.duplicates = self.duplicates, []
        return duplicates
