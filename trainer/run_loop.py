"""Training one claimed run: SFT warm-up, then GRPO on streamed trajectories.

The loop is single-threaded on purpose: generation happens in producers, so
the only thing this thread ever waits for is data that is not there yet, and
that wait is measured and reported as the trainer's idle time.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import redis
from celery import Celery
from flax import nnx

from environments import load_environment_class
from policy.byte_layout import Conversation
from policy.hf import create_model
from policy.lora import apply_lora
from policy.tokenizer import load_tokenizer
from policy.weights import FilesystemWeightPublisher, RedisWeightPublisher, RedisWeightSubscriber
from tandem.contracts import (
    CheckpointReport,
    LineageEntry,
    RunSpec,
    StepTimeline,
    TraceRequest,
    TrainerHeartbeat,
    TrainerStepEvent,
    lineage_stream,
    run_group_counter_key,
    run_keys,
    run_spec_key,
    run_stop_key,
)
from tandem.optimizer_config import OptimizerConfig
from tandem.run_config import RunConfig
from trainer.algorithms import ReferencePolicy, build_algorithm
from trainer.backlog import RolloutBacklog, group_index_of
from trainer.checkpoints import RunCheckpointer, RunProgress, step_rng
from trainer.devices import DeviceMonitor, parameter_count
from trainer.losses import sft_loss
from trainer.platform_client import ClaimedRun, PlatformClient, RunTakenOverError
from trainer.producer_stats import ProducerStats
from trainer.profiling import StageRecorder, timeline_wall_s
from trainer.rollout_stats import rollout_metrics
from trainer.sharding import make_mesh, shard_batch, shard_train_state, step_shardings
from trainer.staleness import StalenessRecorder, is_stale_group, split_stale_groups
from trainer.step_episodes import StepEpisodes
from trainer.stream import GroupAssembler, TrajectoryStreamReader, entry_order
from trainer.tracing import CapturedTrace, TraceCapture
from trainer.train_step import (
    batch_tokens,
    create_train_state,
    make_train_step,
    on_logits,
    pad_batch,
    train_updates,
)
from trainer.trajectory_samples import TrajectorySampleBuffer
from trainer.value_head import policy_params, with_value_head

logger = logging.getLogger(__name__)


class RunCancelledError(Exception):
    pass


class RunReleasedError(Exception):
    """The platform no longer wants this trainer to train the run (paused, or failed meanwhile)."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


# Entries kept in a run's lineage stream (about one per step).
_LINEAGE_MAXLEN = 100_000


@dataclass(frozen=True)
class TrainerSettings:
    """How the trainer process reaches everything; one per process."""

    redis_url: str
    checkpoint_root: Path
    consumer_name: str
    # Blocking read timeout: short enough to notice cancellation promptly.
    stream_block_ms: int = 500
    # Telemetry is batched so a fast SFT phase does not make one request per step.
    telemetry_interval_s: float = 0.5
    heartbeat_interval_s: float = 2.0
    # Device and host samples (allocator stats, NVML, psutil) ride on the step telemetry this often.
    device_report_interval_s: float = 10.0


def length_buckets(max_seq_len: int) -> tuple[int, ...]:
    """Padded lengths of train batches: fine where short agent turns live, geometric beyond.

    Every bucket is one compilation of the train step, so they are few; but a
    70-token conversation padded to 128 would nearly double the step, so below
    128 they are 16 apart, and above it each is about 1.25x the last.
    """
    buckets, length = [], 32
    while length < max_seq_len:
        buckets.append(length)
        length = length + 16 if length < 128 else (int(length * 1.25) + 31) // 32 * 32
    return (*buckets, max_seq_len)


# A platform that fails a checkpoint report is asked again no sooner than this.
CHECKPOINT_REPORT_RETRY_S = 10.0


def make_optimizer(learning_rate: float, optimizer: OptimizerConfig | None = None) -> optax.GradientTransformation:
    """Gradient clipping, then Adam or AdamW, as ``optimizer`` (default: OptimizerConfig()) says."""
    optimizer = optimizer or OptimizerConfig()

    def build(learning_rate):
        if optimizer.name == "adamw":
            update = optax.adamw(learning_rate, b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps,
                                 weight_decay=optimizer.weight_decay)
        else:
            update = optax.adam(learning_rate, b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps)
        return optax.chain(optax.clip_by_global_norm(optimizer.max_grad_norm), update)

    # The learning rate is a hyperparameter in the optimizer state, so the schedule
    # and the switch to the RL phase change it without a second optimizer or a recompile.
    return optax.inject_hyperparams(build)(learning_rate=learning_rate)


def initial_train_state(config: RunConfig, *, vocab_size: int, needs_value_head: bool,
                        optimizer: optax.GradientTransformation):
    """``(graphdef, train_state)`` a run starts from; also the structure its checkpoints restore into."""
    model = create_model(config.model, vocab_size=vocab_size, rngs=nnx.Rngs(config.seed))
    if config.lora.enabled:
        apply_lora(model, config.lora, rngs=nnx.Rngs(config.seed + 1))
    if needs_value_head:
        model = with_value_head(model, d_model=model.config.d_model, rngs=nnx.Rngs(config.seed + 2))
    return create_train_state(model, optimizer)


@dataclass
class _Telemetry:
    platform: PlatformClient
    run_id: int
    interval_s: float
    # Receives the pending trace requests the platform returns with each post.
    on_trace_requests: Callable[[list[TraceRequest]], None] = lambda requests: None
    pending: list[TrainerStepEvent] = field(default_factory=list)
    last_flush: float = 0.0
    # Sampled trajectories go out with the events (the trajectory browser's data).
    trajectories: TrajectorySampleBuffer | None = None

    def emit(self, event: TrainerStepEvent) -> None:
        self.pending.append(event)
        if time.monotonic() - self.last_flush >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        events, self.pending = self.pending, []
        if events:
            self.on_trace_requests(self.platform.post_events(self.run_id, events).trace_requests)
        if self.trajectories is not None:
            self.trajectories.flush()
        self.last_flush = time.monotonic()


class RunTrainer:
    def __init__(self, claimed: ClaimedRun, *, settings: TrainerSettings, platform: PlatformClient,
                 redis_client: redis.Redis, celery_app: Celery):
        self.claimed = claimed
        self.run_id = claimed.run_id
        self.config = RunConfig.model_validate(claimed.config)
        self.settings = settings
        self.platform = platform
        self.redis = redis_client
        self.celery_app = celery_app
        self.tokenizer = load_tokenizer(self.config.model.tokenizer)
        self.environment_class = load_environment_class(claimed.environment)
        self.traces = TraceCapture(self._upload_trace)
        self.telemetry = _Telemetry(platform, self.run_id, settings.telemetry_interval_s,
                                    on_trace_requests=self.traces.request,
                                    trajectories=TrajectorySampleBuffer(
                                        platform, self.run_id, self.tokenizer,
                                        per_step=self.config.trajectory_samples_per_step,
                                        tools=claimed.environment.tools))
        # Every second of the training loop goes to one stage of one step (see trainer/profiling.py).
        self.stages = StageRecorder()
        if self.config.weight_transport == "filesystem":
            weight_root = Path(self.config.weight_dir or settings.checkpoint_root / "weights")
            self.publisher = FilesystemWeightPublisher(redis_client, weight_root)
        else:
            self.publisher = RedisWeightPublisher(redis_client, lora=self.config.lora)
        self.policy_version = -1
        self.step = 0
        self._last_heartbeat = 0.0
        self._buckets = length_buckets(self.config.model.max_seq_len)

        self.algorithm = build_algorithm(
            self.config.algorithm,
            temperature=self.config.temperature,
            max_policy_tokens=self.config.max_new_tokens * self.config.max_turns,
        )
        self.optimizer = make_optimizer(self.config.learning_rate, self.config.optimizer)
        self.graphdef, state = initial_train_state(self.config, vocab_size=self.tokenizer.vocab_size,
                                                   needs_value_head=self.algorithm.needs_value_head,
                                                   optimizer=self.optimizer)
        self.shardings = step_shardings(make_mesh(self.config.mesh), state)
        self.state = shard_train_state(state, self.shardings)
        self.devices = DeviceMonitor(parameters=parameter_count(self.state.params),
                                     interval_s=settings.device_report_interval_s)
        self._sft_step = make_train_step(self.graphdef, self.optimizer, on_logits(sft_loss),
                                         shardings=self.shardings)
        self._rl_step = make_train_step(self.graphdef, self.optimizer, self.algorithm.loss_fn,
                                        shardings=self.shardings)
        self._last_acked_entry_id: str | None = None
        self._trained_group_count = 0
        self._rl_steps_done = 0
        # RL updates whose data is acknowledged once a checkpoint holding them is
        # committed: (step, groups). A crash before that leaves the data pending,
        # so the resumed trainer trains it again from that checkpoint, and every
        # trajectory reaches the surviving parameters exactly once.
        self._awaiting_checkpoint: list[tuple[int, list]] = []
        self._reader: TrajectoryStreamReader | None = None
        self._taken_over = False
        self.reference: ReferencePolicy | None = None
        checkpoint_dir = settings.checkpoint_root / f"run-{self.run_id}"
        if not claimed.is_resume and checkpoint_dir.exists() and any(checkpoint_dir.iterdir()):
            # A freshly claimed run has never trained here: these belong to a run
            # of an earlier database that had the same id. Keep them, out of the way.
            checkpoint_dir.rename(checkpoint_dir.with_name(f"{checkpoint_dir.name}.stale-{int(time.time())}"))
        self.checkpointer = RunCheckpointer(checkpoint_dir, max_to_keep=self.config.checkpoints_kept)
        # The committed step last reported to the platform, and when a failed report may be retried.
        self._reported_checkpoint_step: int | None = None
        self._checkpoint_report_retry_at = 0.0

    # -- lifecycle ---------------------------------------------------------

    def run(self) -> str:
        """Train the run to its end (or until the platform releases it); returns the status."""
        spec = RunSpec(run_id=self.run_id, config=self.config.model_dump(mode="json"),
                       environment=self.claimed.environment)
        if self.claimed.is_resume:
            self._resume_from_checkpoint()
            # The stream, the consumed-ledger and the group counter carry over.
            self.redis.delete(run_stop_key(self.run_id))
        else:
            # A claimed run starts from nothing. Keys left under the same id by an
            # earlier platform database (ids restart when it is recreated) must not
            # feed this run stale trajectories or weights.
            self.redis.delete(*run_keys(self.run_id))
        self.redis.set(run_spec_key(self.run_id), spec.model_dump_json())
        try:
            self._heartbeat(force=True)
            self._sft_phase()
            if self.algorithm.needs_reference and self.reference is None:
                # The reference policy of the KL penalty is the policy RL starts from.
                self.reference = ReferencePolicy(self.graphdef, jax.tree.map(jnp.copy, self.state.params))
            self._publish()
            if self.config.algorithm.name != "sft":
                self._rl_phase()
            self._checkpoint()
            self.telemetry.flush()
            self._report("finished")
            return "finished"
        except RunCancelledError:
            self.telemetry.flush()
            return "cancelled"
        except RunReleasedError as released:
            # Paused: keep everything a resume needs. Failed meanwhile (the reaper
            # presumed this trainer dead): the same, so the user can resume it.
            self._checkpoint()
            self.telemetry.flush()
            logger.info("run %s %s: checkpointed at step %d and released", self.run_id,
                        released.status, self.step)
            return released.status
        except RunTakenOverError:
            # Another trainer resumed the run: touch nothing of it any more.
            self._taken_over = True
            raise
        finally:
            # A trace still running (the run ended within it) stops: the profiler is one per process.
            self.traces.close(self.step)
            if not self._taken_over:
                # Producers stop starting episodes for a run this trainer lets go of.
                self.redis.set(run_stop_key(self.run_id), "1")
                self.checkpointer.wait_until_finished()
                self._ack_checkpointed()
            self.checkpointer.close()

    def _resume_from_checkpoint(self) -> None:
        """Continue from the newest committed checkpoint, with policy versions that only go up."""
        published = RedisWeightSubscriber(self.redis).latest_version(self.run_id)
        restored = self.checkpointer.restore_latest(self.state)
        if restored is None:
            logger.warning("run %s resumes with no checkpoint: training starts over", self.run_id)
        else:
            self.state, progress = restored
            self.state = shard_train_state(self.state, self.shardings)
            self.step = progress.step
            self._rl_steps_done = progress.rl_steps
            self._trained_group_count = progress.trained_group_count
            self._last_acked_entry_id = progress.last_acked_entry_id
            self.policy_version = progress.policy_version
            if progress.has_reference:
                reference = self.checkpointer.restore_reference(progress.step, abstract_params=self.state.params)
                self.reference = ReferencePolicy(self.graphdef, reference)
            logger.info("run %s resumes from its checkpoint of step %d (%d RL steps)", self.run_id,
                        self.step, self._rl_steps_done)
        # Versions published after the checkpoint stay behind us: the next one is newer still.
        self.policy_version = max(self.policy_version, published if published is not None else -1)

    def _report(self, status: str, message: str = "") -> str:
        return self.platform.heartbeat(
            self.run_id,
            TrainerHeartbeat(status=status, policy_version=max(self.policy_version, 0),
                             trainer_step=self.step, message=message, worker=self.settings.consumer_name),
        )

    def _heartbeat(self, *, force: bool = False) -> None:
        self._ack_checkpointed()
        if not force and time.monotonic() - self._last_heartbeat < self.settings.heartbeat_interval_s:
            return
        self._last_heartbeat = time.monotonic()
        status = self._report("running")
        if status == "cancelled":
            raise RunCancelledError()
        if status in {"paused", "failed"}:
            raise RunReleasedError(status)

    # -- SFT ---------------------------------------------------------------

    def _demonstration_batch(self, rng: random.Random):
        environment = self.environment_class(**self.claimed.environment.params)
        tool_names = [tool.name for tool in environment.tools]
        sequences, masks = [], []
        for demo in environment.demonstrations(self.config.sft_batch_size, rng):
            conversation = Conversation.start(self.tokenizer, tool_names=tool_names, prompt=demo.prompt)
            for turn in demo.turns:
                if turn.role == "policy":
                    conversation.add_policy_text(turn.text)
                else:
                    conversation.add_environment(turn.text)
            sequences.append(conversation.token_ids[: self.config.model.max_seq_len])
            masks.append(conversation.loss_mask[: self.config.model.max_seq_len])
        if not sequences:
            return None
        return pad_batch(sequences, loss_masks=masks, behaviour_logprobs=None, advantages=None,
                         batch_size=self.config.sft_batch_size, length_buckets=self._buckets,
                         pad_id=self.tokenizer.pad_id)

    def _sft_phase(self) -> None:
        if self._rl_steps_done:
            return  # resumed after SFT
        stage = self.stages.stage
        self.stages.start()
        while self.step < self.config.sft_steps:
            with stage("telemetry"):
                self.traces.before_step(self.step + 1)
            with stage("batch"):
                # Batches keyed by step, so a run resumed from a checkpoint sees the same data.
                batch = self._demonstration_batch(step_rng(self.config.seed, self.step))
            if batch is None:
                logger.info("environment %s has no demonstrations; skipping SFT", self.claimed.environment.name)
                break
            self._set_learning_rate(self.config.schedule.learning_rate_at(
                base=self.config.learning_rate, step=self.step, total_steps=self.config.sft_steps))
            loss = self._train_on(self._sft_step, batch)["loss"]
            self.step += 1
            with stage("checkpoint"):
                if self.step % self.config.checkpoint_every == 0:
                    self._checkpoint()
            timeline = self.stages.finish()
            with stage("telemetry"):  # counted in the next step: this one's timeline is closed
                self.telemetry.emit(TrainerStepEvent(
                    run_id=self.run_id, step=self.step, phase="sft", policy_version=max(self.policy_version, 0),
                    loss=loss, emitted_at=time.time(), **self._profile_fields(timeline, batch),
                ))
                self.traces.after_step(self.step)
                self._heartbeat()

    def _set_learning_rate(self, rate: float) -> None:
        """Put ``rate`` in the optimizer state (a hyperparameter: no recompile), if it changed."""
        current = self.state.opt_state.hyperparams["learning_rate"]
        if np.isclose(float(current), rate, rtol=1e-6, atol=0.0):
            return
        # Placed like the array it replaces, so the jitted step sees the same input sharding.
        self.state.opt_state.hyperparams["learning_rate"] = jax.device_put(
            jnp.asarray(rate, dtype=current.dtype), current.sharding)

    # -- profiling ---------------------------------------------------------

    def _train_on(self, train_step, batch, *, updates: int = 1) -> dict[str, float]:
        """``updates`` updates on ``batch``, its transfer and its compute timed apart; their mean scalar metrics.

        Both end in ``block_until_ready``: the transfer so that it is not billed
        to compute, the compute on the new state too, not only on the loss, so
        that the optimizer update (fused into the same program) is not billed
        to whatever runs next. The batch crosses to the device once for all updates.
        """
        stage = self.stages.stage
        with stage("host_to_device"):
            sharded = jax.block_until_ready(shard_batch(batch, self.shardings))
        with stage("compute"):
            self.state, per_update = train_updates(train_step, self.state, sharded, updates=updates)
            jax.block_until_ready(self.state)
            return {name: float(np.mean([metrics[name] for metrics in per_update])) for name in per_update[0]}

    def _profile_fields(self, timeline: StepTimeline, batch, *, updates: int = 1) -> dict:
        """A step event's stage fields and tokens/s, from its timeline, and a device report when one is due.

        ``updates``: optimizer updates run on ``batch``; each costs the model FLOPs of its tokens, but
        tokens/s counts the batch's tokens once, as samples/s counts its samples.
        """
        seconds = timeline.seconds_by_stage()
        wall_s = timeline_wall_s(timeline)
        wait_s, compute_s, publish_s = (seconds.get(name, 0.0) for name in ("data_wait", "compute", "publish"))
        tokens = batch_tokens(batch)
        self.devices.observe(timeline, tokens=tokens * updates)
        return {
            "wall_s": wall_s, "wait_s": wait_s, "compute_s": compute_s, "publish_s": publish_s,
            "other_s": max(wall_s - wait_s - compute_s - publish_s, 0.0), "timeline": timeline,
            "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
            "device": self.devices.sample() if self.devices.due() else None,
        }

    def _upload_trace(self, captured: CapturedTrace) -> None:
        self.platform.upload_trace(self.run_id, captured.request.id, first_step=captured.first_step,
                                   last_step=captured.last_step, archive=captured.archive, error=captured.error)
        logger.info("run %s: trace %s of steps %d-%d uploaded", self.run_id, captured.request.id,
                    captured.first_step, captured.last_step)

    # -- RL ----------------------------------------------------------------

    def _publish(self) -> float:
        started = time.perf_counter()
        self.policy_version += 1
        # Producers only ever sample: a PPO critic stays on the trainer.
        params = policy_params(self.state.params) if self.algorithm.needs_value_head else self.state.params
        self.publisher.publish(run_id=self.run_id, version=self.policy_version, params=params)
        return time.perf_counter() - started

    def _checkpoint(self) -> None:
        if self.checkpointer.latest_step() == self.step:
            return  # the last periodic save already holds this step
        self.checkpointer.save(
            self.step,
            train_state=self.state,
            progress=RunProgress(
                step=self.step, policy_version=self.policy_version, run_id=self.run_id,
                last_acked_entry_id=self._last_acked_entry_id, trained_group_count=self._trained_group_count,
                rl_steps=self._rl_steps_done,
            ),
            reference_params=self.reference.params if self.reference is not None else None,
        )

    def _report_checkpoints(self, committed: int | None) -> None:
        """Tell the platform which checkpoints are on disk once a new one (``committed``) is committed.

        A failed post is logged and retried some seconds later: it never stops training.
        """
        if (committed is None or committed == self._reported_checkpoint_step
                or time.monotonic() < self._checkpoint_report_retry_at):
            return
        try:
            report = CheckpointReport(checkpoints=self.checkpointer.committed_checkpoints())
            self.platform.report_checkpoints(self.run_id, report)
        except Exception:
            logger.exception("run %s: reporting checkpoints failed; retrying in %ss", self.run_id,
                             CHECKPOINT_REPORT_RETRY_S)
            self._checkpoint_report_retry_at = time.monotonic() + CHECKPOINT_REPORT_RETRY_S
            return
        self._reported_checkpoint_step = committed

    def _ack_checkpointed(self) -> None:
        """Acknowledge the data of RL updates that a committed checkpoint now holds."""
        # Asked once: the same answer serves the report and the acknowledgements.
        committed = self.checkpointer.committed_step()
        self._report_checkpoints(committed)
        if not self._awaiting_checkpoint or self._reader is None or committed is None:
            return
        ready = [groups for step, groups in self._awaiting_checkpoint if step <= committed]
        if not ready:
            return
        self._awaiting_checkpoint = [(step, groups) for step, groups in self._awaiting_checkpoint
                                     if step > committed]
        self._reader.ack_consumed([group for groups in ready for group in groups])
        self._reader.trim(approximate=True)

    def _log(self, kind: str, *, trajectory_ids=(), group_ids=()) -> None:
        """Append to the run's lineage stream what became of some trajectories (see LineageEntry)."""
        entry = LineageEntry(kind=kind, step=self.step, policy_version=self.policy_version,
                             worker=self.settings.consumer_name, trajectory_ids=list(trajectory_ids),
                             group_ids=list(group_ids))
        self.redis.xadd(lineage_stream(self.run_id), entry.to_stream_fields(),
                        maxlen=_LINEAGE_MAXLEN, approximate=True)

    def _adopt_stream(self, reader: TrajectoryStreamReader) -> tuple[int, list[int], list[str]]:
        """Take over what the previous trainer of this run left: ``(groups consumed, groups adopted, lost)``.

        Its pending entries are claimed at once. Of the groups the run ever
        requested, those neither consumed nor in the stream went with the
        producers the run stopped: they are counted lost and recorded, so late
        copies are never trained. Those in the stream (pending, undelivered,
        or trained after the last checkpoint and so never acknowledged) are
        adopted and waited for like new ones.
        """
        claimed = reader.take_over_pending()
        requested = int(self.redis.get(run_group_counter_key(self.run_id)) or 0)
        # Older groups are beyond the ledger's memory and long settled.
        first = max(0, requested - reader.consumed_ids_kept // 2)
        candidates = [f"{self.run_id}-{index}" for index in range(first, requested)]
        consumed = reader.consumed_group_ids(candidates)
        in_stream = reader.group_ids_in_stream()
        open_groups = [group_id for group_id in candidates if group_id not in consumed]
        adopted = [group_index_of(group_id) for group_id in open_groups if group_id in in_stream]
        lost = [group_id for group_id in open_groups if group_id not in in_stream]
        reader.record_consumed_groups(lost)
        if lost:
            self._log("lost", group_ids=lost)
        logger.info("run %s resumed: %d pending entries claimed, %d groups adopted, %d groups lost",
                    self.run_id, claimed, len(adopted), len(lost))
        return requested - len(adopted), adopted, lost

    def _entries_appended(self, stream: str) -> int:
        """Entries producers ever appended to ``stream`` (trimming does not lower it)."""
        return int(self.redis.xinfo_stream(stream)["entries-added"])

    def _rl_phase(self) -> None:
        config = self.config
        reader = TrajectoryStreamReader(
            self.redis, run_id=self.run_id, consumer=self.settings.consumer_name,
            reclaim_idle_ms=config.reclaim_idle_ms, max_deliveries=config.max_deliveries,
        )
        self._reader = reader
        assembler = GroupAssembler()
        episodes_lost = 0
        groups_consumed, adopted = 0, []
        if self.claimed.is_resume:
            groups_consumed, adopted, lost = self._adopt_stream(reader)
            episodes_lost += len(lost) * config.group_size
        rl_steps_left = config.rl_steps - self._rl_steps_done
        backlog = RolloutBacklog(celery_app=self.celery_app, redis_client=self.redis, run_id=self.run_id,
                                 config=config, groups_needed=rl_steps_left * config.groups_per_step,
                                 max_staleness=config.max_staleness, groups_already_consumed=groups_consumed)
        backlog.adopt(adopted)
        recorder = StalenessRecorder()
        episodes = StepEpisodes()  # every episode consumed since the last step event, for the timeline
        producer_stats = ProducerStats(self.redis, self.run_id)
        producer_stats.step_fields()  # the baseline the first step's utilisation is measured from
        # Sync: a step's episodes are requested only after the previous update is
        # published, so every one of them is generated by the newest policy.
        steps_ahead = 0 if config.pipeline == "sync" else None

        def is_stale(entries) -> bool:
            return is_stale_group(entries, policy_version=self.policy_version, max_staleness=config.max_staleness)

        def drop(groups) -> None:
            """Consume groups without training on them (too stale to ever be trained)."""
            nonlocal groups_consumed
            if groups:
                reader.ack_consumed(groups)
                recorder.dropped(groups)
                episodes.dropped((entry.record for group in groups for entry in group), outcome="dropped_stale")
                self._log("dropped", trajectory_ids=[entry.record.trajectory_id for group in groups
                                                     for entry in group],
                          group_ids=[group[0].record.group_id for group in groups])
                backlog.extend(groups=len(groups))
                backlog.settle(group[0].record.group_id for group in groups)
                groups_consumed += len(groups)

        appended_before = self._entries_appended(reader.stream)

        def give_up_on_lost_groups() -> None:
            """Groups a dead producer took with it: count them, refuse stragglers, ask again."""
            nonlocal groups_consumed, episodes_lost
            lost = backlog.expire(timeout_s=config.rollout_timeout_s)
            if lost:
                logger.warning("run %s: %d episode groups lost (requested, never delivered)",
                               self.run_id, len(lost))
                held = assembler.refuse_groups(lost)
                if held:
                    reader.ack_consumed(held)
                    episodes.dropped((entry.record for group in held for entry in group),
                                     outcome="dropped_incomplete")
                reader.record_consumed_groups(lost)
                self._log("lost", group_ids=lost)
                groups_consumed += len(lost)
                episodes_lost += len(lost) * config.group_size

        stage = self.stages.stage
        self.stages.start()
        while self._rl_steps_done < config.rl_steps:
            with stage("telemetry"):
                self.traces.before_step(self.step + 1)
            backlog.top_up(groups_consumed=groups_consumed, steps_ahead=steps_ahead)
            groups = []
            with stage("data_wait"):
                while len(groups) < config.groups_per_step:
                    while assembler.complete_groups() < config.groups_per_step - len(groups):
                        for entry in reader.read(block_ms=self.settings.stream_block_ms):
                            assembler.add(entry)
                        reader.ack(assembler.take_duplicates())
                        drop(assembler.take_partial(is_stale))
                        give_up_on_lost_groups()
                        backlog.top_up(groups_consumed=groups_consumed, steps_ahead=steps_ahead)
                        self._heartbeat()
                    fresh, stale = split_stale_groups(
                        assembler.take(config.groups_per_step - len(groups)),
                        policy_version=self.policy_version, max_staleness=config.max_staleness,
                    )
                    drop(stale)
                    backlog.settle(group[0].record.group_id for group in fresh)
                    groups += fresh
                    groups_consumed += len(fresh)
            if config.pipeline == "async":
                # The next step's episodes generate while this one trains.
                backlog.top_up(groups_consumed=groups_consumed)
            entry_ids = [entry.entry_id for group in groups for entry in group]
            records = [entry.record for group in groups for entry in group]
            # Staleness: how many versions behind the policy being updated the data is.
            staleness = np.array([self.policy_version - r.policy_version for r in records], dtype=np.float32)

            with stage("batch"):
                prepared = self.algorithm.prepare([[entry.record for entry in group] for group in groups])
                episodes.consumed(records, trained=prepared.records)
            if not prepared.records:
                # Dynamic sampling dropped every group (no reward variance): nothing to learn from.
                # This step goes on: its stages so far count in the next update's timeline.
                backlog.extend(groups=len(groups))
                reader.ack_consumed(groups)
                self._log("dropped", trajectory_ids=[record.trajectory_id for record in records],
                          group_ids=[group[0].record.group_id for group in groups])
                continue
            recorder.trained(records, policy_version=self.policy_version)
            with stage("batch"):
                batch = self.algorithm.batch(
                    prepared, batch_size=config.episodes_per_step, length_buckets=self._buckets,
                    pad_id=self.tokenizer.pad_id, reference=self.reference,
                )
            learning_rate = config.schedule.learning_rate_at(
                base=config.rl_learning_rate, step=self._rl_steps_done, total_steps=config.rl_steps)
            self._set_learning_rate(learning_rate)
            metrics = self._train_on(self._rl_step, batch, updates=config.algorithm.updates_per_batch)
            metrics["learning_rate"] = learning_rate

            self._last_acked_entry_id = max(entry_ids, key=entry_order)
            self._trained_group_count += len(groups)
            with stage("publish"):
                self._publish()
            self.step += 1
            self._rl_steps_done += 1
            self._log("trained", trajectory_ids=[record.trajectory_id for record in records],
                      group_ids=[group[0].record.group_id for group in groups])
            self.telemetry.trajectories.add_step(step=self.step, records=records)
            # Acknowledged once a checkpoint with this update is on disk (see _ack_checkpointed).
            self._awaiting_checkpoint.append((self.step, groups))
            with stage("checkpoint"):
                if self.step % config.checkpoint_every == 0:
                    self._checkpoint()
            timeline = self.stages.finish()
            with stage("telemetry"):  # counted in the next step: this one's timeline is closed
                profile_fields = self._profile_fields(timeline, batch, updates=config.algorithm.updates_per_batch)
                wall_s = profile_fields["wall_s"]
                stats = prepared.stats
                staleness_fields = recorder.step_fields()
                appended = self._entries_appended(reader.stream)
                self.telemetry.emit(TrainerStepEvent(
                    run_id=self.run_id, step=self.step, phase="rl", policy_version=self.policy_version,
                    loss=metrics["loss"], **profile_fields,
                    samples_per_s=len(records) / wall_s if wall_s > 0 else None,
                    samples_produced_per_s=(appended - appended_before) / wall_s if wall_s > 0 else None,
                    rollout_metrics=rollout_metrics(records),
                    reward_mean=float(stats["reward_mean"]),
                    success_rate=float(np.mean([r.status == "ok" and r.reward > 0 for r in records])),
                    staleness_mean=float(staleness.mean()), staleness_max=float(staleness.max()),
                    failed_episodes=int(stats.get("episodes_failed", 0)),
                    episodes_lost=episodes_lost,
                    **staleness_fields,
                    **producer_stats.step_fields(),
                    algorithm_metrics={
                        **{name: value for name, value in metrics.items() if np.isfinite(value)},
                        **{f"batch/{name}": float(value) for name, value in stats.items()},
                    },
                    episodes=episodes.take(),
                    emitted_at=time.time(),
                ))
                episodes_lost = 0
                appended_before = appended
                self.traces.after_step(self.step)
                self._heartbeat()

        # The run is over: episodes read but not trained never will be. Consuming
        # them leaves nothing pending, so the stream can be trimmed to empty.
        self._checkpoint()
        self.checkpointer.wait_until_finished()
        self._ack_checkpointed()
        leftovers = assembler.take_partial(lambda entries: True)
        if leftovers:
            reader.ack_consumed(leftovers)
            logger.info("run %s: %d surplus episode groups left untrained", self.run_id, len(leftovers))
        reader.ack(assembler.take_duplicates())
        reader.trim(approximate=False)
