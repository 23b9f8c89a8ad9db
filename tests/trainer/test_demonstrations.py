"""The trainer's demonstration feed against a real Redis and the real producer code; no model, no JAX.

Celery is replaced by a courier that runs the demonstrations task's body (workers.demonstrations)
when it is sent, or holds the requests back, as a deployment without a free rollout worker would.
"""

from __future__ import annotations

import logging

import pytest

from tandem.configs.run import RunConfig
from tandem.contracts import (
    DEMONSTRATIONS_TASK_NAME,
    ROLLOUT_QUEUE,
    DemonstrationBatch,
    EnvironmentSpec,
    RunSpec,
    demonstration_stream,
    run_spec_key,
)
from trainer.demonstrations import DemonstrationFeed, DemonstrationsFailedError
from workers.demonstrations import produce_demonstrations

CALCULATOR = "environments.builtin.calculator:CalculatorEnvironment"


class _Courier:
    """Stands in for Celery: records every task sent and, while ``delivering``, runs it at once."""

    def __init__(self, redis_url: str):
        self.redis_url = redis_url
        self.sent: list[tuple[str, dict, str]] = []
        self.delivering = True
        self.held: list[dict] = []

    def send_task(self, name, *, kwargs, queue):
        self.sent.append((name, kwargs, queue))
        if self.delivering:
            produce_demonstrations(redis_url=self.redis_url, **kwargs)
        else:
            self.held.append(kwargs)

    def deliver_held(self) -> None:
        while self.held:
            produce_demonstrations(redis_url=self.redis_url, **self.held.pop(0))

    @property
    def steps_requested(self) -> list[int]:
        return [kwargs["step"] for _, kwargs, _ in self.sent]


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def run_spec(redis_client, run_id):
    def write(entrypoint: str = CALCULATOR) -> None:
        spec = RunSpec(run_id=run_id, config=RunConfig(),
                       environment=EnvironmentSpec(name="demo-env", kind="python", entrypoint=entrypoint))
        redis_client.set(run_spec_key(run_id), spec.model_dump_json())

    write()
    yield write
    redis_client.delete(run_spec_key(run_id), demonstration_stream(run_id))


def _feed(redis_client, redis_url, run_id, *, steps=3, clock=None):
    courier = _Courier(redis_url)
    feed = DemonstrationFeed(redis_client=redis_client, celery_app=courier, run_id=run_id, run_seed=7,
                             steps=steps, count=2, tool_call_format="hermes", block_ms=10,
                             warn_every_s=60, clock=clock or _Clock())
    return feed, courier


def test_each_sft_step_is_asked_of_the_producers_one_step_ahead(redis_client, redis_url, run_id, run_spec):
    feed, courier = _feed(redis_client, redis_url, run_id, steps=3)

    first = feed.next_batch(0)
    assert courier.steps_requested == [0, 1]  # step 1's are made while step 0 trains
    assert {(name, queue) for name, _, queue in courier.sent} == {(DEMONSTRATIONS_TASK_NAME, ROLLOUT_QUEUE)}
    assert len(first) == 2 and first[0][0].role == "user"
    feed.next_batch(1)
    feed.next_batch(2)
    assert courier.steps_requested == [0, 1, 2]  # nothing beyond the last SFT step
    assert redis_client.xlen(demonstration_stream(run_id)) == 0  # each answer is deleted once read


def test_a_resumed_run_gets_the_same_demonstrations_for_a_step(redis_client, redis_url, run_id, run_spec):
    first, _ = _feed(redis_client, redis_url, run_id)
    resumed, _ = _feed(redis_client, redis_url, run_id)

    step_2 = first.next_batch(2)
    assert resumed.next_batch(2) == step_2
    assert first.next_batch(1) != step_2  # other steps, other demonstrations


def test_a_producers_error_fails_the_run_with_its_reason(redis_client, redis_url, run_id, run_spec):
    run_spec("tests.workers.demonstration_environments:RaisingDemonstrationsEnvironment")
    feed, _ = _feed(redis_client, redis_url, run_id)

    with pytest.raises(DemonstrationsFailedError) as failed:
        feed.next_batch(0)
    assert str(failed.value) == ("the demonstrations of SFT step 1 failed: environment demo-env: "
                                 "demonstrations() raised RuntimeError: the demonstrator is broken")


def test_answers_to_requests_of_an_earlier_trainer_are_never_trained_on(redis_client, redis_url, run_id, run_spec):
    # An earlier trainer of the run asked for step 0 and died; its producer answers with an error now.
    stale = DemonstrationBatch(run_id=run_id, step=0, request_id="an-earlier-trainer", error="it was broken then")
    redis_client.xadd(demonstration_stream(run_id), stale.to_stream_fields())
    feed, courier = _feed(redis_client, redis_url, run_id)
    courier.delivering = False
    reads = []

    def between_reads():
        reads.append(len(reads))
        if len(reads) == 3:
            courier.deliver_held()

    messages = feed.next_batch(0, between_reads=between_reads)

    assert len(messages) == 2 and len(reads) >= 3
    assert redis_client.xlen(demonstration_stream(run_id)) <= 1  # the stale one is gone; step 1's may wait


class _Cancelled(Exception):
    pass


def test_a_trainer_without_producers_keeps_its_heartbeat_and_says_that_it_waits(
    redis_client, redis_url, run_id, run_spec, caplog
):
    clock = _Clock()
    feed, courier = _feed(redis_client, redis_url, run_id, clock=clock)
    courier.delivering = False
    heartbeats = []

    def heartbeat():
        # The heartbeat learns of a cancel (after 150 s of waiting here), and raises.
        heartbeats.append(clock.now)
        clock.now += 30
        if clock.now > 150:
            raise _Cancelled()

    with caplog.at_level(logging.WARNING, logger="trainer.demonstrations"), pytest.raises(_Cancelled):
        feed.next_batch(0, between_reads=heartbeat)

    assert len(heartbeats) == 6
    waiting = [record.getMessage() for record in caplog.records]
    assert len(waiting) == 2  # once a minute, not once a read
    assert "no producer has answered the request for SFT step 1's demonstrations in 60s" in waiting[0]
    assert "tandem worker" in waiting[0]


def test_a_request_no_producer_answered_is_asked_again_and_its_answer_trains(
    redis_client, redis_url, run_id, run_spec
):
    """A request can be lost (a Redis restarted without its data, a hung worker): before, the trainer waited for ever."""
    clock = _Clock()
    feed, courier = _feed(redis_client, redis_url, run_id, steps=1, clock=clock)
    courier.delivering = False

    def heartbeat():
        clock.now += 50
        if clock.now >= 150:
            courier.held.clear()  # the first request was lost: only the second is delivered
            courier.delivering = True

    batch = feed.next_batch(0, between_reads=heartbeat)

    assert courier.steps_requested == [0, 0]
    assert len(batch) == 2


def test_a_trainer_no_producer_ever_answers_fails_the_run_saying_so(redis_client, redis_url, run_id, run_spec):
    clock = _Clock()
    feed, courier = _feed(redis_client, redis_url, run_id, steps=1, clock=clock)
    courier.delivering = False

    def heartbeat():
        clock.now += 300

    with pytest.raises(DemonstrationsFailedError, match="no producer answered the requests for SFT step 1"):
        feed.next_batch(0, between_reads=heartbeat)
    assert len(courier.steps_requested) > 1  # asked again before giving up
