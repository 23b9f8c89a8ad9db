"""Reading a run's trajectory stream through the trainer's consumer group.

Delivery is at least once; training is at most once per trajectory:

- Entries are acknowledged only after the update that used them, so a trainer
  that dies mid-step leaves them pending, and the next trainer re-reads its
  pending entries before new ones.
- Entries left pending by a consumer that is gone (another name) are
  reclaimed with XAUTOCLAIM once idle for ``reclaim_idle_ms``. Entries this
  reader still holds (read, not yet acknowledged: a partial group waiting for
  its last episodes) are kept fresh so they are never reclaimed from it.
- An entry delivered more than ``max_deliveries`` times (it keeps killing the
  trainer, or keeps being orphaned) goes to the dead-letter stream with the
  reason, and is acknowledged, instead of looping forever.
- What was trained on (or dropped) is recorded, atomically with the
  acknowledgement, in two bounded sorted sets per run (group ids and
  trajectory ids): a redelivered producer task or a retried XADD never gets
  trained twice, across trainer restarts too.
- :meth:`TrajectoryStreamReader.trim` drops acknowledged entries from the
  stream and never an entry that is pending or not yet delivered.

Groups are assembled here: GRPO needs every episode of a group before any of
them can be trained on.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import redis
from pydantic import ValidationError

from tandem.contracts import (
    TRAINER_CONSUMER_GROUP,
    SchemaVersionError,
    TrajectoryRecord,
    consumed_groups_key,
    consumed_trajectories_key,
    dead_letter_stream,
    trajectory_stream,
)

logger = logging.getLogger(__name__)

# Dead letters are for people to inspect; the newest ones are the useful ones.
_DEAD_LETTER_MAXLEN = 10_000


@dataclass(frozen=True)
class StreamEntry:
    entry_id: str
    record: TrajectoryRecord


@dataclass
class ReaderCounters:
    """What the reader did besides handing out entries; cumulative, for telemetry and tests."""

    reclaimed: int = 0
    duplicates_acked: int = 0
    dead_lettered: int = 0
    trimmed: int = 0
    # Times the consumer group was found missing (Redis lost its data) and re-created.
    groups_recreated: int = 0


def entry_order(entry_id: str) -> tuple[int, int]:
    """Sort key of a Redis stream entry id ("<ms>-<seq>"): the order the stream holds them in."""
    milliseconds, _, sequence = entry_id.partition("-")
    return int(milliseconds), int(sequence or 0)


def _decode(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


class TrajectoryStreamReader:
    """The trainer's view of one run's trajectory stream.

    ``reclaim_idle_ms``: an entry another consumer left pending this long is
    taken over. ``max_deliveries``: an entry delivered more often than this is
    dead-lettered. ``consumed_ids_kept``: how many group ids and trajectory ids
    the consumed-ledger remembers (newest first); it must cover the window in
    which a duplicate can still arrive (a few steps' worth of episodes).
    """

    def __init__(self, client: redis.Redis, *, run_id: int, consumer: str,
                 reclaim_idle_ms: int = 60_000, max_deliveries: int = 5,
                 consumed_ids_kept: int = 200_000):
        if reclaim_idle_ms < 1 or max_deliveries < 1 or consumed_ids_kept < 1:
            raise ValueError("reclaim_idle_ms, max_deliveries and consumed_ids_kept must be positive")
        self._redis = client
        self.stream = trajectory_stream(run_id)
        self._dead_letters = dead_letter_stream(run_id)
        self._consumed_groups = consumed_groups_key(run_id)
        self._consumed_trajectories = consumed_trajectories_key(run_id)
        self._consumer = consumer
        self.reclaim_idle_ms = reclaim_idle_ms
        self.max_deliveries = max_deliveries
        self.consumed_ids_kept = consumed_ids_kept
        self.counters = ReaderCounters()
        # Own pending entries are re-read from this cursor, so a partial group
        # held across reads is not handed out again on every read.
        self._history_cursor: str | None = "0"
        self._reclaim_cursor = "0-0"
        self._last_reclaim = float("-inf")
        self._last_refresh = time.monotonic()
        # Entries handed out and not yet acknowledged.
        self._held: set[str] = set()
        # Where the consumer group is re-created if Redis lost it: after the newest entry trained on.
        self.restart_position = "0"
        self._create_group("0")

    def _create_group(self, position: str) -> None:
        try:
            self._redis.xgroup_create(self.stream, TRAINER_CONSUMER_GROUP, id=position, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _in_group(self, command):
        """``command()``, run again on a re-created consumer group if Redis no longer has it.

        A Redis restarted without its data (no persistence, or a lost append-only
        file) forgets the group: XREADGROUP then fails with NOGROUP on every read.
        The group comes back positioned after the newest entry this trainer trained
        on, so nothing trained is delivered again; the consumed-ledger catches the rest.
        """
        try:
            return command()
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        logger.error("stream %s lost its consumer group (Redis restarted without its data?): re-created "
                     "after entry %s", self.stream, self.restart_position)
        self.counters.groups_recreated += 1
        self._create_group(self.restart_position)
        self._history_cursor = "0"
        self._held.clear()
        return command()

    # -- reading -------------------------------------------------------------

    def read(self, *, block_ms: int, count: int = 256) -> list[StreamEntry]:
        """Entries to train on: own pending ones first, then reclaimed ones, then new ones.

        Unreadable, too-often-delivered and already-consumed entries are dealt
        with here (dead-lettered or acknowledged) and never returned.
        """
        self._refresh_held()
        if self._history_cursor is not None:
            raw = self._xreadgroup(self._history_cursor, block_ms=None, count=count)
            if raw:
                self._history_cursor = raw[-1][0]
                entries = self._accept(self._drop_poison(raw))
                if entries:
                    return entries
            else:
                self._history_cursor = None
        entries = self._reclaim(count)
        if entries:
            return entries
        return self._accept(self._xreadgroup(">", block_ms=block_ms, count=count))

    def _xreadgroup(self, start: str, *, block_ms: int | None, count: int) -> list[tuple[str, dict]]:
        response = self._in_group(lambda: self._redis.xreadgroup(
            TRAINER_CONSUMER_GROUP, self._consumer, {self.stream: start}, count=count, block=block_ms
        ))
        return [(_decode(raw_id), fields) for _, messages in response or [] for raw_id, fields in messages]

    def _reclaim(self, count: int) -> list[StreamEntry]:
        """Take over entries another consumer left pending for ``reclaim_idle_ms``."""
        now = time.monotonic()
        # A scan per quarter of the idle timeout finds an orphan at most 1.25 timeouts late.
        if now - self._last_reclaim < self.reclaim_idle_ms / 4000:
            return []
        self._last_reclaim = now
        response = self._in_group(lambda: self._redis.xautoclaim(
            self.stream, TRAINER_CONSUMER_GROUP, self._consumer, min_idle_time=self.reclaim_idle_ms,
            start_id=self._reclaim_cursor, count=count,
        ))
        next_cursor, messages = _decode(response[0]), response[1]
        self._reclaim_cursor = next_cursor
        if next_cursor != "0-0":
            # The scan stopped at ``count``: continue it on the next read, not a period later.
            self._last_reclaim = float("-inf")
        raw = [(_decode(raw_id), fields) for raw_id, fields in messages]
        if raw:
            logger.warning("reclaimed %d trajectory entries left pending by a dead consumer", len(raw))
            self.counters.reclaimed += len(raw)
        return self._accept(self._drop_poison(raw))

    def _drop_poison(self, raw: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
        """Dead-letter entries delivered more than ``max_deliveries`` times; return the rest."""
        if not raw:
            return raw
        with self._redis.pipeline(transaction=False) as pipe:
            for entry_id, _ in raw:
                pipe.xpending_range(self.stream, TRAINER_CONSUMER_GROUP, min=entry_id, max=entry_id, count=1)
            pending = pipe.execute()
        kept = []
        for (entry_id, fields), info in zip(raw, pending, strict=True):
            deliveries = int(info[0]["times_delivered"]) if info else 0
            if deliveries > self.max_deliveries:
                self._dead_letter(entry_id, fields or {}, f"delivered {deliveries} times "
                                  f"(max_deliveries {self.max_deliveries})")
            else:
                kept.append((entry_id, fields))
        return kept

    def _accept(self, raw: list[tuple[str, dict]]) -> list[StreamEntry]:
        """Parse entries; dead-letter unreadable ones and acknowledge already-consumed ones."""
        entries: list[StreamEntry] = []
        for entry_id, fields in raw:
            if not fields:  # trimmed while pending: nothing left to train on
                self.ack([entry_id])
                continue
            try:
                entries.append(StreamEntry(entry_id, TrajectoryRecord.from_stream_fields(fields)))
            except (ValidationError, SchemaVersionError, KeyError, ValueError) as exc:
                self._dead_letter(entry_id, fields, f"{type(exc).__name__}: {exc}")
        entries = self._without_consumed(entries)
        self._held.update(entry.entry_id for entry in entries)
        return entries

    def _without_consumed(self, entries: list[StreamEntry]) -> list[StreamEntry]:
        if not entries:
            return entries
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.zmscore(self._consumed_groups, [e.record.group_id for e in entries])
            pipe.zmscore(self._consumed_trajectories, [e.record.trajectory_id for e in entries])
            group_scores, trajectory_scores = pipe.execute()
        fresh, duplicates = [], []
        for entry, group_score, trajectory_score in zip(entries, group_scores, trajectory_scores, strict=True):
            (fresh if group_score is None and trajectory_score is None else duplicates).append(entry)
        if duplicates:
            logger.info("acknowledging %d trajectories already trained on or dropped", len(duplicates))
            self.counters.duplicates_acked += len(duplicates)
            self.ack([e.entry_id for e in duplicates])
        return fresh

    def _refresh_held(self) -> None:
        """Reset the idle time of held entries, so XAUTOCLAIM (ours or another's) leaves them alone.

        JUSTID: claiming does not count as a delivery, so waiting for a slow
        group never makes its first episodes look like poison.
        """
        now = time.monotonic()
        if not self._held or now - self._last_refresh < self.reclaim_idle_ms / 4000:
            return
        self._last_refresh = now
        held = sorted(self._held, key=entry_order)
        for start in range(0, len(held), 1000):
            self._in_group(lambda ids=held[start:start + 1000]: self._redis.xclaim(
                self.stream, TRAINER_CONSUMER_GROUP, self._consumer, min_idle_time=0, message_ids=ids, justid=True))

    def _dead_letter(self, entry_id: str, fields: dict, reason: str) -> None:
        logger.error("trajectory %s moved to %s: %s", entry_id, self._dead_letters, reason)
        payload = {k: v for k, v in fields.items()}
        payload.update({"original_id": entry_id, "reason": reason})
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self._dead_letters, payload, maxlen=_DEAD_LETTER_MAXLEN, approximate=True)
            pipe.xack(self.stream, TRAINER_CONSUMER_GROUP, entry_id)
            pipe.execute()
        self._held.discard(entry_id)
        self.counters.dead_lettered += 1

    # -- resuming -----------------------------------------------------------

    def take_over_pending(self) -> int:
        """Claim every entry other consumers hold, at once; returns how many.

        For a trainer that resumes a run whose previous trainer is known dead
        (the platform failed or paused the run): waiting ``reclaim_idle_ms``
        for them would only stall the resumed run. Claimed entries are read
        from this consumer's history like its own.
        """
        claimed, cursor = 0, "0-0"
        while True:
            # Not JUSTID: redis-py then returns no cursor to continue from. The
            # claim counts as one more delivery, which max_deliveries allows for.
            next_cursor, messages, *_ = self._redis.xautoclaim(
                self.stream, TRAINER_CONSUMER_GROUP, self._consumer, min_idle_time=0,
                start_id=cursor, count=1000,
            )
            claimed += len(messages)
            cursor = _decode(next_cursor)
            if cursor == "0-0":
                break
        for consumer in self._redis.xinfo_consumers(self.stream, TRAINER_CONSUMER_GROUP):
            name = _decode(consumer["name"])
            if name != self._consumer and int(consumer["pending"]) == 0:
                self._redis.xgroup_delconsumer(self.stream, TRAINER_CONSUMER_GROUP, name)
        self._history_cursor = "0"
        self.counters.reclaimed += claimed
        return claimed

    def group_ids_in_stream(self) -> set[str]:
        """Group ids of every entry still in the stream (pending or not yet delivered)."""
        group_ids, cursor = set(), "-"
        while True:
            batch = self._redis.xrange(self.stream, min=cursor, count=1000)
            for _, fields in batch:
                try:
                    group_ids.add(TrajectoryRecord.from_stream_fields(fields).group_id)
                except (ValidationError, SchemaVersionError, KeyError, ValueError):
                    continue  # dead-lettered when read
            if len(batch) < 1000:
                return group_ids
            cursor = "(" + _decode(batch[-1][0])

    def consumed_group_ids(self, group_ids: list[str]) -> set[str]:
        """Those of ``group_ids`` in the consumed-ledger (trained on, dropped or given up)."""
        if not group_ids:
            return set()
        scores = self._redis.zmscore(self._consumed_groups, group_ids)
        return {group_id for group_id, score in zip(group_ids, scores, strict=True) if score is not None}

    def record_consumed_groups(self, group_ids: list[str]) -> None:
        """Put groups that will never be trained (lost with a producer) in the consumed-ledger.

        Their late episodes, if any arrive, are then acknowledged as duplicates,
        by this trainer or by one that resumes the run.
        """
        if group_ids:
            now = time.time()
            self._redis.zadd(self._consumed_groups, {group_id: now for group_id in group_ids})

    # -- acknowledging -------------------------------------------------------

    def ack(self, entry_ids: list[str]) -> int:
        """Acknowledge entries without recording them as consumed (duplicates, unreadable ones)."""
        if not entry_ids:
            return 0
        self._held.difference_update(entry_ids)
        return self._redis.xack(self.stream, TRAINER_CONSUMER_GROUP, *entry_ids)

    def ack_consumed(self, groups: Iterable[list[StreamEntry]]) -> int:
        """Acknowledge groups trained on (or dropped) and record them, in one transaction.

        Call it after the update that used them. Once recorded, neither their
        group id nor any of their trajectory ids is handed out again.
        """
        groups = [group for group in groups if group]
        if not groups:
            return 0
        now = time.time()
        entry_ids = [entry.entry_id for group in groups for entry in group]
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self._consumed_groups, {group[0].record.group_id: now for group in groups})
            pipe.zadd(self._consumed_trajectories, {e.record.trajectory_id: now for group in groups for e in group})
            # Keep the newest ids only: duplicates arrive within a few steps, not a run later.
            pipe.zremrangebyrank(self._consumed_groups, 0, -self.consumed_ids_kept - 1)
            pipe.zremrangebyrank(self._consumed_trajectories, 0, -self.consumed_ids_kept - 1)
            pipe.xack(self.stream, TRAINER_CONSUMER_GROUP, *entry_ids)
            acked = pipe.execute()[-1]
        self._held.difference_update(entry_ids)
        return acked

    # -- trimming ------------------------------------------------------------

    def trim_floor(self) -> str | None:
        """The lowest entry id any consumer group still needs; entries below it are safe to delete.

        Per group: its oldest pending entry, or the entry after its
        last-delivered one (entries after that are not delivered yet); the
        lowest over all groups. None when a group has read nothing yet.
        """
        floor: tuple[int, int] | None = None
        for group in self._redis.xinfo_groups(self.stream):
            last = _decode(group["last-delivered-id"])
            if last == "0-0":
                return None
            milliseconds, sequence = entry_order(last)
            group_floor = (milliseconds, sequence + 1)
            summary = self._redis.xpending(self.stream, _decode(group["name"]))
            if summary["pending"]:
                group_floor = min(group_floor, entry_order(_decode(summary["min"])))
            floor = group_floor if floor is None else min(floor, group_floor)
        return None if floor is None else f"{floor[0]}-{floor[1]}"

    def trim(self, *, approximate: bool = False) -> int:
        """Delete acknowledged entries (XTRIM MINID to :meth:`trim_floor`); returns how many.

        ``approximate`` lets Redis delete whole radix-tree nodes only (cheaper;
        it still never deletes at or above the floor).
        """
        floor = self.trim_floor()
        if floor is None:
            return 0
        trimmed = int(self._redis.xtrim(self.stream, minid=floor, approximate=approximate))
        self.counters.trimmed += trimmed
        return trimmed


class GroupAssembler:
    """Holds trajectories until their whole group has arrived; hands out whole groups, oldest first.

    A trajectory id seen before (a retried XADD, a re-read entry) and any
    episode of a group already taken (a redelivered rollout task) goes to
    :attr:`duplicates`, to be acknowledged and never trained. Memory stays
    bounded: the newest ``max_remembered_ids`` ids of each kind are kept;
    the Redis consumed-ledger of the reader covers older ones.
    """

    def __init__(self, *, trained_group_ids: Iterable[str] = (), max_remembered_ids: int = 200_000) -> None:
        self._partial: OrderedDict[str, list[StreamEntry]] = OrderedDict()
        self._max_remembered = max_remembered_ids
        self._trained: OrderedDict[str, None] = OrderedDict()
        self._seen_trajectories: OrderedDict[str, None] = OrderedDict()
        for group_id in trained_group_ids:
            self._remember(self._trained, group_id)
        self.duplicates: list[str] = []

    def _remember(self, ids: OrderedDict[str, None], key: str) -> None:
        ids[key] = None
        if len(ids) > self._max_remembered:
            ids.popitem(last=False)

    def add(self, entry: StreamEntry) -> None:
        record = entry.record
        if record.group_id in self._trained or record.trajectory_id in self._seen_trajectories:
            # A redelivered rollout task produced this group again, or the same
            # episode was appended twice: train on it once.
            self.duplicates.append(entry.entry_id)
            return
        self._remember(self._seen_trajectories, record.trajectory_id)
        self._partial.setdefault(record.group_id, []).append(entry)

    def refuse_groups(self, group_ids: Iterable[str]) -> list[list[StreamEntry]]:
        """Stop waiting for ``group_ids`` (e.g. lost with a dead producer).

        Returns the entries already held for them, to be acknowledged as
        consumed; any episode of theirs that still arrives is a duplicate.
        """
        refused = []
        for group_id in group_ids:
            held = self._partial.pop(group_id, None)
            if held:
                refused.append(held)
            self._remember(self._trained, group_id)
        return refused

    def complete_groups(self) -> int:
        return sum(1 for entries in self._partial.values() if len(entries) >= entries[0].record.group_size)

    def take(self, num_groups: int) -> list[list[StreamEntry]]:
        """Up to ``num_groups`` whole groups, those of the oldest policy first, then in order of arrival.

        The oldest are the nearest to the staleness bound: taken later, they
        might be dropped, while a newer group can wait a step and still train.
        """
        complete = [(group_id, entries) for group_id, entries in self._partial.items()
                    if len(entries) >= entries[0].record.group_size]
        complete.sort(key=lambda item: min(entry.record.policy_version for entry in item[1]))
        taken = []
        for group_id, entries in complete[:num_groups]:
            group_size = entries[0].record.group_size
            del self._partial[group_id]
            self._remember(self._trained, group_id)
            # Extra copies of a group (redelivery) are dropped, not trained twice.
            self.duplicates.extend(entry.entry_id for entry in entries[group_size:])
            taken.append(entries[:group_size])
        return taken

    def take_partial(self, predicate) -> list[list[StreamEntry]]:
        """Remove and return the incomplete groups whose entries satisfy ``predicate(entries)``.

        For groups that can never be trained (e.g. already too stale): the
        caller acknowledges them as consumed, and their late episodes become
        duplicates.
        """
        taken = []
        for group_id, entries in list(self._partial.items()):
            if predicate(entries):
                del self._partial[group_id]
                self._remember(self._trained, group_id)
                taken.append(entries)
        return taken

    def take_duplicates(self) -> list[str]:
        duplicates, self.duplicates = self.duplicates, []
        return duplicates
