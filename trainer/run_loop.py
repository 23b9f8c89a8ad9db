"""Training one claimed run: SFT warm-up, then GRPO on streamed trajectories.

The loop is single-threaded on purpose: generation happens in producers, so
the only thing this thread ever waits for is data that is not there yet, and
that wait is measured and reported as the trainer's idle time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import jax
import jax.numpy as jnp
import redis
from celery import Celery
from flax import nnx

from environments import Tool
from policy import (
    RedisWeightSubscriber,
    load_tokenizer,
    prompt_layout,
)
from tandem.allowlists.model_paths import check_model_config_paths
from tandem.contracts import (
    IDLE_STAGE,
    RELEASED_RUN_STATUSES,
    DemonstrationMessage,
    RunSpec,
    RunStatus,
    TrainerHeartbeat,
    TrainerStepEvent,
    producer_fault_key,
    run_keys,
    run_log_stream,
    run_spec_key,
    run_stop_key,
)
from trainer.checkpoint_reports import CheckpointReporter
from trainer.checkpoints import RunProgress
from trainer.dataset_evaluation import held_out_token_statistics
from trainer.datasets import (
    SFT_TOKENS_METRIC,
    DatasetSource,
    SFTMix,
    load_dataset,
    rendered_conversations,
)
from trainer.demonstrations import DemonstrationFeed
from trainer.devices import DeviceMonitor, attention_width, parameter_count
from trainer.learner import Learner
from trainer.lockstep import SINGLE_PROCESS, AnnouncedReference, Lockstep, OrderKind
from trainer.platform_client import (
    ClaimedRun,
    PlatformClient,
    PlatformRequestFailedError,
    PlatformUnavailableError,
    RunTakenOverError,
    is_retryable,
)
from trainer.profiling import StageRecorder
from trainer.rollout_feed import RolloutFeed
from trainer.run_evaluation import RunEvaluation
from trainer.sharding import host_copy, shard_batch
from trainer.telemetry import StepEventBatcher, profile_fields, rl_step_event
from trainer.tracing import CapturedTrace, TraceCapture
from trainer.train_batch import batch_tokens, pad_batch
from trainer.train_state import set_learning_rate
from trainer.train_step import computed_slots, mean_metrics, train_updates
from trainer.trajectory_samples import TrajectorySampleBuffer

logger = logging.getLogger(__name__)


class RunCancelledError(Exception):
    pass


class StartFromError(RuntimeError):
    """The checkpoint a run starts from could not be restored; the run fails with why."""


class RunSetAsideError(Exception):
    """The platform kept failing a read of the run's own data (a page of a dataset it pins): the run is
    not to be failed at once but given back to the queue for a while, and other runs trained meanwhile
    (trainer/main.py); the platform fails it once its restarts are used up."""


class RunReleasedError(Exception):
    """The platform no longer wants this trainer to train the run (paused, or failed meanwhile)."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


@dataclass(frozen=True)
class TrainerSettings:
    """How the trainer process reaches everything; one per process."""

    redis_url: str
    checkpoint_root: Path
    consumer_name: str
    # The filesystem weight transport's shared directory, an operator setting (TANDEM_WEIGHT_DIR);
    # None: <checkpoint_root>/weights. Never a run's: it creates and deletes model copies there.
    weight_dir: Path | None = None
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


class RunTrainer:
    """The learner of one claimed run; its RL phase takes episodes from a :class:`RolloutFeed`."""

    def __init__(self, claimed: ClaimedRun, *, settings: TrainerSettings, platform: PlatformClient,
                 redis_client: redis.Redis, celery_app: Celery, lockstep: Lockstep = SINGLE_PROCESS):
        """``lockstep``: the other processes of a multi-process trainer, told of every collective
        before it is made (trainer/lockstep.py); by default there are none."""
        self.claimed = claimed
        self.lockstep = lockstep
        self.run_id = claimed.run_id
        self.config = claimed.config
        self.settings = settings
        self.platform = platform
        self.redis = redis_client
        self.celery_app = celery_app
        # Only model directories under the operator's roots, never this trainer's checkpoints.
        check_model_config_paths(self.config.model, refused_root=settings.checkpoint_root.resolve())
        self.tokenizer = load_tokenizer(self.config.model.tokenizer)
        # Demonstrations are rendered as producers render live episodes.
        self.prompt_layout = prompt_layout(self.config.model, self.tokenizer)
        # The environment's code never runs here: producers make the demonstrations
        # (trainer/demonstrations.py), and its declared tools, which the probe checked
        # it exposes, are what the layout shows the model.
        self.environment_tools = tuple(Tool(name=tool.name, description=tool.description,
                                            parameters=tool.parameters, run=None)
                                       for tool in claimed.environment.tools)
        self.traces = TraceCapture(self._upload_trace)
        self.telemetry = StepEventBatcher(platform, self.run_id, settings.telemetry_interval_s,
                                          on_trace_requests=self.traces.request,
                                          trajectories=TrajectorySampleBuffer(
                                              platform, self.run_id, self.tokenizer,
                                              per_step=self.config.trajectory_samples_per_step,
                                              groups_per_step=self.config.trajectory_sample_groups_per_step,
                                              tools=claimed.environment.tools))
        # Every second of the training loop goes to one stage of one step (see trainer/profiling.py).
        self.stages = StageRecorder()
        self.policy_version = -1
        self.step = 0
        self._last_heartbeat = 0.0
        self._buckets = length_buckets(self.config.model.max_seq_len)
        # Tokens of demonstrations longer than max_seq_len that SFT did not see (logged per demonstration).
        self._demonstration_tokens_cut = 0

        self.learner = Learner(self.config, vocab_size=self.tokenizer.vocab_size)
        # Chosen now, so weights too large for the run's transport fail the run before anything is sent.
        weights_directory = settings.weight_dir or settings.checkpoint_root / "weights"
        self.learner.open_publisher(redis_client, directory=weights_directory)
        self.devices = DeviceMonitor(parameters=parameter_count(self.learner.state.params),
                                     attention_width=attention_width(nnx.merge(self.learner.graphdef,
                                                                               self.learner.state.params)),
                                     interval_s=settings.device_report_interval_s)
        self._last_acked_entry_id: str | None = None
        self._trained_group_count = 0
        self._rl_steps_done = 0
        # The RL phase's episodes; it acknowledges them as checkpoints commit (see _checkpoint_committed).
        self._feed: RolloutFeed | None = None
        self._taken_over = False
        self.reference: AnnouncedReference | None = None
        self.evaluation = RunEvaluation(
            claimed, platform=platform, redis_client=redis_client, celery_app=celery_app,
            publish_kept=self._publish_kept,
            load_dataset=lambda name, version: self._load_dataset(name, version, weight=1.0),
            render=self._held_out_batches, score=self._score_held_out, trajectories=self.telemetry.trajectories)
        checkpoint_dir = settings.checkpoint_root / f"run-{self.run_id}"
        if not claimed.is_resume and checkpoint_dir.exists() and any(checkpoint_dir.iterdir()):
            # A freshly claimed run has never trained here: these belong to a run
            # of an earlier database that had the same id. Keep them, out of the way.
            checkpoint_dir.rename(checkpoint_dir.with_name(f"{checkpoint_dir.name}.stale-{int(time.time())}"))
        # Last, so that nothing between a follower's start and the run's end can fail: from here on,
        # the other processes of a multi-process trainer build the same state and follow (run() ends them).
        self.lockstep.announce(OrderKind.START, {
            "run_id": self.run_id, "config": self.config.model_dump(mode="json"),
            "vocab_size": self.tokenizer.vocab_size, "checkpoint_directory": str(checkpoint_dir.resolve()),
            "weights_directory": str(weights_directory.resolve())})
        self.learner.open_checkpoints(checkpoint_dir, max_to_keep=self.config.checkpoint.kept)
        self.checkpoint_reports = CheckpointReporter(
            platform, self.run_id, committed_checkpoints=self.learner.checkpointer.committed_checkpoints)

    # -- lifecycle ---------------------------------------------------------

    def run(self) -> str:
        """Train the run to its end (or until the platform releases it); returns the status."""
        try:
            return self._run()
        finally:
            # Every process of the trainer closes the checkpointer together (Orbax's barriers).
            self.lockstep.announce(OrderKind.END)
            self.learner.close()

    def _run(self) -> str:
        spec = RunSpec(run_id=self.run_id, config=self.config, environment=self.claimed.environment,
                       evaluation_environments=self.claimed.evaluation_environments)
        if self.claimed.is_resume:
            self._resume_from_checkpoint()
            # The stream, the consumed-ledger and the group counter carry over; a producer's fault
            # that failed the last attempt is the operator's to have mended before resuming.
            self.redis.delete(run_stop_key(self.run_id), producer_fault_key(self.run_id))
        else:
            if self.config.start_from is not None:
                self._start_from_checkpoint()
            # A claimed run starts from nothing. Keys left under the same id by an
            # earlier platform database (ids restart when it is recreated) must not
            # feed this run stale trajectories or weights. Its log keeps what this
            # trainer has logged for it since the claim (stream ids are times in ms).
            log_stream = run_log_stream(self.run_id)
            self.redis.delete(*(key for key in run_keys(self.run_id) if key != log_stream))
            self.redis.xtrim(log_stream, minid=f"{int(self.claimed.claimed_at * 1000)}-0", approximate=False)
        self.redis.set(run_spec_key(self.run_id), spec.model_dump_json())
        try:
            return self._train()
        except RunTakenOverError:
            # Another trainer holds the run now, or none does (it was queued again), even if
            # this was learnt while letting go of it: touch nothing of it any more.
            self._taken_over = True
            raise
        finally:
            # A trace still running (the run ended within it) stops: the profiler is one per process.
            self.traces.close(self.step)
            if not self._taken_over:
                # Producers stop starting episodes for a run this trainer lets go of.
                self.redis.set(run_stop_key(self.run_id), "1")
                self._wait_for_checkpoints()
                self._checkpoint_committed()

    def _train(self) -> str:
        """The run's phases, and what letting go of it takes when it is cancelled, paused or failed."""
        try:
            self._heartbeat(force=True)
            self._sft_phase()
            if self.learner.algorithm.needs_reference and self.reference is None:
                # The reference policy of the KL penalty is the policy RL starts from.
                self.lockstep.announce(OrderKind.REFERENCE)
                self.reference = self._reference_policy(jax.tree.map(jnp.copy, self.learner.state.params))
            self._publish()
            if self.config.algorithm.name != "sft":
                self._rl_phase()
            elif self.evaluation.configured:
                self._evaluate_if_due()
                self.evaluation.finish(between=self._heartbeat)
            self._checkpoint()
            self.telemetry.flush(wait=True)
            self._report(RunStatus.FINISHED)
            return RunStatus.FINISHED
        except RunCancelledError:
            self.telemetry.flush(wait=True)
            return RunStatus.CANCELLED
        except RunReleasedError as released:
            # Paused: keep everything a resume needs. Failed meanwhile (the reaper
            # presumed this trainer dead): the same, so the user can resume it.
            self._checkpoint()
            self.telemetry.flush(wait=True)
            logger.info("run %s %s: checkpointed at step %d and released", self.run_id,
                        released.status, self.step)
            return released.status
        except RunSetAsideError:
            # Given back to the queue (trainer/main.py): the next attempt resumes from here.
            self._checkpoint()
            self.telemetry.flush(wait=True)
            raise

    def _start_from_checkpoint(self) -> None:
        """Begin from another run's kept checkpoint (``start_from``, checked by the platform).

        Its whole train state: the run was cloned from that one, so the structures match.
        This run's own steps and versions still count from zero.
        """
        source = self.config.start_from
        directory = self.settings.checkpoint_root / f"run-{source.run}"
        self.lockstep.announce(OrderKind.START_FROM, {"directory": str(directory), "step": source.step})
        state, error = None, None
        try:
            state = self.learner.read_checkpoint(directory, source.step)
        except Exception as exc:  # noqa: BLE001 - gone, unreadable, or another structure: the run fails saying so
            error = exc
        # Every process of the trainer restored it, or none goes on from it.
        if not self.lockstep.agree(error is None):
            reason = f"{type(error).__name__}: {error}" if error else "another trainer process could not read it"
            raise StartFromError(f"checkpoint {source.step} of run {source.run} could not be restored "
                                 f"from {directory}: {reason}") from error
        self.learner.adopt(state)
        logger.info("run %s starts from checkpoint %d of run %d", self.run_id, source.step, source.run)

    def _resume_from_checkpoint(self) -> None:
        """Continue from the newest committed checkpoint, with policy versions that only go up."""
        published = RedisWeightSubscriber(self.redis).latest_version(self.run_id)
        latest = self.learner.checkpointer.latest_step()
        if latest is None and self.config.start_from is not None:
            # Nothing of its own yet (an evaluation-only run checkpoints only at its end).
            self._start_from_checkpoint()
        elif latest is None:
            logger.warning("run %s resumes with no checkpoint: training starts over", self.run_id)
        else:
            self.lockstep.announce(OrderKind.RESTORE, {"step": latest})
            progress = self.learner.restore_checkpoint(latest)
            self.step = progress.step
            self._rl_steps_done = progress.rl_steps
            self._trained_group_count = progress.trained_group_count
            self._last_acked_entry_id = progress.last_acked_entry_id
            self.policy_version = progress.policy_version
            if progress.has_reference:
                self.lockstep.announce(OrderKind.RESTORE_REFERENCE, {"step": progress.step})
                self.reference = self._reference_policy(self.learner.restore_reference(progress.step))
            logger.info("run %s resumes from its checkpoint of step %d (%d RL steps)", self.run_id,
                        self.step, self._rl_steps_done)
        # Versions published after the checkpoint stay behind us: the next one is newer still.
        self.policy_version = max(self.policy_version, published if published is not None else -1)

    def _report(self, status: RunStatus, message: str = "", *, retries: int | None = None) -> RunStatus:
        """Heartbeat with ``status``; by default retried until the platform answers (a run's end must reach it)."""
        return self.platform.heartbeat(
            self.run_id,
            TrainerHeartbeat(status=status, policy_version=max(self.policy_version, 0),
                             trainer_step=self.step, message=message, worker=self.settings.consumer_name),
            retries=retries,
        )

    def _heartbeat(self, *, force: bool = False) -> None:
        # Called between the reads of every wait: followers hear from the leader meanwhile.
        self.lockstep.keep_alive()
        self._checkpoint_committed()
        if not force and time.monotonic() - self._last_heartbeat < self.settings.heartbeat_interval_s:
            return
        self._last_heartbeat = time.monotonic()
        try:
            # One try: training goes on while the platform is away (the liveness thread keeps
            # trying), and learns of a cancel or a pause at the first heartbeat that gets through.
            status = self._report(RunStatus.RUNNING, retries=0)
        except (PlatformUnavailableError, httpx.HTTPStatusError) as exc:
            if not is_retryable(exc):
                raise
            logger.warning("run %s: heartbeat at step %d did not reach the platform (%s); training goes on",
                           self.run_id, self.step, exc)
            return
        if status == RunStatus.CANCELLED:
            raise RunCancelledError()
        if status in RELEASED_RUN_STATUSES:
            raise RunReleasedError(status)

    # -- SFT ---------------------------------------------------------------

    def _demonstration_batch(self, demonstrations: list[list[DemonstrationMessage]]):
        """A padded SFT batch of producers' demonstrations (chat messages); None when there are none."""
        sequences, masks, tokens_cut = rendered_conversations(
            self.prompt_layout, self.environment_tools, demonstrations, max_len=self.config.model.max_seq_len)
        if tokens_cut:
            logger.warning("run %s: %d tokens of this step's demonstrations are cut to model.max_seq_len=%d",
                           self.run_id, tokens_cut, self.config.model.max_seq_len)
        self._demonstration_tokens_cut += tokens_cut
        if not sequences:
            return None
        return pad_batch(sequences, loss_masks=masks, behaviour_logprobs=None, advantages=None,
                         batch_size=self.config.sft_batch_size, length_buckets=self._buckets,
                         pad_id=self.tokenizer.pad_id)

    def _held_out_batches(self, conversations):
        """Held-out dataset rows as SFT-shaped batches (the shapes SFT compiled), with the tokens each cut."""
        size = self.config.sft_batch_size
        for first in range(0, len(conversations), size):
            sequences, masks, tokens_cut = rendered_conversations(
                self.prompt_layout, self.environment_tools, conversations[first:first + size],
                max_len=self.config.model.max_seq_len)
            yield pad_batch(sequences, loss_masks=masks, behaviour_logprobs=None, advantages=None,
                            batch_size=size, length_buckets=self._buckets, pad_id=self.tokenizer.pad_id), tokens_cut

    def _load_dataset(self, name: str, version: int, *, weight: float) -> DatasetSource:
        """Every row of a pinned dataset version, its heartbeat between the pages and their retries.

        Raises:
          RunSetAsideError: the platform kept failing a page (a version it cannot serve now).
        """
        try:
            return load_dataset(self.platform, self.run_id, name=name, version=version, weight=weight,
                                tool_call_format=self.prompt_layout.tool_call_format, between_pages=self._heartbeat)
        except PlatformRequestFailedError as exc:
            raise RunSetAsideError(f"{type(exc).__name__}: {exc}") from exc

    def _sft_sources(self) -> SFTMix:
        """The run's pinned datasets, read from the platform, mixed with the demonstrations by weight."""
        sft = self.config.sft
        datasets = [self._load_dataset(dataset.name, dataset.version, weight=dataset.weight)
                    for dataset in sft.datasets]
        for dataset in datasets:
            logger.info("run %s: SFT on dataset %s (%d rows, weight %g)", self.run_id, dataset.label,
                        len(dataset.rows), dataset.weight)
        return SFTMix.for_config(sft, run_seed=self.config.seed, batch_size=self.config.sft_batch_size,
                                 datasets=datasets)

    def _sft_phase(self) -> None:
        if self._rl_steps_done:
            return  # resumed after SFT
        if self.step >= self.config.sft_steps:
            return
        mix = self._sft_sources()
        demonstrations = DemonstrationFeed(
            redis_client=self.redis, celery_app=self.celery_app, run_id=self.run_id, run_seed=self.config.seed,
            steps=self.config.sft_steps, count=self.config.sft_batch_size,
            tool_call_format=self.prompt_layout.tool_call_format, block_ms=self.settings.stream_block_ms,
        ) if mix.demonstrations_weight > 0 else None
        stage = self.stages.stage
        self.stages.start()
        while self.step < self.config.sft_steps:
            with stage("telemetry"):
                self.traces.before_step(self.step + 1)
            counts = mix.counts(self.step)
            messages = []
            if demonstrations is not None and counts[-1] > 0:
                # Asked by step, so a run resumed from a checkpoint sees the same data; the next
                # step's are made by a producer while this one trains. An answer with an error
                # raises DemonstrationsFailedError, which fails the run with its reason.
                messages = demonstrations.next_batch(self.step, waiting=stage(IDLE_STAGE),
                                                     between_reads=self._heartbeat)[:counts[-1]]
            demonstrations_used = len(messages)
            with stage("batch"):
                batch = self._demonstration_batch([*messages, *mix.dataset_examples(self.step, counts)])
            if batch is None:
                logger.info("environment %s has no demonstrations; skipping SFT", self.claimed.environment.name)
                break
            loss = self._train_on("sft", batch, learning_rate=self.config.schedule.learning_rate_at(
                base=self.config.learning_rate, step=self.step, total_steps=self.config.sft_steps))["loss"]
            self.step += 1
            with stage("checkpoint"):
                if self.step % self.config.checkpoint.every == 0:
                    self._checkpoint()
            timeline = self.stages.finish()
            tokens = batch_tokens(batch)
            with stage("telemetry"):  # counted in the next step: this one's timeline is closed
                self.telemetry.emit(TrainerStepEvent(
                    run_id=self.run_id, step=self.step, phase="sft", policy_version=max(self.policy_version, 0),
                    loss=loss, emitted_at=time.time(),
                    algorithm_metrics={"sft/demonstration_tokens_cut": float(self._demonstration_tokens_cut),
                                       SFT_TOKENS_METRIC: float(tokens),
                                       **mix.metrics(counts, demonstrations_used=demonstrations_used)},
                    **profile_fields(timeline, tokens=tokens,
                                     padded_tokens=computed_slots(batch, self.config.memory.micro_batch_tokens,
                                                                  batch_ways=self.learner.batch_ways),
                                     length=batch.tokens.shape[1], devices=self.devices),
                ))
                self.traces.after_step(self.step)
                self._heartbeat()

    # -- profiling ---------------------------------------------------------

    def _train_on(self, phase: str, batch, *, learning_rate: float, updates: int = 1) -> dict[str, float]:
        """``updates`` updates of ``phase`` ("sft" or "rl") at ``learning_rate`` on ``batch``, its transfer
        and its compute timed apart; their mean scalar metrics.

        Both end in ``block_until_ready``: the transfer so that it is not billed
        to compute, the compute on the new state too, not only on the loss, so
        that the optimizer update (fused into the same program) is not billed
        to whatever runs next. The batch crosses to the device once for all updates.
        """
        stage = self.stages.stage
        with stage("host_to_device"):
            self.lockstep.announce_batch(OrderKind.TRAIN, batch, {
                "phase": phase, "step": self.step + 1, "learning_rate": learning_rate, "updates": updates})
            set_learning_rate(self.learner.state, learning_rate)
            sharded = jax.block_until_ready(shard_batch(batch, self.learner.shardings))
        with stage("compute"):
            self.learner.state, per_update = train_updates(self.learner.steps[phase], self.learner.state, sharded, updates=updates)
            jax.block_until_ready(self.learner.state)
            metrics = mean_metrics(per_update)
        self.lockstep.trained(step=self.step + 1, phase=phase, metrics=metrics)
        return metrics

    def _upload_trace(self, captured: CapturedTrace) -> None:
        self.platform.upload_trace(self.run_id, captured.request.id, first_step=captured.first_step,
                                   last_step=captured.last_step, archive=captured.archive, error=captured.error)
        logger.info("run %s: trace %s of steps %d-%d uploaded", self.run_id, captured.request.id,
                    captured.first_step, captured.last_step)

    # -- RL ----------------------------------------------------------------

    def _reference_policy(self, params) -> AnnouncedReference:
        return AnnouncedReference(self.learner.graphdef, params, lockstep=self.lockstep)

    def _publish(self) -> float:
        started = time.perf_counter()
        self.policy_version += 1
        self.lockstep.announce(OrderKind.PUBLISH, {"version": self.policy_version})
        self.learner.publish(run_id=self.run_id, version=self.policy_version)
        return time.perf_counter() - started

    def _publish_kept(self, version: int, key: str) -> None:
        """The published parameters again, as ``version``, in the hash ``key``: an evaluation's own copy."""
        self.lockstep.announce(OrderKind.PUBLISH_KEPT, {"version": version, "key": key})
        self.learner.publish_kept(self.redis, run_id=self.run_id, version=version, key=key)

    def _evaluate_if_due(self) -> None:
        self.evaluation.evaluate_if_due(rl_steps_done=self._rl_steps_done, step=self.step,
                                        policy_version=self.policy_version)

    def _score_held_out(self, batch):
        """The current policy's token statistics on a batch of held-out dataset rows."""
        self.lockstep.announce_batch(OrderKind.SCORE, batch)
        sharded = shard_batch(batch, self.learner.shardings)
        return host_copy(held_out_token_statistics(self.learner.graphdef, self.learner.state.params, sharded))

    def _checkpoint(self) -> None:
        if self.learner.checkpointer.latest_step() == self.step:
            return  # the last periodic save already holds this step
        progress = RunProgress(
            step=self.step, policy_version=self.policy_version, run_id=self.run_id,
            last_acked_entry_id=self._last_acked_entry_id, trained_group_count=self._trained_group_count,
            rl_steps=self._rl_steps_done,
        )
        self.lockstep.announce(OrderKind.CHECKPOINT, {"step": self.step, "progress": progress.model_dump(mode="json"),
                                                      "with_reference": self.reference is not None})
        self.learner.save_checkpoint(self.step, progress=progress,
                                     reference_params=self.reference.params if self.reference is not None else None)

    def _wait_for_checkpoints(self) -> None:
        self.lockstep.announce(OrderKind.WAIT_FOR_CHECKPOINTS)
        self.learner.checkpointer.wait_until_finished()

    def _checkpoint_committed(self) -> None:
        """Report the checkpoints on disk, and let the feed acknowledge the data the newest one holds."""
        # Asked once: the same answer serves the report and the acknowledgements.
        committed = self.learner.checkpointer.committed_step()
        self.checkpoint_reports.committed(committed)
        if committed is not None and self._feed is not None:
            self._feed.checkpoint_committed(committed)

    def _rl_phase(self) -> None:
        """RL steps until ``rl_steps``: feed, prepare, batch, train, publish, checkpoint, emit."""
        config = self.config
        feed = self._feed = RolloutFeed(
            redis_client=self.redis, celery_app=self.celery_app, run_id=self.run_id, config=config,
            consumer=self.settings.consumer_name, rl_steps_left=config.rl_steps - self._rl_steps_done,
            block_ms=self.settings.stream_block_ms,
        )
        if self.claimed.is_resume:
            feed.resume(step=self.step, policy_version=self.policy_version)
        updates = config.algorithm.updates_per_batch
        stage = self.stages.stage
        if self._rl_steps_done == 0:
            self._evaluate_if_due()  # the policy SFT left, before RL changes it
        self.stages.start()
        while self._rl_steps_done < config.rl_steps:
            with stage("telemetry"):
                self.traces.before_step(self.step + 1)
            taken = feed.next_step(after_step=self.step, policy_version=self.policy_version,
                                   waiting=stage(IDLE_STAGE), between_reads=self._heartbeat)
            with stage("batch"):
                prepared = self.learner.algorithm.prepare(taken.trajectories, rl_step=self._rl_steps_done)
            if not prepared.records:
                # Dynamic sampling dropped every group (no reward variance): nothing to learn from.
                # This step goes on: its stages so far count in the next update's timeline.
                feed.filtered_out(taken, after_step=self.step, policy_version=self.policy_version)
                continue
            with stage("batch"):
                batch = self.learner.algorithm.batch(
                    prepared, batch_size=config.rollout.episodes_per_step, length_buckets=self._buckets,
                    pad_id=self.tokenizer.pad_id, reference=self.reference,
                    pack_row_multiple=self.learner.batch_ways if config.memory.pack_episodes else None,
                    pack_row_tokens=config.memory.pack_row_tokens,
                    pack_padding_target=config.memory.pack_padding_target,
                )
            learning_rate = config.schedule.learning_rate_at(
                base=config.rl_learning_rate, step=self._rl_steps_done, total_steps=config.rl_steps)
            metrics = self._train_on("rl", batch, learning_rate=learning_rate, updates=updates)
            metrics["learning_rate"] = learning_rate

            with stage("publish"):
                self._publish()
            self.step += 1
            self._rl_steps_done += 1
            with stage("publish"):
                self._evaluate_if_due()
            self._last_acked_entry_id = taken.newest_entry_id
            self._trained_group_count += len(taken.groups)
            # Acknowledged once a checkpoint with this update is committed (see _checkpoint_committed).
            feed.trained(taken, kept=prepared.records, step=self.step, policy_version=self.policy_version)
            # GAE's advantages are per token, computed in the update: the browser shows none for them.
            episode_advantages = {} if self.learner.algorithm.needs_value_head else {
                record.trajectory_id: float(advantage)
                for record, advantage in zip(prepared.records, prepared.advantages, strict=True)}
            self.telemetry.trajectories.add_step(step=self.step, records=taken.records,
                                                 advantages=episode_advantages)
            with stage("checkpoint"):
                if self.step % config.checkpoint.every == 0:
                    self._checkpoint()
            timeline = self.stages.finish()
            with stage("telemetry"):  # counted in the next step: this one's timeline is closed
                profile = profile_fields(timeline, tokens=batch_tokens(batch),
                                         padded_tokens=computed_slots(batch, config.memory.micro_batch_tokens,
                                                                      batch_ways=self.learner.batch_ways),
                                         length=batch.tokens.shape[1], updates=updates, devices=self.devices)
                self.telemetry.emit(rl_step_event(
                    run_id=self.run_id, step=self.step, policy_version=self.policy_version,
                    records=taken.records, metrics=metrics, batch_stats=prepared.stats, profile=profile,
                    rollout=feed.step_fields(wall_s=profile["wall_s"]),
                ))
                self.traces.after_step(self.step)
                self.evaluation.after_step()
                self._heartbeat()

        self.evaluation.finish(between=self._heartbeat)
        self._checkpoint()
        self._wait_for_checkpoints()
        self._checkpoint_committed()
        feed.finish()
