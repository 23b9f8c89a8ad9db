"""A run's model and how it learns, built once from its config.

The leader (:class:`trainer.run_loop.RunTrainer`), every follower of a multi-process trainer
(:class:`trainer.follower.FollowedRun`) and the checkpoint export
(:func:`trainer.checkpoint_export.restore_policy`) build their model, train state and steps
here, from the same config and seed, and save, restore and publish that state through it: so a
follower holds the same shards of the same state as the leader, and a checkpoint restores into the
structure it was saved from, whatever changes in how a run trains (its algorithm, its memory
settings, a value head, LoRA).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tandem.configs.run import RunConfig
from tandem.runtime.resource_usage import release_free_pages
from trainer.algorithms import Algorithm, build_algorithm
from trainer.checkpoints import RunCheckpointer, RunProgress
from trainer.sharding import batch_ways, make_mesh, shard_train_state, step_shardings
from trainer.train_state import TrainState, initial_train_state, make_optimizer
from trainer.train_step import TrainStep, make_train_step
from trainer.value_head import policy_params

if TYPE_CHECKING:
    import redis

    from policy import WeightPublisher


class Learner:
    """The algorithm, optimizer, graph, train state, shardings and both train steps of a run, and,
    once opened, its weight publisher and checkpointer.

    ``on_mesh`` false (the checkpoint export): the state stays where it was built, unsharded, and
    there are no steps; the structure is what a checkpoint restores into.

    The publisher and the checkpointer are opened apart from the build (:meth:`open_publisher`,
    :meth:`open_checkpoints`): on a multi-process trainer the checkpointer's creation is a collective
    that the leader makes only once its followers have begun the run.
    """

    def __init__(self, config: RunConfig, *, vocab_size: int, on_mesh: bool = True):
        self.config = config
        self.algorithm: Algorithm = build_algorithm(
            config.algorithm, temperature=config.sampling.temperature,
            max_policy_tokens=config.sampling.max_new_tokens * config.rollout.max_turns,
            logits_chunk_tokens=config.memory.logits_chunk_tokens, remat=config.memory.remat,
            micro_batch_tokens=config.memory.micro_batch_tokens,
            attention_query_chunk=config.memory.attention_query_chunk_tokens)
        self.optimizer = make_optimizer(config.learning_rate, config.optimizer)
        self.graphdef, state = initial_train_state(config, vocab_size=vocab_size,
                                                   needs_value_head=self.algorithm.needs_value_head,
                                                   optimizer=self.optimizer)
        self.shardings = None
        self.steps: dict[str, TrainStep] = {}
        if on_mesh:
            self.shardings = step_shardings(make_mesh(config.mesh), state)
            state = shard_train_state(state, self.shardings)
            micro_batch_tokens = config.memory.micro_batch_tokens
            self.steps = {
                "sft": make_train_step(self.graphdef, self.optimizer, self.algorithm.sft_loss_fn,
                                       shardings=self.shardings, micro_batch_tokens=micro_batch_tokens),
                "rl": make_train_step(self.graphdef, self.optimizer, self.algorithm.loss_fn,
                                      shardings=self.shardings, micro_batch_tokens=micro_batch_tokens),
            }
        self.state: TrainState = state
        release_free_pages()  # the initialisers' temporaries, freed but kept by the allocator
        self.weight_publisher: WeightPublisher | None = None
        self.checkpointer: RunCheckpointer | None = None

    @property
    def batch_ways(self) -> int:
        """Devices a batch's rows are split over (data x fsdp): a packed batch's rows are a multiple of it."""
        return 1 if self.shardings is None else batch_ways(self.shardings)

    def published_params(self):
        """What producers load of the state: the policy's parameters (without a value head's)."""
        return policy_params(self.state.params) if self.algorithm.needs_value_head else self.state.params

    # -- weights -------------------------------------------------------------

    def open_publisher(self, redis_client: redis.Redis, *, directory: Path) -> None:
        """Choose the run's weight transport now, so that weights too large for it fail the run before
        anything is sent. Off process 0 a publisher only gathers (a collective) and never uses Redis."""
        # Imported here: the checkpoint export builds a Learner and must not load Redis (test_import_rules).
        from policy import publication_bytes, weight_publisher

        weights = self.config.weights
        self.weight_publisher = weight_publisher(
            redis_client, transport=weights.transport, directory=directory, lora=self.config.lora,
            publish_dtype=weights.publish_dtype,
            parameter_bytes=publication_bytes(self.published_params(), weights.publish_dtype),
            redis_max_bytes=weights.redis_max_mb * 2**20)

    def publish(self, *, run_id: int, version: int) -> None:
        """The policy's parameters as ``version`` through the run's transport (a gather on every process)."""
        self.weight_publisher.publish(run_id=run_id, version=version, params=self.published_params())

    def publish_kept(self, redis_client: redis.Redis, *, run_id: int, version: int, key: str) -> None:
        """The same parameters again, as ``version``, in the Redis hash ``key``: an evaluation's own copy."""
        from policy import RedisWeightPublisher

        weights = self.config.weights
        kept = RedisWeightPublisher(redis_client, lora=self.config.lora, publish_dtype=weights.publish_dtype,
                                    key_of=lambda run_id: key)
        kept.publish(run_id=run_id, version=version, params=self.published_params())

    # -- checkpoints ---------------------------------------------------------

    def open_checkpoints(self, directory: Path, *, max_to_keep: int | None) -> None:
        """The run's checkpointer on ``directory`` (every process of a trainer opens it together)."""
        self.checkpointer = RunCheckpointer(directory, max_to_keep=max_to_keep)

    def save_checkpoint(self, step: int, *, progress: RunProgress, reference_params=None) -> None:
        self.checkpointer.save(step, train_state=self.state, progress=progress, reference_params=reference_params)

    def restore_checkpoint(self, step: int) -> RunProgress:
        """The state of this run's checkpoint ``step``, laid out on the learner's mesh; returns its progress."""
        state, progress = self.checkpointer.restore(step, abstract_train_state=self.state)
        self.adopt(state)
        return progress

    def restore_reference(self, step: int):
        """The KL penalty's reference parameters saved with checkpoint ``step``."""
        return self.checkpointer.restore_reference(step, abstract_params=self.state.params)

    def read_checkpoint(self, directory: Path, step: int) -> TrainState:
        """Checkpoint ``step`` of the checkpoints in ``directory``, opened read only (another run's, or
        one being exported), in this run's structure; :meth:`adopt` makes it the learner's state."""
        checkpointer = RunCheckpointer(directory, read_only=True)
        try:
            state, _ = checkpointer.restore(step, abstract_train_state=self.state)
        finally:
            checkpointer.close()
        return state

    def adopt(self, state: TrainState) -> None:
        """``state`` as the learner's, laid out on its mesh."""
        self.state = state if self.shardings is None else shard_train_state(state, self.shardings)

    def close(self) -> None:
        """Close the checkpointer (every process of a trainer together: Orbax's barriers)."""
        if self.checkpointer is not None:
            self.checkpointer.close()
