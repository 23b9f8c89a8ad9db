"""A trainer process other than process 0: it follows the leader's orders (trainer/lockstep.py).

A follower never talks to the platform, Redis or Celery, and reads no stream:
it needs only the JAX job's coordinator. It holds its share of the run's
train state, and makes each collective the leader announces (train steps,
weight gathers, checkpoint saves and restores) with the values the order
carries. Orbax writes each process's shards from that process, so the
checkpoint directory the leader names must be the same storage here.

A follower whose leader is gone cannot go on (the job cannot lose a process):
its broadcast fails, and it exits with ``LOST_PROCESS_EXIT_CODE`` (trainer/main.py),
or the JAX job's heartbeats end it. A leader whose follower is gone gives its run
back to the queue as a restart and exits alike: the supervisor starts them all again.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import jax
import jax.numpy as jnp
import redis

from tandem.configs.run import RunConfig
from trainer.algorithms import ReferencePolicy
from trainer.checkpoints import RunProgress
from trainer.dataset_evaluation import held_out_token_statistics
from trainer.learner import Learner
from trainer.lockstep import Order, OrderKind, arrays_batch, log_trained, receive
from trainer.lockstep import agree as all_agree
from trainer.sharding import host_copy, shard_batch
from trainer.train_state import set_learning_rate
from trainer.train_step import mean_metrics, train_updates

logger = logging.getLogger(__name__)


class FollowedRun:
    """This process's part of the run the leader trains: built by its START order."""

    def __init__(self, fields: dict, *, unused_redis: redis.Redis):
        self.run_id = fields["run_id"]
        self.config = config = RunConfig.model_validate(fields["config"])
        # Built as the leader builds it (RunTrainer), from the same config and seed.
        self.learner = Learner(config, vocab_size=fields["vocab_size"])
        # The same transport the leader chose; off process 0 a publisher only gathers (a collective)
        # and never touches Redis, so its client never connects.
        self._redis = unused_redis
        self.learner.open_publisher(unused_redis, directory=Path(fields["weights_directory"]))
        self.reference: ReferencePolicy | None = None
        self.learner.open_checkpoints(Path(fields["checkpoint_directory"]), max_to_keep=config.checkpoint.kept)
        logger.info("process %d follows run %s on a %s mesh", jax.process_index(), self.run_id,
                    dict(self.learner.shardings.batch.mesh.shape))


    def obey(self, order: Order) -> None:
        """Make the call ``order`` announces, as the leader makes it (see RunTrainer)."""
        fields = order.fields
        match order.kind:
            case OrderKind.IDLE:
                pass
            case OrderKind.TRAIN:
                set_learning_rate(self.learner.state, fields["learning_rate"])
                sharded = shard_batch(arrays_batch(order.arrays), self.learner.shardings)
                self.learner.state, per_update = train_updates(self.learner.steps[fields["phase"]], self.learner.state, sharded,
                                                       updates=fields["updates"])
                log_trained(step=fields["step"], phase=fields["phase"], metrics=mean_metrics(per_update))
            case OrderKind.PUBLISH:
                self.learner.publish(run_id=self.run_id, version=fields["version"])
            case OrderKind.PUBLISH_KEPT:
                self.learner.publish_kept(self._redis, run_id=self.run_id, version=fields["version"],
                                          key=fields["key"])
            case OrderKind.REFERENCE:
                self.reference = ReferencePolicy(self.learner.graphdef, jax.tree.map(jnp.copy, self.learner.state.params))
            case OrderKind.REFERENCE_LOGPROBS:
                self.reference.logprobs(arrays_batch(order.arrays), temperature=fields["temperature"],
                                        logits_chunk_tokens=fields["logits_chunk_tokens"],
                                        micro_batch_tokens=fields.get("micro_batch_tokens"))
            case OrderKind.SCORE:
                host_copy(held_out_token_statistics(self.learner.graphdef, self.learner.state.params,
                                                    shard_batch(arrays_batch(order.arrays), self.learner.shardings)))
            case OrderKind.CHECKPOINT:
                self.learner.save_checkpoint(
                    fields["step"], progress=RunProgress.model_validate(fields["progress"]),
                    reference_params=self.reference.params if fields["with_reference"] else None)
            case OrderKind.WAIT_FOR_CHECKPOINTS:
                self.learner.checkpointer.wait_until_finished()
            case OrderKind.RESTORE:
                self.learner.restore_checkpoint(fields["step"])
                logger.info("process %d restored run %s at step %d", jax.process_index(), self.run_id,
                            fields["step"])
            case OrderKind.RESTORE_REFERENCE:
                self.reference = ReferencePolicy(self.learner.graphdef, self.learner.restore_reference(fields["step"]))
            case OrderKind.START_FROM:
                self._start_from(fields)
            case _:
                raise ValueError(f"order {order.kind} does not belong in a run")

    def _start_from(self, fields: dict) -> None:
        """Another run's checkpoint; every process says whether it could, as the leader does."""
        restored = None
        try:
            restored = self.learner.read_checkpoint(Path(fields["directory"]), fields["step"])
        except Exception:  # noqa: BLE001 - the leader fails the run, with its own reason
            logger.exception("process %d could not restore checkpoint %s of %s", jax.process_index(),
                             fields["step"], fields["directory"])
        if all_agree(restored is not None):
            self.learner.adopt(restored)

    def close(self) -> None:
        self.learner.close()


def follow(*, redis_url: str) -> int:
    """Follow the leader's orders until it quits; returns the runs followed.

    ``redis_url`` only builds a client that a follower's publishers hold and never use.

    Raises:
      jax.errors.JaxRuntimeError: the leader is gone; the process must exit (non-zero).
    """
    unused_redis = redis.Redis.from_url(redis_url)
    logger.info("trainer process %d of %d on host %s follows process 0", jax.process_index(), jax.process_count(),
                socket.gethostname())
    run: FollowedRun | None = None
    followed = 0
    # Any error ends the process: a follower that missed a collective cannot catch up, and the job
    # (the leader too, when its next collective fails) must start again together.
    while True:
        order = receive()
        if order.kind == OrderKind.QUIT:
            logger.info("process 0 stopped; so does process %d", jax.process_index())
            return followed
        if order.kind == OrderKind.START:
            run = FollowedRun(order.fields, unused_redis=unused_redis)
            followed += 1
        elif order.kind == OrderKind.END:
            if run is not None:
                run.close()
                logger.info("process %d: run %s ended at the leader", jax.process_index(), run.run_id)
            run = None
        elif run is not None:
            run.obey(order)
        elif order.kind != OrderKind.IDLE:
            raise RuntimeError(f"order {order.kind} came outside a run: the processes are out of step")
