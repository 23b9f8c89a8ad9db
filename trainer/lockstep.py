"""Keeping the processes of a multi-process trainer in step, with JAX's own collectives only.

A trainer that spans several processes (hosts) is one JAX job: every jitted
step, weight gather and Orbax save or restore is a collective that every
process must enter, in the same order (docs/multi_host.md). Process 0, the
leader, alone claims runs and talks to the platform, Redis and Celery; the
others follow (``trainer/follower.py``). Before each collective the leader
*announces* an :class:`Order`: what it is about to do, with the few values a
follower cannot know (the run's config, a step's batch, a checkpoint's
progress). Then every process makes the same call. An order travels with
:func:`jax.experimental.multihost_utils.broadcast_one_to_all`, itself a
collective, so orders and the calls they announce can never be reordered.

On one process :data:`SINGLE_PROCESS` announces nothing: today's trainer,
with no broadcast and no copy.

Wire format: an order is msgpack bytes (a kind, a JSON object of fields and
a flat map of numpy arrays). They cross in a fixed first block of
:data:`FIRST_BLOCK_BYTES` that starts with the message's length, and, when
the message is longer, a second block padded to a power of two (every
distinct block size is one small compilation, so there are few).
"""

from __future__ import annotations

import enum
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from flax import serialization
from jax.experimental import multihost_utils

from trainer.algorithms import ReferencePolicy
from trainer.train_batch import TrainBatch
from trainer.train_step import DEFAULT_LOGITS_CHUNK_TOKENS

logger = logging.getLogger(__name__)

# The first block of every order: its length (4 bytes) and the start of its message. Most orders
# (everything but batches) fit, so they cost one broadcast of 4 KiB.
FIRST_BLOCK_BYTES = 4096
_LENGTH_BYTES = 4
# Followers wait inside a broadcast while the leader has nothing to announce (no run claimed,
# a step waiting for trajectories). The leader announces IDLE at least this often meanwhile, so
# that no collective waits for long: how long Gloo's (or a GPU library's) collectives wait is not
# ours to set. On CPU a broadcast waited 700 s and still completed; a dead leader is noticed at
# once either way (its connections reset, or the JAX job's heartbeats stop).
KEEP_ALIVE_S = 10.0

#: The exit status of a trainer process whose JAX job lost a process (EX_TEMPFAIL: try again). A JAX
#: job cannot go on without one of its processes: the supervisor starts all of them again, and the
#: run, queued again meanwhile, resumes from its newest committed checkpoint (docs/multi_host.md).
LOST_PROCESS_EXIT_CODE = 75


class LostProcessError(RuntimeError):
    """The trainer's JAX job lost a process (a collective failed): none of its processes can go on."""


class OrderKind(enum.StrEnum):
    """What the leader is about to do; a follower does the same (trainer/follower.py)."""

    IDLE = "idle"  # nothing: the leader is alive and waiting for work
    START = "start"  # a run begins: build its train state, mesh, steps and checkpointer
    RESTORE = "restore"  # restore the run's checkpoint of a step (resuming)
    RESTORE_REFERENCE = "restore_reference"  # and the KL penalty's reference saved with it
    START_FROM = "start_from"  # restore another run's checkpoint (config.start_from)
    REFERENCE = "reference"  # keep a copy of the parameters as the KL penalty's reference
    REFERENCE_LOGPROBS = "reference_logprobs"  # the reference's log-probabilities of a batch
    TRAIN = "train"  # set the learning rate, train on a batch (SFT or RL step)
    PUBLISH = "publish"  # gather and publish the parameters as a policy version
    PUBLISH_KEPT = "publish_kept"  # the same, into an evaluation's own weights hash
    SCORE = "score"  # score held-out dataset rows (trainer/dataset_evaluation.py)
    CHECKPOINT = "checkpoint"  # save a checkpoint of a step
    WAIT_FOR_CHECKPOINTS = "wait_for_checkpoints"  # block until every save is committed
    END = "end"  # the run is over for this job: close its checkpointer, drop its state
    QUIT = "quit"  # the leader stops: so do the followers


@dataclass(frozen=True)
class Order:
    kind: OrderKind
    # JSON values.
    fields: dict[str, Any] = field(default_factory=dict)
    # Named host arrays (a batch's).
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def encode(order: Order) -> bytes:
    return serialization.msgpack_serialize({
        "kind": str(order.kind), "fields": json.dumps(order.fields), "arrays": dict(order.arrays)})


def decode(message: bytes) -> Order:
    raw = serialization.msgpack_restore(message)
    return Order(kind=OrderKind(raw["kind"]), fields=json.loads(raw["fields"]),
                 arrays={name: np.asarray(array) for name, array in raw["arrays"].items()})


def batch_arrays(batch: TrainBatch) -> dict[str, np.ndarray]:
    """A batch as flat host arrays (extras prefixed ``extras/``); every array fully on this host."""
    arrays = {name: np.asarray(getattr(batch, name)) for name in _BATCH_FIELDS}
    if batch.episodes is not None:
        arrays["episodes"] = np.asarray(batch.episodes)
    arrays |= {f"extras/{name}": np.asarray(value) for name, value in batch.extras.items()}
    return arrays


def arrays_batch(arrays: dict[str, np.ndarray]) -> TrainBatch:
    """The inverse of :func:`batch_arrays`."""
    extras = {name.removeprefix("extras/"): value for name, value in arrays.items() if name.startswith("extras/")}
    return TrainBatch(**{name: arrays[name] for name in _BATCH_FIELDS}, extras=extras, episodes=arrays.get("episodes"))


_BATCH_FIELDS = ("tokens", "positions", "attention_mask", "loss_mask", "advantages", "behaviour_logprobs")


def _block_size(remaining: int) -> int:
    return max(FIRST_BLOCK_BYTES, 1 << (remaining - 1).bit_length())


def _broadcast(message: bytes | None) -> bytes:
    """``message`` from process 0 to every process (a collective: all call it, others pass None)."""
    leading = message is not None
    first = np.zeros(FIRST_BLOCK_BYTES, np.uint8)
    if leading:
        head = len(message).to_bytes(_LENGTH_BYTES, "little") + message[:FIRST_BLOCK_BYTES - _LENGTH_BYTES]
        first[:len(head)] = np.frombuffer(head, np.uint8)
    first = np.asarray(multihost_utils.broadcast_one_to_all(first, is_source=leading))
    length = int.from_bytes(first[:_LENGTH_BYTES].tobytes(), "little")
    received = first[_LENGTH_BYTES:_LENGTH_BYTES + length].tobytes()
    remaining = length - len(received)
    if remaining <= 0:
        return received
    rest = np.zeros(_block_size(remaining), np.uint8)
    if leading:
        rest[:remaining] = np.frombuffer(message[len(received):], np.uint8)
    rest = np.asarray(multihost_utils.broadcast_one_to_all(rest, is_source=leading))
    return received + rest[:remaining].tobytes()


def receive() -> Order:
    """The leader's next order (followers only); blocks until it comes.

    Raises:
      jax.errors.JaxRuntimeError: the leader is gone (its connection reset, or the JAX
        job's heartbeats stopped): the follower cannot go on.
    """
    return decode(_broadcast(None))


class Lockstep:
    """A trainer alone in its JAX job: there is no one to keep in step, and nothing is sent."""

    #: Whether orders go to other processes.
    leading = False

    def announce(self, kind: OrderKind, fields: dict[str, Any] | None = None,
                 arrays: dict[str, np.ndarray] | None = None) -> None:
        """Tell the followers what every process is about to do (no-op on one process)."""

    def announce_batch(self, kind: OrderKind, batch: TrainBatch, fields: dict[str, Any] | None = None) -> None:
        """:meth:`announce` with ``batch``'s arrays (they are only copied when there are followers)."""

    def keep_alive(self) -> None:
        """Let waiting followers know the leader lives, if it said nothing for a while."""

    def agree(self, ok: bool) -> bool:
        """Whether every process's ``ok`` is true (a collective with followers)."""
        return ok

    def breaks_job(self, error: BaseException) -> bool:
        """Whether ``error`` leaves the JAX job unable to go on (never on one process)."""
        return False

    def trained(self, *, step: int, phase: str, metrics: dict[str, float]) -> None:
        """Log a step's metrics when several processes train it (each logs its own; they must agree)."""

    def quit(self) -> None:
        """Release the followers: the leader stops."""


#: The lockstep of a trainer that is one process.
SINGLE_PROCESS = Lockstep()


class Leader(Lockstep):
    """Process 0 of a multi-process trainer: announces every collective before it makes it."""

    leading = True

    def __init__(self) -> None:
        if jax.process_index() != 0:
            raise RuntimeError(f"process {jax.process_index()} cannot lead; process 0 does")
        self._last_announced = time.monotonic()

    def announce(self, kind: OrderKind, fields: dict[str, Any] | None = None,
                 arrays: dict[str, np.ndarray] | None = None) -> None:
        _broadcast(encode(Order(kind=kind, fields=fields or {}, arrays=arrays or {})))
        self._last_announced = time.monotonic()

    def announce_batch(self, kind: OrderKind, batch: TrainBatch, fields: dict[str, Any] | None = None) -> None:
        self.announce(kind, fields, batch_arrays(batch))

    def keep_alive(self) -> None:
        if time.monotonic() - self._last_announced >= KEEP_ALIVE_S:
            self.announce(OrderKind.IDLE)

    def agree(self, ok: bool) -> bool:
        return agree(ok)

    def breaks_job(self, error: BaseException) -> bool:
        # A collective failed: an order's broadcast, a train step's all-reduce, an Orbax barrier. So
        # they do when a process is gone (Gloo: "Connection closed by peer", at the next collective),
        # and after any such failure the processes are out of step: the job cannot go on.
        return isinstance(error, jax.errors.JaxRuntimeError)

    def trained(self, *, step: int, phase: str, metrics: dict[str, float]) -> None:
        log_trained(step=step, phase=phase, metrics=metrics)

    def quit(self) -> None:
        self.announce(OrderKind.QUIT)


def agree(ok: bool) -> bool:
    """Every process's ``ok``, and-ed: a collective, so each process calls it at the same point."""
    flags = multihost_utils.process_allgather(np.asarray([int(ok)], np.int32))
    return bool(np.all(flags))


def log_trained(*, step: int, phase: str, metrics: dict[str, float]) -> None:
    # Exact floats (JSON writes their repr), so that two processes' lines can be compared.
    logger.info("process %d of %d trained step %d (%s): loss %r, metrics %s", jax.process_index(),
                jax.process_count(), step, phase, metrics["loss"], json.dumps(metrics, sort_keys=True))


@dataclass(frozen=True)
class AnnouncedReference(ReferencePolicy):
    """The KL penalty's reference policy on the leader: its log-probabilities are a collective too."""

    lockstep: Lockstep = SINGLE_PROCESS

    def logprobs(self, batch: TrainBatch, *, temperature: float,
                 logits_chunk_tokens: int = DEFAULT_LOGITS_CHUNK_TOKENS,
                 micro_batch_tokens: int | None = None) -> jax.Array:
        self.lockstep.announce_batch(OrderKind.REFERENCE_LOGPROBS, batch, {
            "temperature": temperature, "logits_chunk_tokens": logits_chunk_tokens,
            "micro_batch_tokens": micro_batch_tokens})
        return super().logprobs(batch, temperature=temperature, logits_chunk_tokens=logits_chunk_tokens,
                                micro_batch_tokens=micro_batch_tokens)
