"""tandem.sdk.client against a real platform: runs, environments, projects, metrics and their stream."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from tandem.cli.stack import LocalStack
from tandem.contracts import EvaluationProgress, evaluation_progress_key
from tandem.runtime.local_ports import free_local_port
from tandem.sdk.client import (
    LoginMissing,
    RunWaitTimeout,
    StepMetrics,
    TandemAPIError,
    TandemClient,
    save_login,
)
from tests.platform.builders import step_event
from tests.platform.trajectory_builders import calculator_sample
from trainer.platform_client import PlatformClient

from .conftest import Platform, Trainer, wait_until


def test_a_run_is_created_shown_listed_and_cancelled(client):
    run = client.runs.create(environment="calculator", config={"rl_steps": 3}, name="sdk: create")

    assert run.status == "queued" and run.name == "sdk: create" and run.environment == "calculator"
    assert run.config["rl_steps"] == 3 and run.config["rollout"]["group_size"] == 8  # defaults fill the rest
    assert run.total_steps == run.config["sft_steps"] + 3
    assert run.urls["websocket"].endswith(f"/ws/runs/{run.id}/")
    assert client.runs.get(run.id) == run
    assert run.id in {listed.id for listed in client.runs.list(status="queued")}

    cancelled = client.runs.cancel(run.id)

    assert cancelled.status == "cancelled" and cancelled.ended
    assert run.id in {listed.id for listed in client.runs.list(status="cancelled")}
    assert run.id not in {listed.id for listed in client.runs.list(status="queued")}


def test_a_model_directory_is_evaluated_in_a_run_that_trains_nothing_and_reports_its_progress(
        client, smollm2, platform_redis):
    run = client.runs.evaluate_model(smollm2, environment="calculator-chat", evaluation={"tasks": 4},
                                     config={"sampling": {"max_new_tokens": 16}, "rl_steps": 9})

    # Evaluation-only whatever the other config says: no SFT or RL step.
    assert (run.config["sft_steps"], run.config["rl_steps"], run.environment) == (0, 0, "calculator-chat")
    assert run.config["model"]["hf_checkpoint"] == run.config["model"]["tokenizer"] == str(smollm2)
    assert run.config["evaluation"]["tasks"] == 4 and run.config["sampling"]["max_new_tokens"] == 16
    assert run.name == f"evaluation of {smollm2.name}"
    key = evaluation_progress_key(run.id)
    platform_redis.delete(key)  # the same run id in an earlier test database
    try:
        assert client.runs.evaluation_progress(run.id) == []
        for index, received, status in ((1, 3, "running"), (0, 8, "complete")):
            platform_redis.hset(key, str(index), EvaluationProgress(
                evaluation=index, policy_version=index, episodes_expected=8, episodes_received=received,
                status=status).model_dump_json())

        progress = client.runs.evaluation_progress(run.id)
    finally:
        platform_redis.delete(key)
        client.runs.cancel(run.id)

    assert [(item.evaluation, item.episodes_received, item.status, item.fraction) for item in progress] == [
        (0, 8, "complete", 1.0), (1, 3, "running", 0.375)]


def test_cancelling_an_ended_run_is_a_conflict(client):
    run = client.runs.cancel(client.runs.create(environment="calculator").id)

    with pytest.raises(TandemAPIError) as error:
        client.runs.cancel(run.id)

    assert error.value.status_code == 409 and error.value.is_platform_error
    assert error.value.code and error.value.message


def test_pause_resume_and_clone(client, trainer):
    # Claimable once its environment passed a probe: the stack's own may not have ended yet on a busy machine.
    assert client.environments.probe("calculator", wait_s=90)["status"] == "passed"
    run = client.runs.create(environment="calculator", config={"rl_steps": 5, "seed": 7}, name="original")
    trainer.claim(run.id)
    assert client.runs.get(run.id).status == "running"

    assert client.runs.pause(run.id).status == "paused"
    assert client.runs.resume(run.id).status == "queued"

    clone = client.runs.clone(run.id, config={"rl_steps": 9}, name="the clone")
    tagged = client.runs.annotate(clone.id, tags=["lr-sweep", "baseline"], notes="the clone")
    assert (tagged.tags, tagged.notes) == (["lr-sweep", "baseline"], "the clone")
    assert client.runs.annotate(clone.id, notes="only the notes").tags == ["lr-sweep", "baseline"]

    assert clone.id != run.id and clone.status == "queued" and clone.name == "the clone"
    assert clone.config == {**client.runs.get(run.id).config, "rl_steps": 9}
    client.runs.cancel(run.id)
    client.runs.cancel(clone.id)


def test_listing_iterates_every_page(client):
    created = [client.runs.create(environment="calculator", name=f"page {index}").id for index in range(5)]

    listed = [run.id for run in client.runs.list(page_size=2)]

    assert len(listed) == len(set(listed)) >= 5
    # Newest first, across page boundaries.
    assert [run_id for run_id in listed if run_id in created] == sorted(created, reverse=True)
    for run_id in created:
        client.runs.cancel(run_id)


def test_a_bad_config_raises_the_platforms_error_naming_the_field(client):
    with pytest.raises(TandemAPIError) as error:
        client.runs.create(environment="calculator", config={"rollout": {"group_size": 1}})

    assert error.value.status_code == 400 and error.value.code == "invalid"
    assert list(error.value.fields) == ["config.rollout.group_size"]
    assert "config.rollout.group_size" in error.value.message


def test_a_missing_run_and_a_bad_token_are_api_errors(platform, client):
    with pytest.raises(TandemAPIError) as missing:
        client.runs.get(10**9)
    with TandemClient(platform.url, "not-a-token") as stranger, pytest.raises(TandemAPIError) as refused:
        list(stranger.runs.list())

    assert missing.value.status_code == 404 and missing.value.code == "not_found"
    assert refused.value.status_code == 401 and refused.value.is_platform_error


def test_projects_and_environments(platform, client):
    projects = list(client.projects.list())
    assert [(project.id, project.name) for project in projects] == [(platform.credentials.project_id, "demo")]

    registered = client.environments.register(
        "sdk-calculator", entrypoint="environments.builtin.calculator:CalculatorEnvironment",
        settings={"max_operand": 9},
    )

    assert registered.name == "sdk-calculator" and registered.project == platform.credentials.project_id
    assert registered.kind == "python" and registered.settings == {"max_operand": 9}
    assert registered.latest_version["number"] == 1 and registered.id > 0
    names = [environment.name for environment in client.environments.list()]
    assert "sdk-calculator" in names and "calculator" in names
    with pytest.raises(TandemAPIError) as duplicate:
        client.environments.register(
            "sdk-calculator", entrypoint="environments.builtin.calculator:CalculatorEnvironment")
    assert duplicate.value.status_code == 409


def test_probing_returns_the_workers_report(client):
    probe = client.environments.probe("calculator", wait_s=90)

    assert probe["status"] == "passed", probe
    assert [check["name"] for check in probe["checks"]][:2] == ["url", "load"]
    assert all(check["status"] in {"passed", "skipped"} for check in probe["checks"])


def test_probing_an_unknown_environment_names_it(client):
    with pytest.raises(TandemAPIError) as error:
        client.environments.probe("no-such-environment")

    assert error.value.status_code == 404 and "no-such-environment" in error.value.message


def test_trajectories_are_listed_filtered_and_read_with_their_turns(client, trainer):
    run = client.runs.create(environment="calculator")
    samples = [calculator_sample(run.id, step=1, reward=1.0),
               calculator_sample(run.id, step=2, reward=0.0, why="worst"),
               calculator_sample(run.id, step=2, reward=0.0, status="failed", why="failed")]
    # As the trainer posts them (trainer.platform_client), for a run it holds.
    trainer.claim(run.id)
    poster = PlatformClient(str(trainer.http.base_url), trainer.http.headers["Authorization"].split()[1],
                            trainer_name=trainer.worker)
    poster.post_trajectory_samples(run.id, samples)
    poster.close()

    listed = list(client.runs.trajectories(run.id, page_size=2))
    failed = list(client.runs.trajectories(run.id, status="failed"))
    rewarded = list(client.runs.trajectories(run.id, min_reward=0.5))
    detail = client.runs.trajectory(run.id, samples[0].trajectory_id)

    assert sorted(item["id"] for item in listed) == sorted(sample.trajectory_id for sample in samples)
    assert [item["id"] for item in failed] == [samples[2].trajectory_id]
    assert [item["id"] for item in rewarded] == [samples[0].trajectory_id]
    assert detail["reward"] == 1.0 and [turn["role"] for turn in detail["turns"]][0] == "prompt"
    assert any(span["trained"] for turn in detail["turns"] for span in turn["spans"])
    with pytest.raises(TandemAPIError) as missing:
        client.runs.trajectory(run.id, "no-such-trajectory")
    assert missing.value.status_code == 404
    client.runs.cancel(run.id)


def test_metrics_are_read_by_step_after_a_cursor(client, trainer):
    run = client.runs.create(environment="calculator")
    trainer.post_steps(run.id, range(1, 4))

    steps = list(client.runs.metrics(run.id))
    only_loss = list(client.runs.metrics(run.id, names=["loss"], after_step=1))

    assert [step.step for step in steps] == [1, 2, 3]
    expected = step_event(run.id, 2)
    assert steps[1].values["loss"] == pytest.approx(expected["loss"])
    assert steps[1].values["reward_mean"] == pytest.approx(expected["reward_mean"])
    assert [(step.step, step.values) for step in only_loss] == [
        (2, {"loss": pytest.approx(1 / 3)}), (3, {"loss": pytest.approx(1 / 4)})]
    client.runs.cancel(run.id)


def test_waiting_times_out_on_a_live_run_and_returns_once_it_ends(client):
    run = client.runs.create(environment="calculator")

    with pytest.raises(RunWaitTimeout) as timeout:
        client.runs.wait(run.id, timeout=0.3, poll_interval_s=0.1)
    assert timeout.value.run.status == "queued"

    timer = threading.Timer(0.5, client.runs.cancel, args=[run.id])
    timer.start()
    ended = client.runs.wait(run.id, timeout=20, poll_interval_s=0.1)
    timer.join()

    assert ended.status == "cancelled"


class Collector:
    """Consumes a stream in a thread, as a script's loop would."""

    def __init__(self, iterator):
        self.steps: list[StepMetrics] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._consume, args=(iterator,), daemon=True)
        self.thread.start()

    def _consume(self, iterator) -> None:
        try:
            for step in iterator:
                self.steps.append(step)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc

    def step_numbers(self) -> list[int]:
        return [step.step for step in self.steps]


def test_the_stream_yields_recorded_steps_then_live_ones_then_ends_with_the_run(client, trainer):
    run = client.runs.create(environment="calculator")
    trainer.post_steps(run.id, range(1, 4))

    stream = Collector(client.runs.stream_metrics(run.id, idle_check_s=30))
    wait_until(lambda: len(stream.steps) == 3, what="the backfilled steps")
    trainer.post_steps(run.id, [4])
    trainer.post_steps(run.id, [5, 6])
    wait_until(lambda: len(stream.steps) == 6, what="the live steps")
    client.runs.cancel(run.id)
    stream.thread.join(timeout=20)

    assert not stream.thread.is_alive(), "the stream did not end with the run"
    assert stream.error is None
    assert stream.step_numbers() == [1, 2, 3, 4, 5, 6]
    assert stream.steps[4].values["reward_mean"] == pytest.approx(step_event(run.id, 5)["reward_mean"])


def test_the_stream_loses_no_step_across_a_reconnect(platform, client, trainer, tmp_path):
    """Steps recorded while the client's server is down come by backfill once it is back."""
    run = client.runs.create(environment="calculator")
    trainer.post_steps(run.id, [1])
    stream = Collector(client.runs.stream_metrics(run.id, names=["loss"], idle_check_s=30,
                                                  reconnect_max_s=0.5))
    wait_until(lambda: stream.step_numbers() == [1], what="step 1")

    # A second web server on the same database and Redis keeps the platform up
    # while the one the client follows is down.
    other = LocalStack(replace(platform.stack.config, port=free_local_port(), var_dir=tmp_path))
    other.start_web()
    try:
        web = platform.stack.processes.pop("web")
        web.terminate()
        web.wait(timeout=20)
        with TandemClient(other.config.platform_url, platform.credentials.user_token) as other_client:
            other_trainer = Trainer(Platform(other, platform.credentials), other_client)
            other_trainer.holding = trainer.holding  # the same trainer, through the other server
            other_trainer.post_steps(run.id, [2, 3])
            other_trainer.http.close()
        platform.stack.start_web()
        wait_until(lambda: len(stream.steps) == 3, what="the steps recorded while disconnected")
        trainer.post_steps(run.id, [4])
        wait_until(lambda: len(stream.steps) == 4, what="a live step after the reconnect")
    finally:
        client.runs.cancel(run.id)
        other.stop()
    stream.thread.join(timeout=20)

    assert not stream.thread.is_alive() and stream.error is None
    assert stream.step_numbers() == [1, 2, 3, 4]
    assert all(set(step.values) == {"loss"} for step in stream.steps)


def test_a_script_connects_with_the_saved_login_unless_the_environment_says_otherwise(
    platform, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("TANDEM_URL", raising=False)
    monkeypatch.delenv("TANDEM_TOKEN", raising=False)
    with pytest.raises(LoginMissing):
        TandemClient.from_login()

    save_login(platform.url, platform.credentials.user_token)
    with TandemClient.from_login() as saved:
        assert [project.name for project in saved.projects.list()] == ["demo"]

    monkeypatch.setenv("TANDEM_TOKEN", "not-a-token")
    with TandemClient.from_login() as overridden, pytest.raises(TandemAPIError) as refused:
        list(overridden.projects.list())
    assert refused.value.status_code == 401


def test_polled_progress_keeps_the_last_known_while_the_server_is_down_and_ends_with_the_run(
    platform, client, trainer
):
    """What `tandem up --demo` shows: a yield per poll, the web server's restart ridden out."""
    run = client.runs.create(environment="calculator")
    trainer.post_steps(run.id, range(1, 4))
    polls = client.runs.poll_progress(run.id, poll_interval_s=0)
    first = next(polls)
    assert first.reachable and (first.step, first.run.status) == (3, "running")
    assert first.latest["reward_mean"] == pytest.approx(step_event(run.id, 3)["reward_mean"])

    web = platform.stack.processes.pop("web")
    web.terminate()
    web.wait(timeout=20)
    try:
        down = next(polls)
        assert not down.reachable and (down.step, down.run.status) == (3, "running")
        assert down.latest == first.latest
    finally:
        platform.stack.start_web()
    trainer.post_steps(run.id, [4])
    back = next(polls)
    assert back.reachable and back.step == 4
    client.runs.cancel(run.id)
    rest = list(polls)
    assert rest[-1].reachable and rest[-1].run.status == "cancelled"
    assert not any(progress.run.ended for progress in rest[:-1])
