"""A run's model and how it learns, built once from its config.

The leader (:class:`trainer.run_loop.RunTrainer`), every follower of a multi-process trainer
(:class:`trainer.follower.FollowedRun`) and the checkpoint export
(:func:`trainer.checkpoint_export.restore_policy`) build their model, train state and steps
here, from the same config and seed: so a follower holds the same shards of the same state as the
leader, and a checkpoint restores into the structure it was saved from, whatever changes in how a
run trains (its algorithm, its memory settings, a value head, LoRA).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tandem.configs.run import RunConfig
from trainer.algorithms import Algorithm, build_algorithm
from trainer.sharding import batch_ways, make_mesh, shard_train_state, step_shardings
from trainer.train_state import TrainState, initial_train_state, make_optimizer
from trainer.train_step import TrainStep, make_train_step
from trainer.value_head import policy_params

if TYPE_CHECKING:
    import redis

    from policy import WeightPublisher


class Learner:
    """The algorithm, optimizer, graph, train state, shardings and both train steps of a run.

    ``on_mesh`` false (the checkpoint export): the state stays where it was built, unsharded, and
    there are no steps; the structure is what a checkpoint restores into.
    """

    def __init__(self, config: RunConfig, *, vocab_size: int, on_mesh: bool = True):
        self.config = config
        self.algorithm: Algorithm = build_algorithm(
            config.algorithm, temperature=config.sampling.temperature,
            max_policy_tokens=config.sampling.max_new_tokens * config.rollout.max_turns,
            logits_chunk_tokens=config.memory.logits_chunk_tokens, remat=config.memory.remat)
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

    @property
    def batch_ways(self) -> int:
        """Devices a batch's rows are split over (data x fsdp): a packed batch's rows are a multiple of it."""
        return 1 if self.shardings is None else batch_ways(self.shardings)

    def published_params(self):
        """What producers load of the state: the policy's parameters (without a value head's)."""
        return policy_params(self.state.params) if self.algorithm.needs_value_head else self.state.params

    def publisher(self, redis_client: redis.Redis, *, directory: Path) -> WeightPublisher:
        """The run's weight transport, chosen now, so that weights too large for it fail the run before
        anything is sent. Off process 0 a publisher only gathers (a collective) and never uses Redis."""
        # Imported here: the checkpoint export builds a Learner and must not load Redis (test_import_rules).
        from policy import publication_bytes, weight_publisher

        weights = self.config.weights
        return weight_publisher(
            redis_client, transport=weights.transport, directory=directory, lora=self.config.lora,
            publish_dtype=weights.publish_dtype,
            parameter_bytes=publication_bytes(self.published_params(), weights.publish_dtype),
            redis_max_bytes=weights.redis_max_mb * 2**20)
