"""An ended run's inference engines leave the worker: weights, KV cache and thread, as soon as the run stops."""

from __future__ import annotations

import gc

import jax
import pytest

from tandem.contracts import run_stop_key
from tests.polling import poll_until
from workers.engine_release import (
    release_stopped_engines,
    start_engine_release,
    stop_engine_release,
)
from workers.producer import held_runtime_runs, load_run_spec, produce, runtime_for

from .test_producer import CONFIG, _publish_policy

CALCULATOR = "environments.builtin.calculator:CalculatorEnvironment"


def _cache_arrays() -> list[jax.Array]:
    """The live arrays shaped as a KV cache layer of CONFIG's engines: [slots, KV heads, cache length, head dim]."""
    gc.collect()
    model = CONFIG.model
    head_dim = model.d_model // model.num_heads
    return [array for array in jax.live_arrays()
            if array.ndim == 4 and array.shape[1:] == (model.num_heads, model.max_seq_len + 1, head_dim)]


@pytest.fixture
def served_run(redis_client, redis_url, run_id):
    """A run one rollout task has served: its engine stays warm in this process."""
    # Runs that earlier tests in this pytest process left warm are stopped first: producing this one
    # would otherwise evict the oldest of them, freeing as many arrays as it adds.
    for earlier in held_runtime_runs():
        redis_client.set(run_stop_key(earlier), "1")
    release_stopped_engines(redis_client)
    assert held_runtime_runs() == []
    _publish_policy(redis_client, run_id, "calculator", CALCULATOR)
    before = len(_cache_arrays())
    assert produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1).episodes == 3
    assert run_id in held_runtime_runs() and len(_cache_arrays()) > before
    yield run_id
    redis_client.set(run_stop_key(run_id), "1")
    release_stopped_engines(redis_client)


def test_a_stopped_runs_engine_is_closed_and_its_arrays_freed(redis_client, served_run):
    with_engine = len(_cache_arrays())
    assert release_stopped_engines(redis_client) == []  # still running: kept warm for its next task
    assert served_run in held_runtime_runs()

    redis_client.set(run_stop_key(served_run), "1")
    assert release_stopped_engines(redis_client) == [served_run]
    assert served_run not in held_runtime_runs()
    # Every layer's keys and values of its cache are gone from the process.
    freed = with_engine - len(_cache_arrays())
    assert freed >= 2 * CONFIG.model.num_layers


def test_an_engine_a_task_still_uses_is_released_only_once_the_task_is_done(redis_client, redis_url, served_run):
    spec = load_run_spec(redis_client, served_run)
    with runtime_for(redis_url, spec) as runtime:
        redis_client.set(run_stop_key(served_run), "1")
        assert release_stopped_engines(redis_client) == []
        assert runtime.refresh_weights(force=True) == 7  # the task's engine still works
    assert release_stopped_engines(redis_client) == [served_run]


def test_the_workers_releasing_thread_closes_it_without_a_call(redis_client, redis_url, served_run):
    start_engine_release(redis_url=redis_url, interval_s=0.1)
    try:
        redis_client.set(run_stop_key(served_run), "1")
        poll_until(lambda: served_run not in held_runtime_runs(), timeout_s=60,
                   what="the releasing thread to close the stopped run's engine")
    finally:
        stop_engine_release()
