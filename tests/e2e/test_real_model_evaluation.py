"""An evaluation-only run of SmolLM2-135M-Instruct as ``make models`` imported it: no training, one evaluation.

The run is created as a user creates one, with ``client.runs.evaluate_model``
(what ``tandem eval create --model`` calls): the model directory under the
operator's model roots, ``sft_steps`` and ``rl_steps`` 0, an evaluation
section. Greedy sampling makes the evaluation a function of the model and the
held-out tasks alone, so two such runs must agree on every metric and on every
token of every episode, read back from the platform's trajectory samples.
"""

from __future__ import annotations

import pytest

from tandem.sdk.client import TandemClient
from tests.e2e.conftest import private_stack, run_ended, user_api

EVALUATION = {"tasks": 4, "samples_per_task": 2, "pass_k": [1, 2], "temperature": 0}
EPISODES = EVALUATION["tasks"] * EVALUATION["samples_per_task"]
# Small limits keep an episode to a few decoding calls on a CPU; a Hermes tool call is about 30 tokens.
# An engine of as many rows as the evaluation has episodes (not the default, sized for training).
# Every episode of the evaluation is sent to the trajectory browser (8 < 16), so all can be compared.
RUN_CONFIG = {"model": {"max_seq_len": 512}, "sampling": {"max_new_tokens": 40, "inference_slots": EPISODES},
              "rollout": {"max_turns": 2}, "trajectory_samples_per_step": 16}


# Two runs of a real model, each loading it and compiling its engine on a CPU: longer than the
# suite's default limit on a loaded machine. A guard against a hang, not a measure of speed.
@pytest.mark.timeout(1800)
def test_an_evaluation_only_run_of_the_real_model_evaluates_it_once_and_reproducibly(tmp_path, smollm2):
    # A stack of its own with one producer: the real-model lock then covers all the memory the model
    # takes (its trainer and its engine), and none of it stays in the session's stack afterwards.
    with private_stack(tmp_path, workers=1, log_lines=40) as local:
        credentials = local.prepare()
        local.start(credentials)
        outcomes = [_evaluated(local, credentials, smollm2, attempt) for attempt in range(2)]

    (first, first_episodes), (second, second_episodes) = outcomes

    def without_cost(metrics: dict) -> dict:
        return {name: value for name, value in metrics.items() if name != "wall_s"}

    assert without_cost(first.metrics) == without_cost(second.metrics)
    assert first.intervals == second.intervals
    # The model really answered: every episode has a policy turn with tokens of its own.
    for episode in first_episodes:
        assert any(turn["role"] == "policy" and any(span["trained"] for span in turn["spans"])
                   for turn in episode["turns"]), episode
    # Tokens, texts and outcomes are the same to the last token. Log-probabilities agree to float
    # precision only: which prompts share a prefill or a decode chunk depends on when the environment
    # answered, and a different padded shape sums a row's dot products in another order.
    assert _without_logprobs(first_episodes) == _without_logprobs(second_episodes)
    first_logprobs, second_logprobs = _logprobs(first_episodes), _logprobs(second_episodes)
    assert len(first_logprobs) == len(second_logprobs) > 0
    assert second_logprobs == pytest.approx(first_logprobs, abs=1e-3)


def _evaluated(local, credentials, smollm2, attempt: int) -> tuple:
    """One evaluation-only run of the imported model: its evaluation, and its episodes in order."""
    api = user_api(local, credentials)
    with TandemClient(local.config.platform_url, credentials.user_token, timeout=30) as client:
        created = client.runs.evaluate_model(
            smollm2.resolve(), environment="calculator-chat", evaluation=EVALUATION, config=RUN_CONFIG,
            project=credentials.project_id, name=f"SmolLM2 evaluated as imported ({attempt})")
        assert (created.config["sft_steps"], created.config["rl_steps"]) == (0, 0)
        assert created.config["model"]["hf_checkpoint"] == str(smollm2.resolve())
        ended = run_ended(local, api, created.id, timeout_s=1500)
        assert ended["status"] == "finished", ended["status_reason"]
        assert ended["trainer_step"] == 0  # nothing trained

        (evaluation,) = client.runs.evaluations(created.id)
    assert (evaluation.index, evaluation.status, evaluation.episodes) == (0, "complete", EPISODES), \
        evaluation.reason
    assert evaluation.environment.startswith("calculator-chat@") and evaluation.temperature == 0
    assert len(evaluation.trajectory_ids) == EPISODES
    return evaluation, _episodes_in_order(api, created.id, evaluation.trajectory_ids)


def _without_logprobs(episodes: list[dict]) -> list[dict]:
    return [{**episode, "turns": [{**turn, "spans": [{name: value for name, value in span.items() if name != "logprobs"}
                                                    for span in turn["spans"]]}
                                  for turn in episode["turns"]]}
            for episode in episodes]


def _logprobs(episodes: list[dict]) -> list[float]:
    return [logprob for episode in episodes for turn in episode["turns"] for span in turn["spans"]
            for logprob in span.get("logprobs") or []]


def _episodes_in_order(api, run_id: int, trajectory_ids: list[str]) -> list[dict]:
    """The run's sampled evaluation episodes in the report's order (task, then sample), without what
    names the run: their outcome and every turn's text, tokens and loss mask spans."""
    listed = api.get(f"/api/runs/{run_id}/trajectories/", params={"purpose": "evaluation", "page_size": 500})
    assert listed.status_code == 200, listed.text
    sampled = {row["id"] for row in listed.json()["results"]}
    assert sampled == set(trajectory_ids), "every episode of the evaluation should have been sampled"
    episodes = []
    for trajectory_id in trajectory_ids:
        sample = api.get(f"/api/runs/{run_id}/trajectories/{trajectory_id}/").json()
        episodes.append({name: sample[name] for name in ("reward", "status", "failure_reason", "num_tokens",
                                                         "trained_tokens", "policy_versions", "turns")})
    return episodes
