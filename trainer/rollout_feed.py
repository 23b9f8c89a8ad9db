"""The rollout feed: whole, fresh-enough episode groups for each RL step, and everything owed for them.

The learner asks :meth:`RolloutFeed.next_step` for a step's groups and tells
the feed what became of them: :meth:`~RolloutFeed.trained` (the update of a
step used them) or :meth:`~RolloutFeed.filtered_out` (the algorithm kept none).
In between, the feed keeps its promises to the rest of the system:

- rollout tasks are requested ahead of the trainer (``trainer/backlog.py``),
  within the staleness bound, and again for every group consumed untrained;
- episodes are read from the stream and assembled into whole groups
  (``trainer/stream.py``); duplicates are acknowledged and never trained;
- a group too stale to train on ``policy_version`` is dropped whole, before the
  loss; a group a dead producer took with it expires as lost, its stragglers
  are refused, and a replacement is requested;
- every decision is appended to the run's lineage stream;
- a fault that keeps every producer from ever serving the run (the filesystem
  weight transport's directory missing on their host) fails the run with the
  producer's reason, instead of a wait for episodes that cannot come;
- data that was trained on is acknowledged only once a checkpoint holding its
  update is committed (:meth:`~RolloutFeed.checkpoint_committed`). A crash
  before that leaves it pending, so the resumed trainer trains it again from
  that checkpoint, and every trajectory reaches the surviving parameters
  exactly once.

It needs Redis and a Celery app to send tasks with, never a model: no JAX is
imported here (tests/trainer/test_rollout_feed.py checks it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import redis
from celery import Celery

from tandem.configs.run import RunConfig
from tandem.contracts import (
    LineageEntry,
    ProducerFault,
    TrajectoryRecord,
    lineage_stream,
    producer_fault_key,
)
from trainer.backlog import RolloutBacklog, group_index_of
from trainer.idle_attribution import IdleAttribution
from trainer.producer_stats import ProducerStats
from trainer.rollout_stats import rollout_metrics
from trainer.staleness import StalenessRecorder, is_stale_group, split_stale_groups
from trainer.step_episodes import StepEpisodes
from trainer.stream import GroupAssembler, StreamEntry, TrajectoryStreamReader, entry_order

logger = logging.getLogger(__name__)

# Entries kept in a run's lineage stream (about one per step).
_LINEAGE_MAXLEN = 100_000


class ProducerFaultError(RuntimeError):
    """Producers reported that they can never serve the run as it is configured."""

    def __init__(self, fault: ProducerFault):
        super().__init__(f"producer {fault.producer}: {fault.reason}")
        self.fault = fault


@dataclass(frozen=True)
class StepGroups:
    """The whole groups one step trains on, oldest first, each within the staleness bound."""

    groups: list[list[StreamEntry]]
    # The version they were checked against: the policy the step's update starts from.
    policy_version: int
    # Unix time they were taken off the stream (their queue wait ends here).
    taken_at: float

    @property
    def records(self) -> list[TrajectoryRecord]:
        return [entry.record for group in self.groups for entry in group]

    @property
    def trajectories(self) -> list[list[TrajectoryRecord]]:
        """The records group by group, as an algorithm prepares them."""
        return [[entry.record for entry in group] for group in self.groups]

    @property
    def group_ids(self) -> list[str]:
        return [group[0].record.group_id for group in self.groups]

    @property
    def newest_entry_id(self) -> str:
        return max((entry.entry_id for group in self.groups for entry in group), key=entry_order)


class RolloutFeed:
    """One run's episodes, from the trajectory stream to the learner; see the module docstring.

    ``rl_steps_left``: the steps the run still trains, which bounds the groups
    requested. ``block_ms``: how long one read of the stream blocks, short
    enough for the caller's ``between_reads`` (its heartbeat) to run often.
    ``clock`` (monotonic seconds) times lost groups, ``wall_clock`` (unix seconds) the trainer's waits
    against the episodes' own times; both injectable for tests.
    """

    def __init__(self, *, redis_client: redis.Redis, celery_app: Celery, run_id: int, config: RunConfig,
                 consumer: str, rl_steps_left: int, block_ms: int = 500, clock=time.monotonic,
                 wall_clock=time.time):
        self._redis = redis_client
        self._run_id = run_id
        self._rollout = config.rollout
        self._consumer = consumer
        self._block_ms = block_ms
        self._reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer=consumer,
                                              reclaim_idle_ms=config.stream.reclaim_idle_ms,
                                              max_deliveries=config.stream.max_deliveries)
        self._assembler = GroupAssembler()
        self._backlog = RolloutBacklog(celery_app=celery_app, redis_client=redis_client, run_id=run_id,
                                       config=config.rollout,
                                       groups_needed=rl_steps_left * config.rollout.groups_per_step, clock=clock,
                                       wall_clock=wall_clock)
        self._wall_clock = wall_clock
        # Sync: a step's episodes are requested only after the previous update is
        # published, so every one of them is generated by the newest policy.
        self._steps_ahead = 0 if config.rollout.pipeline == "sync" else None
        # Groups taken off the stream so far: trained on, dropped or given up on.
        self._groups_consumed = 0
        # Of those, the groups of the step being assembled or trained, whose update is not published yet.
        self._groups_in_update = 0
        # Updates whose groups wait for a committed checkpoint: (step, groups).
        self._awaiting_checkpoint: list[tuple[int, list[list[StreamEntry]]]] = []
        # What the next step event reports, gathered since the last one.
        self._staleness = StalenessRecorder()
        self._episodes = StepEpisodes()
        self._idle = IdleAttribution()
        self._episodes_lost = 0
        self._last_trained: StepGroups | None = None
        # The newest step and policy version the feed was told of, where decisions at the end are recorded.
        self._last_step = 0
        self._last_policy_version = 0
        self._producers = ProducerStats(redis_client, run_id)
        self._producers.step_fields()  # the baseline the first step's utilisation is measured from
        self._appended_before = self._entries_appended()

    # -- a step --------------------------------------------------------------

    def next_step(self, *, after_step: int, policy_version: int,
                  waiting: AbstractContextManager | None = None,
                  between_reads: Callable[[], None] = lambda: None) -> StepGroups:
        """``groups_per_step`` whole groups to train ``policy_version`` on; blocks until they are there.

        ``after_step``: the last step trained (what is dropped meanwhile is
        recorded at it). ``waiting`` is entered for as long as it waits on the
        stream (the step's ``data_wait`` stage); ``between_reads`` runs after
        every read (the trainer's heartbeat: it may raise to stop the run).
        """
        rollout = self._rollout
        wanted = rollout.groups_per_step
        self._last_step, self._last_policy_version = after_step, policy_version
        # The previous step's update is published: policy_version is the newest policy.
        self._groups_in_update = 0
        self._top_up()
        groups: list[list[StreamEntry]] = []
        requested_at: dict[str, float] = {}
        waited_from = self._wall_clock()
        with waiting or nullcontext():
            while len(groups) < wanted:
                while self._assembler.complete_groups() < wanted - len(groups):
                    self._read(after_step=after_step, policy_version=policy_version)
                    between_reads()
                fresh, stale = split_stale_groups(self._assembler.take(wanted - len(groups)),
                                                  policy_version=policy_version,
                                                  max_staleness=rollout.max_staleness)
                self._drop_stale(stale, after_step=after_step, policy_version=policy_version)
                for group in fresh:
                    group_id = group[0].record.group_id
                    if (requested := self._backlog.requested_at(group_id)) is not None:
                        requested_at[group_id] = requested
                self._backlog.settle(group[0].record.group_id for group in fresh)
                groups += fresh
                self._groups_consumed += len(fresh)
                self._groups_in_update += len(fresh)
        self._idle.waited(waited_from=waited_from, waited_until=self._wall_clock(),
                          records=[entry.record for group in groups for entry in group], requested_at=requested_at)
        taken = StepGroups(groups=groups, policy_version=policy_version, taken_at=time.time())
        if rollout.pipeline == "async":
            # Groups dropped as stale in the last take are replaced while this step trains; the
            # next step's own are asked for once its update is published (next_step's first top-up).
            self._top_up()
        return taken

    def trained(self, taken: StepGroups, *, kept: Sequence[TrajectoryRecord], step: int,
                policy_version: int) -> None:
        """The update of ``step`` used ``taken`` and published ``policy_version``.

        ``kept``: the records the algorithm kept for the update (the rest were
        failed or filtered out with their group). Their groups are acknowledged
        once a checkpoint of ``step`` or later is committed.
        """
        records = taken.records
        self._last_step, self._last_policy_version = step, policy_version
        self._reader.restart_position = taken.newest_entry_id
        self._episodes.consumed(records, trained=kept)
        self._staleness.trained(records, policy_version=taken.policy_version, consumed_at=taken.taken_at)
        self._last_trained = taken
        self._log("trained", step=step, policy_version=policy_version,
                  trajectory_ids=[record.trajectory_id for record in records], group_ids=taken.group_ids)
        self._awaiting_checkpoint.append((step, taken.groups))

    def filtered_out(self, taken: StepGroups, *, after_step: int, policy_version: int) -> None:
        """The algorithm kept none of ``taken`` (dynamic sampling: no reward variance in any group).

        They are consumed untrained, at once, and as many groups again are allowed for.
        """
        records = taken.records
        self._episodes.consumed(records, trained=())
        self._backlog.extend(groups=len(taken.groups))
        self._reader.ack_consumed(taken.groups)
        self._log("dropped", step=after_step, policy_version=policy_version,
                  trajectory_ids=[record.trajectory_id for record in records], group_ids=taken.group_ids)

    def checkpoint_committed(self, step: int) -> None:
        """A checkpoint of ``step`` is committed: acknowledge the groups of the updates it holds."""
        ready = [groups for trained_step, groups in self._awaiting_checkpoint if trained_step <= step]
        if not ready:
            return
        self._awaiting_checkpoint = [(trained_step, groups) for trained_step, groups in self._awaiting_checkpoint
                                     if trained_step > step]
        self._reader.ack_consumed([group for groups in ready for group in groups])
        self._reader.trim(approximate=True)

    def step_fields(self, *, wall_s: float) -> dict:
        """The feed's part of the step event (``TrainerStepEvent`` keyword arguments) since the last call.

        ``wall_s``: the step's wall time. Staleness and rollout latencies are of
        the step last :meth:`trained`; drops, losses and episodes of everything
        consumed since the last call.
        """
        records = self._last_trained.records if self._last_trained is not None else []
        version = self._last_trained.policy_version if self._last_trained is not None else 0
        # Staleness: how many versions behind the policy being updated the data is.
        staleness = np.array([version - record.policy_version for record in records], dtype=np.float32)
        appended = self._entries_appended()
        fields = {
            "samples_produced_per_s": (appended - self._appended_before) / wall_s if wall_s > 0 else None,
            "rollout_metrics": rollout_metrics(records),
            "staleness_mean": float(staleness.mean()) if records else None,
            "staleness_max": float(staleness.max()) if records else None,
            "episodes_lost": self._episodes_lost,
            **self._staleness.step_fields(),
            **self._producers.step_fields(),
            "episodes": self._episodes.take(),
            "idle_seconds": self._idle.take(),
        }
        self._appended_before = appended
        self._episodes_lost = 0
        self._last_trained = None
        return fields

    # -- a run's start and end ----------------------------------------------

    def resume(self, *, step: int, policy_version: int) -> None:
        """Take over what the previous trainer of this run left; before the first :meth:`next_step`.

        Its pending entries are claimed at once. Of the groups the run ever
        requested, those neither consumed nor in the stream went with the
        producers the run stopped: they are counted lost and recorded (at
        ``step`` and ``policy_version``, where the resumed run starts), so late
        copies are never trained. Those in the stream (pending, undelivered,
        or trained after the last checkpoint and so never acknowledged) are
        adopted and waited for like new ones.
        """
        reader = self._reader
        claimed = reader.take_over_pending()
        requested = self._backlog.groups_requested
        # Older groups are beyond the ledger's memory and long settled.
        first = max(0, requested - reader.consumed_ids_kept // 2)
        candidates = [f"{self._run_id}-{index}" for index in range(first, requested)]
        consumed = reader.consumed_group_ids(candidates)
        in_stream = reader.group_ids_in_stream()
        open_groups = [group_id for group_id in candidates if group_id not in consumed]
        adopted = [group_index_of(group_id) for group_id in open_groups if group_id in in_stream]
        lost = [group_id for group_id in open_groups if group_id not in in_stream]
        reader.record_consumed_groups(lost)
        if lost:
            self._log("lost", step=step, policy_version=policy_version, group_ids=lost)
        logger.info("run %s resumed: %d pending entries claimed, %d groups adopted, %d groups lost",
                    self._run_id, claimed, len(adopted), len(lost))
        self._groups_consumed = requested - len(adopted)
        self._backlog.adopt(adopted, groups_consumed=self._groups_consumed)
        self._episodes_lost += len(lost) * self._rollout.group_size

    def finish(self) -> None:
        """The run is over: episodes read but not trained never will be.

        Consuming them leaves nothing pending, so the stream is trimmed to
        empty. Call it once the last checkpoint is committed and acknowledged.
        """
        leftovers = self._assembler.take_partial(lambda entries: True)
        if leftovers:
            self._reader.ack_consumed(leftovers)
            logger.info("run %s: %d surplus episode groups left untrained", self._run_id, len(leftovers))
            # Recorded like every other consumed trajectory, so the stream reconciles by id.
            self._log("dropped", step=self._last_step, policy_version=self._last_policy_version,
                      trajectory_ids=[entry.record.trajectory_id for group in leftovers for entry in group],
                      group_ids=[group[0].record.group_id for group in leftovers])
        self._reader.ack(self._assembler.take_duplicates())
        self._reader.trim(approximate=False)

    # -- the parts of a step -------------------------------------------------

    def _read(self, *, after_step: int, policy_version: int) -> None:
        """One read of the stream into the groups, and what can never be trained put out of the way.

        Raises ProducerFaultError if a producer found that no episode of the run can ever be made.
        """
        fault = self._redis.get(producer_fault_key(self._run_id))
        if fault is not None:
            raise ProducerFaultError(ProducerFault.model_validate_json(fault))
        for entry in self._reader.read(block_ms=self._block_ms):
            self._assembler.add(entry)
        self._reader.ack(self._assembler.take_duplicates())
        max_staleness = self._rollout.max_staleness
        self._drop_stale(
            self._assembler.take_partial(lambda entries: is_stale_group(
                entries, policy_version=policy_version, max_staleness=max_staleness)),
            after_step=after_step, policy_version=policy_version,
        )
        self._give_up_on_lost_groups(after_step=after_step, policy_version=policy_version)
        self._top_up()

    def _top_up(self) -> None:
        """Request what the backlog and the staleness bound allow now.

        Both count from the groups consumed before the step in progress: a group
        requested now is generated by the newest published policy (producers
        load it before a task's first episode) and must be trained within
        ``max_staleness`` versions of it, so by the step in progress or the
        ``max_staleness`` after it, and the groups of the step in progress are
        among those. Counting them as consumed would let producers start a step
        of groups that could only arrive one version too stale, to be dropped.
        """
        self._backlog.top_up(groups_consumed=self._groups_consumed - self._groups_in_update,
                             steps_ahead=self._steps_ahead)

    def _drop_stale(self, groups: list[list[StreamEntry]], *, after_step: int, policy_version: int) -> None:
        """Consume groups without training on them (too stale to ever be trained), and ask for others."""
        if not groups:
            return
        self._reader.ack_consumed(groups)
        self._staleness.dropped(groups)
        self._episodes.dropped((entry.record for group in groups for entry in group), outcome="dropped_stale")
        group_ids = [group[0].record.group_id for group in groups]
        self._log("dropped", step=after_step, policy_version=policy_version,
                  trajectory_ids=[entry.record.trajectory_id for group in groups for entry in group],
                  group_ids=group_ids)
        self._backlog.extend(groups=len(groups))
        self._backlog.settle(group_ids)
        self._groups_consumed += len(groups)

    def _give_up_on_lost_groups(self, *, after_step: int, policy_version: int) -> None:
        """Groups a dead producer took with it: count them, refuse stragglers, ask again."""
        lost = self._backlog.expire(timeout_s=self._rollout.timeout_s)
        if not lost:
            return
        logger.warning("run %s: %d episode groups lost (requested, never delivered)", self._run_id, len(lost))
        held = self._assembler.refuse_groups(lost)
        if held:
            self._reader.ack_consumed(held)
            self._episodes.dropped((entry.record for group in held for entry in group),
                                   outcome="dropped_incomplete")
        self._reader.record_consumed_groups(lost)
        self._log("lost", step=after_step, policy_version=policy_version, group_ids=lost)
        self._groups_consumed += len(lost)
        self._episodes_lost += len(lost) * self._rollout.group_size

    def _log(self, kind: str, *, step: int, policy_version: int, trajectory_ids: Iterable[str] = (),
             group_ids: Iterable[str] = ()) -> None:
        """Append to the run's lineage stream what became of some trajectories (see LineageEntry)."""
        entry = LineageEntry(kind=kind, step=step, policy_version=policy_version, worker=self._consumer,
                             trajectory_ids=list(trajectory_ids), group_ids=list(group_ids))
        self._redis.xadd(lineage_stream(self._run_id), entry.to_stream_fields(),
                         maxlen=_LINEAGE_MAXLEN, approximate=True)

    def _entries_appended(self) -> int:
        """Entries producers ever appended to the stream (trimming does not lower it)."""
        return int(self._redis.xinfo_stream(self._reader.stream)["entries-added"])
