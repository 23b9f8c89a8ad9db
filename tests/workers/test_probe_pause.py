"""A run pinned to a version the platform paused starts no episode; a lifted pause lets it through."""

from __future__ import annotations

import pytest

from environment_registry.builtin import CALCULATOR
from tandem.contracts import RunSpec, environment_paused_key, run_spec_key
from workers.producer import EnvironmentPausedError, RunNotReadyError, produce


def test_a_paused_version_stops_the_producer_before_any_episode(redis_client, redis_url, run_id):
    version_id = run_id  # any id no other test uses
    environment = CALCULATOR.model_copy(update={"version": 3, "version_id": version_id})
    spec = RunSpec(run_id=run_id, config={}, environment=environment)
    redis_client.set(run_spec_key(run_id), spec.model_dump_json())
    redis_client.set(environment_paused_key(version_id), "Health check probe 9 failed: reset: refused")
    try:
        with pytest.raises(EnvironmentPausedError) as paused:
            produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)
        assert str(paused.value) == (
            f"run {run_id}: environment calculator@3 is unhealthy: "
            "Health check probe 9 failed: reset: refused"
        )
        # A retryable error: the task backs off and tries again, as for a run not ready yet.
        assert isinstance(paused.value, RunNotReadyError)

        redis_client.delete(environment_paused_key(version_id))
        with pytest.raises(RunNotReadyError) as not_ready:
            produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)
        # Past the pause: it now waits for the run's first weights instead.
        assert not isinstance(not_ready.value, EnvironmentPausedError)
    finally:
        redis_client.delete(run_spec_key(run_id), environment_paused_key(version_id))
