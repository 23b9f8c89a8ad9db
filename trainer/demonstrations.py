"""The SFT phase's demonstrations, asked of the producers: the trainer never imports environment code.

A run's environment is user code, and only the rollout workers, behind the
operator's allow-list, may import it (SECURITY.md). So the trainer sends a
task by name (``DEMONSTRATIONS_TASK_NAME``, on the rollout queue, as the
rollout feed sends its episode requests) for each SFT step's demonstrations,
and a producer appends its answer, a :class:`DemonstrationBatch` of chat
messages, to the run's demonstration stream. The trainer renders the messages
with its own prompt layout.

:meth:`DemonstrationFeed.next_batch` asks one step ahead, so the producer
makes step N+1's demonstrations while the trainer trains step N. It waits
with bounded blocking reads, running the caller's ``between_reads`` (the
trainer's heartbeat, which raises on a cancel or pause) after each, and says
in the log every ``warn_every_s`` that it is still waiting, so a deployment
without a rollout worker is never a silent hang. An answer with an error
fails the run with it (:class:`DemonstrationsFailedError`).

Like the rollout feed, it needs Redis and a Celery app to send tasks with,
never a model or an environment.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import redis
from celery import Celery
from pydantic import ValidationError

from tandem.contracts import (
    DEMONSTRATIONS_TASK_NAME,
    ROLLOUT_QUEUE,
    DemonstrationBatch,
    DemonstrationMessage,
    SchemaVersionError,
    demonstration_stream,
)
from trainer.checkpoints import step_rng

logger = logging.getLogger(__name__)


class DemonstrationsFailedError(RuntimeError):
    """A producer could not make a step's demonstrations; the message is the run's failure reason."""


def demonstration_seed(run_seed: int, step: int) -> int:
    """The seed of SFT ``step``'s demonstrations: the same for a resumed run as for an uninterrupted one."""
    return step_rng(run_seed, step).getrandbits(63)


class DemonstrationFeed:
    """One run's SFT demonstrations, step by step, from the producers; see the module docstring.

    ``steps``: the SFT steps of the run (nothing is asked beyond them).
    ``count``: demonstrations per step (``sft_batch_size``). ``tool_call_format``:
    the format the trainer's prompt layout writes tool calls in; producers
    write the demonstrations' calls in it. ``block_ms``: how long one read
    blocks. ``clock`` (monotonic seconds) times the waiting log; injectable for tests.
    """

    def __init__(self, *, redis_client: redis.Redis, celery_app: Celery, run_id: int, run_seed: int,
                 steps: int, count: int, tool_call_format: str, block_ms: int = 500,
                 warn_every_s: float = 60.0, ask_again_after_s: float = 120.0, give_up_after_s: float = 1800.0,
                 clock=time.monotonic):
        self._redis = redis_client
        self._celery = celery_app
        self._run_id = run_id
        self._run_seed = run_seed
        self._steps = steps
        self._count = count
        self._tool_call_format = tool_call_format
        self._block_ms = block_ms
        self._warn_every_s = warn_every_s
        # A request can be lost (a Redis that lost its data, a worker that hung on it): asked
        # again this often, and past the last bound the run fails rather than wait for ever.
        self._ask_again_after_s = ask_again_after_s
        self._give_up_after_s = give_up_after_s
        self._clock = clock
        self.stream = demonstration_stream(run_id)
        # Step -> ids of this feed's requests for it (asked again: more than one). Answers to any
        # other request (an earlier trainer's of this run, before a resume) are deleted unread.
        self._requests: dict[int, set[str]] = {}
        self._answers: dict[int, DemonstrationBatch] = {}
        # From the start: answers left in the stream are read (and dropped) too.
        self._last_entry_id = "0-0"

    def next_batch(self, step: int, *, waiting: AbstractContextManager | None = None,
                   between_reads: Callable[[], None] = lambda: None) -> list[list[DemonstrationMessage]]:
        """The demonstrations of SFT ``step`` (0-based) as chat messages; blocks until a producer answers.

        Asks for ``step + 1``'s too, so they are made while this step trains.
        ``waiting`` is entered for as long as it waits (the step's ``data_wait``
        stage); ``between_reads`` runs after every read and may raise to stop the run.

        Raises:
          DemonstrationsFailedError: the producer's answer is an error, or unreadable.
        """
        self._request(step)
        if step + 1 < self._steps:
            self._request(step + 1)
        if step not in self._answers:
            with waiting or nullcontext():
                started = last_said = last_asked = self._clock()
                while step not in self._answers:
                    self._read()
                    between_reads()
                    now = self._clock()
                    if step not in self._answers and now - started >= self._give_up_after_s:
                        raise DemonstrationsFailedError(
                            f"no producer answered the requests for SFT step {step + 1}'s demonstrations in "
                            f"{now - started:.0f}s (is a rollout worker consuming {ROLLOUT_QUEUE!r}?)")
                    if step not in self._answers and now - last_asked >= self._ask_again_after_s:
                        last_asked = now
                        self._request(step, again=True)
                    if step not in self._answers and now - last_said >= self._warn_every_s:
                        last_said = now
                        logger.warning(
                            "run %s: no producer has answered the request for SFT step %d's demonstrations "
                            "in %.0fs; is a rollout worker (tandem worker) running and consuming %r?",
                            self._run_id, step + 1, now - started, ROLLOUT_QUEUE)
        batch = self._answers.pop(step)
        # Answered: a late duplicate (of a redelivered task) matches no request any more.
        del self._requests[step]
        if batch.error:
            # Named as the run's steps are shown: the first one trained is step 1.
            raise DemonstrationsFailedError(f"the demonstrations of SFT step {step + 1} failed: {batch.error}")
        return batch.messages

    def _request(self, step: int, *, again: bool = False) -> None:
        if step in self._requests and not again:
            return
        request_id = uuid.uuid4().hex
        self._requests.setdefault(step, set()).add(request_id)
        self._celery.send_task(DEMONSTRATIONS_TASK_NAME, kwargs={
            "run_id": self._run_id, "step": step, "count": self._count,
            "seed": demonstration_seed(self._run_seed, step), "tool_call_format": self._tool_call_format,
            "request_id": request_id,
        }, queue=ROLLOUT_QUEUE)

    def _read(self) -> None:
        """One blocking read of the stream; answers to this feed's requests are kept, the rest deleted."""
        read = self._redis.xread({self.stream: self._last_entry_id}, block=self._block_ms, count=16) or []
        for _, entries in read:
            for entry_id, fields in entries:
                self._last_entry_id = entry_id
                # Read once: the answer (or a duplicate of a redelivered task) is not needed again.
                self._redis.xdel(self.stream, entry_id)
                try:
                    batch = DemonstrationBatch.from_stream_fields(fields)
                except (SchemaVersionError, ValidationError, TypeError) as exc:
                    raise DemonstrationsFailedError(
                        f"a producer's demonstrations could not be read (a producer of another version?): {exc}"
                    ) from exc
                if batch.request_id in self._requests.get(batch.step, ()) and batch.step not in self._answers:
                    self._answers[batch.step] = batch
