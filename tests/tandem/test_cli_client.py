"""``tandem login``, ``tandem runs ...`` and ``tandem envs ...`` as real subprocesses against a real platform."""

from __future__ import annotations

import json
import os
import queue
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tandem.cli.stack import REPO_ROOT
from tandem.contracts import EvaluationProgress, evaluation_progress_key

from .conftest import wait_until


@pytest.fixture
def config_home(tmp_path) -> Path:
    return tmp_path / "config"


@pytest.fixture
def tandem(platform, config_home):
    """``tandem <args>`` with the platform given by TANDEM_URL/TANDEM_TOKEN (unless ``login=False``)."""

    def run(*args: str, login: bool = True, env: dict[str, str] | None = None, timeout: float = 60,
            raw: bool = False):
        # raw: bytes as written (text mode would turn a progress bar's \r into \n).
        return subprocess.run([sys.executable, "-m", "tandem.cli", *args], cwd=REPO_ROOT,
                              env=_env(platform, config_home, login=login, extra=env),
                              capture_output=True, text=not raw, timeout=timeout)

    return run


def _env(platform, config_home: Path, *, login: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("TANDEM_URL", "TANDEM_TOKEN")}
    env["XDG_CONFIG_HOME"] = str(config_home)
    if login:
        env["TANDEM_URL"] = platform.url
        env["TANDEM_TOKEN"] = platform.credentials.user_token
    env.update(extra or {})
    return env


def test_login_saves_url_and_token_readable_by_the_owner_only(tandem, platform, config_home):
    logged_in = tandem("login", "--url", platform.url, "--token", platform.credentials.user_token, login=False)

    assert logged_in.returncode == 0, logged_in.stderr
    assert "projects: demo" in logged_in.stdout
    path = config_home / "tandem" / "config.json"
    assert json.loads(path.read_text()) == {"url": platform.url, "token": platform.credentials.user_token}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    listed = tandem("runs", "list", login=False)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("ID")
    # The environment wins over the saved login.
    overridden = tandem("runs", "list", login=False, env={"TANDEM_TOKEN": "not-a-token"})
    assert overridden.returncode == 1 and "401" in overridden.stderr


def test_a_wrong_token_is_not_saved(tandem, platform, config_home):
    result = tandem("login", "--url", platform.url, "--token", "not-a-token", login=False)

    assert result.returncode == 1 and "401" in result.stderr
    assert not (config_home / "tandem" / "config.json").exists()


def test_commands_without_a_login_say_how_to_log_in(tandem):
    result = tandem("runs", "list", login=False)

    assert result.returncode == 2 and "tandem login" in result.stderr


def test_runs_create_show_list_and_cancel(tandem, tmp_path):
    config_file = tmp_path / "run.json"
    config_file.write_text(json.dumps({"rl_steps": 4, "seed": 3}))

    created = tandem("runs", "create", "--env", "calculator", "--config", str(config_file),
                     "--set", "seed=11", "--set", "model.num_layers=1", "--name", "cli run", "--json")

    assert created.returncode == 0, created.stderr
    run = json.loads(created.stdout)
    assert run["status"] == "queued" and run["name"] == "cli run"
    assert (run["config"]["rl_steps"], run["config"]["seed"], run["config"]["model"]["num_layers"]) == (4, 11, 1)
    shown = tandem("runs", "show", str(run["id"]))
    assert shown.returncode == 0, shown.stderr
    assert f"run {run['id']}: cli run" in shown.stdout and '"rl_steps": 4' in shown.stdout
    queued = tandem("runs", "list", "--status", "queued")
    assert any(line.split()[:2] == [str(run["id"]), "queued"] for line in queued.stdout.splitlines())

    cancelled = tandem("runs", "cancel", str(run["id"]))

    assert cancelled.returncode == 0 and cancelled.stdout.strip() == f"run {run['id']} cancelled"
    listed = json.loads(tandem("runs", "list", "--status", "cancelled", "--json").stdout)
    assert run["id"] in [item["id"] for item in listed]
    again = tandem("runs", "cancel", str(run["id"]))
    assert again.returncode == 1 and "409" in again.stderr


def test_a_bad_config_is_reported_with_the_field(tandem):
    result = tandem("runs", "create", "--env", "calculator", "--set", "rollout.group_size=1")

    assert result.returncode == 1
    assert "config.rollout.group_size:" in result.stderr and "400 invalid" in result.stderr


def test_a_malformed_set_is_a_usage_error(tandem):
    result = tandem("runs", "create", "--env", "calculator", "--set", "rollout.group_size")

    assert result.returncode == 2 and "expected key=value" in result.stderr


def test_runs_watch_prints_progress_until_the_run_finishes(tandem, platform, client, trainer):
    run = client.runs.create(environment="calculator", config={"sft_steps": 0, "rl_steps": 4})
    trainer.claim(run.id)
    watch = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "runs", "watch", str(run.id), "--every-s", "0", "--poll-s", "1"],
        cwd=REPO_ROOT, env=_env(platform, Path("/nonexistent"), login=True),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        # The watcher first shows the run as it is, then follows it.
        first = watch.stdout.readline()
        assert first.startswith(f"run {run.id} [running] step 0/4"), first
        for step in range(1, 5):
            trainer.post_steps(run.id, [step])
            time.sleep(0.2)
        wait_until(lambda: client.runs.get(run.id).trainer_step == 4, what="step 4 recorded")
        trainer.heartbeat(run.id, status="finished", trainer_step=4, policy_version=4)
        out, err = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()

    assert watch.returncode == 0, err
    lines = [first.strip(), *out.splitlines()]
    assert lines[-1].startswith(f"run {run.id} [finished] step 4/4 reward 0.400 success 0.20")
    assert any("[running] step 2/4 reward 0.200" in line for line in lines), lines


def test_runs_watch_of_a_cancelled_run_exits_non_zero(tandem, client):
    run = client.runs.cancel(client.runs.create(environment="calculator").id)

    result = tandem("runs", "watch", str(run.id))

    assert result.returncode == 1
    *_, progress, reason = result.stdout.splitlines()
    assert progress.startswith(f"run {run.id} [cancelled] step 0/")
    assert reason == f"run {run.id} cancelled: {run.status_reason}" and run.status_reason


def test_runs_watch_on_a_terminal_draws_one_bar(tandem, client, trainer):
    run = client.runs.create(environment="calculator", config={"sft_steps": 0, "rl_steps": 4})
    trainer.post_steps(run.id, [1, 2])
    client.runs.cancel(run.id)

    result = tandem("runs", "watch", str(run.id), "--tty", "yes", raw=True)

    output = result.stdout.decode()
    # Redrawn in place: one line break after the bar, one after the reason the run ended.
    assert output.count("\r") >= 2 and output.count("\n") == 2
    bar, reason = output.rsplit("\r", 1)[1].splitlines()
    assert bar.startswith(f"run {run.id} [cancelled] [############------------]  50% step 2/4 reward 0.200")
    assert reason.startswith(f"run {run.id} cancelled:")


def test_envs_register_list_and_probe(tandem):
    registered = tandem("envs", "register", "cli-calculator",
                        "--entrypoint", "environments.builtin.calculator:CalculatorEnvironment",
                        "--setting", "max_operand=9")
    assert registered.returncode == 0, registered.stderr
    assert registered.stdout.startswith("environment cli-calculator registered")
    assert registered.stdout.rstrip().endswith("version 1 is pending")

    listed = tandem("envs", "list", "--json")
    environments = {item["name"]: item for item in json.loads(listed.stdout)}
    assert environments["cli-calculator"]["latest_version"]["settings"] == {"max_operand": 9}
    table = tandem("envs", "list").stdout.splitlines()
    assert table[0].split() == ["NAME", "KIND", "PROJECT", "VERSION", "STATUS", "ENTRYPOINT"]
    assert any(line.split()[:2] == ["cli-calculator", "python"] for line in table)

    duplicate = tandem("envs", "register", "cli-calculator", "--entrypoint", "tests.workers.other:C")
    assert duplicate.returncode == 1 and "409" in duplicate.stderr

    # A worker runs the probe; the report lists every check. The calculator has a tool
    # that the registration did not declare, so the probe fails, naming the check.
    probe = tandem("envs", "probe", "cli-calculator", "--wait", "90")
    assert probe.returncode == 1, probe.stdout + probe.stderr
    lines = probe.stdout.splitlines()
    assert lines[0].endswith("of cli-calculator: failed")
    checks = {line.split()[0]: line.split()[1] for line in lines[1:]}
    assert checks["reset"] == "passed" and checks["tools"] == "failed" and checks["step"] == "skipped"
    assert "exposed but not declared" in probe.stdout


def test_envs_register_merges_a_tool_server_flag_with_its_fields(tandem, tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}]))
    calls = [{"name": "add", "arguments": {"a": 2, "b": 40}}]
    registered = tandem("envs", "register", "cli-mcp-sums", "--entrypoint", "tests.workers.mcp_task:SumTask",
                        "--tool-server", "arithmetic", "--field", f"tool_server.probe_calls={json.dumps(calls)}",
                        "--tools", str(tools))
    assert registered.returncode == 0, registered.stderr
    listed = {item["name"]: item for item in json.loads(tandem("envs", "list", "--json").stdout)}
    assert listed["cli-mcp-sums"]["latest_version"]["tool_server"] == {
        "command": "arithmetic", "probe_calls": calls}

    clashing = tandem("envs", "register", "cli-mcp-other", "--entrypoint", "tests.workers.mcp_task:SumTask",
                      "--tool-server", "arithmetic", "--field", "tool_server=arithmetic")
    assert clashing.returncode != 0 and "--tool-server: --field tool_server is not an object" in clashing.stderr


def _evaluation_report(index: int, *, status: str = "complete") -> dict:
    return {"evaluation": index, "step": 10 * index, "policy_version": 10 * index, "environment": "calculator@1",
            "status": status, "reason": "" if status == "complete" else "3 of 8 episodes came back",
            "tasks": 4, "samples_per_task": 2, "temperature": 0.0, "episodes": 8 if status == "complete" else 3,
            "metrics": {"success_rate": 0.25 * (index + 1), "mean_reward": 0.5, "pass@1": 0.25, "pass@2": 0.5,
                        "tool_call_rate": 0.75, "tool_calls_per_episode": 1.25},
            "intervals": {"success_rate": [0.1, 0.6]}}


def test_eval_list_and_show_print_a_runs_evaluations_with_their_intervals(tandem, client, trainer):
    assert client.environments.probe("calculator", wait_s=90)["status"] == "passed"  # claimable once probed
    run = client.runs.create(environment="calculator", config={"sft_steps": 0, "rl_steps": 4,
                                                               "evaluation": {"every_steps": 2}})
    trainer.claim(run.id)
    assert tandem("eval", "list", str(run.id)).stdout.startswith(f"run {run.id} has no evaluations")
    for index, status in ((0, "complete"), (1, "incomplete")):
        response = trainer.http.post(f"/api/trainer/runs/{run.id}/evaluations/", json=_evaluation_report(index, status=status))
        assert response.status_code == 201, response.text

    listed = tandem("eval", "list", str(run.id))
    assert listed.returncode == 0, listed.stderr
    header, first, second = listed.stdout.splitlines()
    assert header.split() == ["#", "STEP", "VERSION", "ENVIRONMENT", "STATUS", "EPISODES", "SUCCESS_RATE",
                              "MEAN_REWARD", "PASS@1", "PASS@2", "TOOL_CALL_RATE", "TOOL_CALLS_PER_EPISODE"]
    assert first.split()[-2:] == ["0.750", "1.250"]  # no parse failures recorded: no column for them
    assert first.split()[:7] == ["0", "0", "v0", "calculator@1", "complete", "8", "0.250"]
    assert "[0.10, 0.60]" in first and second.split()[4] == "incomplete"
    assert [row["index"] for row in json.loads(tandem("eval", "list", str(run.id), "--json").stdout)] == [0, 1]

    shown = tandem("eval", "show", str(run.id), "1")
    assert shown.returncode == 0, shown.stderr
    assert "incomplete (3 of 8 episodes came back)" in shown.stdout and "pass@2:" in shown.stdout
    missing = tandem("eval", "show", str(run.id), "7")
    assert missing.returncode == 2 and f"run {run.id} has no evaluation 7" in missing.stderr
    trainer.heartbeat(run.id, status="finished", trainer_step=4, policy_version=4)  # the trainer holds one run


def test_eval_create_starts_an_evaluation_only_run_of_a_kept_checkpoint(tandem, platform, client, trainer):
    assert client.environments.probe("calculator", wait_s=90)["status"] == "passed"
    run = client.runs.create(environment="calculator", config={"sft_steps": 0, "rl_steps": 4})
    trainer.claim(run.id)
    root = platform.stack.config.var_dir / "checkpoints" / f"run-{run.id}"
    reported = trainer.http.post(f"/api/trainer/runs/{run.id}/checkpoints/", json={"checkpoints": [
        {"step": step, "policy_version": step, "path": str(root / str(step)), "size_bytes": 10} for step in (2, 4)]})
    assert reported.status_code == 200, reported.text

    created = tandem("eval", "create", str(run.id), "--set", "tasks=8", "--set", "pass_k=[1,2]",
                     "--set", "samples_per_task=2")
    assert created.returncode == 0, created.stderr
    replay_id = int(created.stdout.split()[1])
    assert f"evaluates run {run.id} step 4" in created.stdout
    replay = client.runs.get(replay_id)
    assert replay.config["start_from"] == {"run": run.id, "step": 4}
    assert (replay.config["evaluation"]["tasks"], replay.config["evaluation"]["pass_k"]) == (8, [1, 2])

    missing = tandem("eval", "create", str(run.id), "--step", "3")
    assert missing.returncode == 1 and "step: Run" in missing.stderr and "kept steps are 2, 4" in missing.stderr
    trainer.heartbeat(run.id, status="finished", trainer_step=4, policy_version=4)


@pytest.fixture
def progress_keys(platform_redis):
    """``write(run_id, received, status)``: the trainer's progress of evaluation 0 of 8 episodes in its hash."""
    written: set[str] = set()

    def write(run_id: int, received: int, status: str = "running") -> None:
        key = evaluation_progress_key(run_id)
        if key not in written:
            written.add(key)
            platform_redis.delete(key)  # the same run id in an earlier test database
        progress = EvaluationProgress(evaluation=0, policy_version=0, episodes_expected=8,
                                      episodes_received=received, status=status)
        platform_redis.hset(key, "0", progress.model_dump_json())

    yield write
    if written:
        platform_redis.delete(*written)


def _finished_run_with_a_kept_checkpoint(platform, client, trainer) -> int:
    """A run that finished with a kept checkpoint of step 4; the trainer holds nothing afterwards."""
    assert client.environments.probe("calculator", wait_s=90)["status"] == "passed"
    run = client.runs.create(environment="calculator", config={"sft_steps": 0, "rl_steps": 4})
    trainer.claim(run.id)
    path = platform.stack.config.var_dir / "checkpoints" / f"run-{run.id}" / "4"
    reported = trainer.http.post(f"/api/trainer/runs/{run.id}/checkpoints/", json={"checkpoints": [
        {"step": 4, "policy_version": 4, "path": str(path), "size_bytes": 10}]})
    assert reported.status_code == 200, reported.text
    trainer.heartbeat(run.id, status="finished", trainer_step=4, policy_version=4)
    return run.id


def _evaluate_to_the_end(trainer, progress_keys, run_id: int) -> None:
    """The trainer's side of an evaluation-only run: every episode in, its report, the run finished."""
    progress_keys(run_id, 8, "complete")
    report = {**_evaluation_report(0), "episodes": 8}
    assert trainer.http.post(f"/api/trainer/runs/{run_id}/evaluations/", json=report).status_code == 201
    trainer.heartbeat(run_id, status="finished", trainer_step=0, policy_version=0)


class _LineReader:
    """The lines a process writes, read as they come; a line that never comes fails the test, not hangs it."""

    def __init__(self, stream):
        self.lines: queue.Queue[str] = queue.Queue()
        self.read: list[str] = []  # every line, in order
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in iter(stream.readline, ""):
            self.read.append(line.rstrip("\n"))
            self.lines.put(line)

    def until(self, condition, *, what: str) -> str:
        while True:
            try:
                line = self.lines.get(timeout=60)
            except queue.Empty:
                raise AssertionError(f"no line {what} came") from None
            if condition(line):
                return line

    def all(self) -> list[str]:
        """Every line, once the process closed its output."""
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the process never closed its output"
        return self.read


def test_eval_create_wait_prints_the_evaluations_progress_until_the_run_ends(platform, client, trainer,
                                                                               progress_keys):
    source = _finished_run_with_a_kept_checkpoint(platform, client, trainer)
    wait = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "eval", "create", str(source), "--wait", "--tty", "no", "--poll-s", "0.05"],
        cwd=REPO_ROOT, env=_env(platform, Path("/nonexistent"), login=True),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        output = _LineReader(wait.stdout)
        created = output.until(lambda line: line.startswith("run "), what="saying which run it made")
        run_id = int(created.split()[1])
        output.until(lambda line: line.startswith(f"run {run_id} [queued] evaluation not asked for yet"),
                     what="of the queued run")
        trainer.claim(run_id)
        # Without a terminal: a plain line per change, the share and the episodes, no bar.
        for received in (0, 4):
            progress_keys(run_id, received)
            expected = f"run {run_id} [running] evaluation 0 {received / 8:.0%} {received}/8 episodes"
            output.until(lambda line, expected=expected: line.rstrip("\n") == expected, what=repr(expected))
        _evaluate_to_the_end(trainer, progress_keys, run_id)
        lines = output.all()
        wait.wait(timeout=60)
    finally:
        if wait.poll() is None:
            wait.kill()
            wait.wait()

    assert wait.returncode == 0, wait.stderr.read()
    assert not any("[#" in line or "\r" in line for line in lines), lines
    assert f"run {run_id} [finished] evaluation 0 100% 8/8 episodes complete" in lines
    # Then its results, as `tandem eval list` prints them.
    assert lines[-2].split()[:2] == ["#", "STEP"] and lines[-1].split()[:5] == ["0", "0", "v0", "calculator@1",
                                                                                "complete"]


def test_eval_create_wait_on_a_terminal_redraws_one_progress_bar(tandem, platform, client, trainer, progress_keys):
    source = _finished_run_with_a_kept_checkpoint(platform, client, trainer)
    wait = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "eval", "create", str(source), "--wait", "--tty", "yes", "--poll-s", "0.05"],
        cwd=REPO_ROOT, env=_env(platform, Path("/nonexistent"), login=True),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        created = wait.stdout.readline().decode()
        run_id = int(created.split()[1])
        trainer.claim(run_id)
        progress_keys(run_id, 2)
        _evaluate_to_the_end(trainer, progress_keys, run_id)
        out, err = wait.communicate(timeout=60)
    finally:
        if wait.poll() is None:
            wait.kill()
            wait.wait()

    assert wait.returncode == 0, err
    waited = out.decode().split("\n", 1)[0]  # redrawn in place: one line break, after the last bar
    assert waited.startswith("\r") and waited.count("\r") >= 2
    final = waited.rsplit("\r", 1)[1].rstrip()
    assert final == f"run {run_id} [finished] evaluation 0 [{'#' * 24}] 100% 8/8 episodes complete"


def test_eval_create_of_a_model_directory_queues_an_evaluation_only_run_of_it(tandem, client, smollm2):
    relative = os.path.relpath(smollm2, REPO_ROOT)  # the command runs in the repository: read from there

    created = tandem("eval", "create", "--model", relative, "--environment", "calculator-chat", "--set", "tasks=4",
                     "--set", "samples_per_task=2", "--config-set", "sampling.max_new_tokens=16", "--name", "as is")

    assert created.returncode == 0, created.stderr
    run = client.runs.get(int(created.stdout.split()[1]))
    directory = str(REPO_ROOT / relative)
    assert f"evaluates {directory} on calculator-chat" in created.stdout
    assert (run.name, run.environment, run.config["sft_steps"], run.config["rl_steps"]) == (
        "as is", "calculator-chat", 0, 0)
    assert run.config["model"]["hf_checkpoint"] == run.config["model"]["tokenizer"] == directory
    assert (run.config["evaluation"]["tasks"], run.config["evaluation"]["samples_per_task"]) == (4, 2)
    assert run.config["sampling"]["max_new_tokens"] == 16 and run.config["start_from"] is None
    client.runs.cancel(run.id)


@pytest.mark.parametrize(("args", "message"), [
    ([], "give a RUN_ID (to evaluate one of its kept checkpoints) or --model DIR"),
    (["7", "--model", "var/models/x", "--environment", "calculator"], "not both"),
    (["--model", "var/models/x"], "--model needs --environment"),
    (["--model", "var/models/x", "--environment", "calculator", "--step", "3"], "--step: only with RUN_ID"),
    (["7", "--environment", "calculator"], "--environment: only with --model"),
])
def test_eval_create_names_what_it_evaluates_exactly_once(tandem, args, message):
    result = tandem("eval", "create", *args)

    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_eval_create_of_a_directory_outside_the_model_roots_is_refused_naming_the_field(tandem, tmp_path):
    result = tandem("eval", "create", "--model", str(tmp_path), "--environment", "calculator-chat")

    assert result.returncode == 1
    assert "config.model.hf_checkpoint" in result.stderr and "TANDEM_MODEL_ROOTS" in result.stderr


def test_a_sweep_started_from_the_command_line_runs_its_first_trial_and_shows_it(tandem, client, tmp_path):
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"rollout.group_size": {"type": "categorical", "choices": [2, 4]}}))

    created = tandem("sweep", "create", "--environment", "calculator", "--space", str(space), "--metric",
                     "reward_mean", "--max-runs", "2", "--sampler", "grid", "--set", "sft_steps=0",
                     "--set", "rl_steps=2", "--name", "group sizes")

    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("sweep ") and "running: 1 trial(s) started" in created.stdout
    sweep_id = int(created.stdout.split()[1])
    shown = tandem("sweep", "show", str(sweep_id), "--json")
    assert shown.returncode == 0, shown.stderr
    [trial] = json.loads(shown.stdout)["trials"]
    run = client.runs.get(trial["run"])
    assert run.name == "group sizes #0" and run.config["sft_steps"] == 0
    assert run.config["rollout"]["group_size"] == trial["params"]["rollout.group_size"]
    text = tandem("sweep", "show", str(sweep_id))
    assert f"#0   run {trial['run']}  running" in text.stdout and "grid sampler" in text.stdout
    # Cancelled, so that it starts no run the other tests of this platform would find queued.
    cancelled = tandem("sweep", "cancel", str(sweep_id))
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == f"sweep {sweep_id} cancelled"
    assert client.runs.get(trial["run"]).status == "cancelled"
    bad = tandem("sweep", "create", "--environment", "calculator", "--space", str(space), "--metric", "reward_mean",
                 "--max-runs", "2", "--sampler", "grid", "--set", "model.num_heads=3")
    assert bad.returncode == 1 and "400 invalid" in bad.stderr and "num_heads" in bad.stderr
