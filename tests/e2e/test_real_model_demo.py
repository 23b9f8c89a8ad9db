"""`tandem up --demo --model smollm2`: the calculator on SmolLM2-135M-Instruct, through the whole stack.

The command itself runs, as a user runs it: web, platform worker, rollout
workers and trainer on a fresh database, the demo run created over REST. One
RL step keeps it to minutes on a CPU. What it did is read back from the
platform's database: the run finished, and the episodes it trained on are in
the model's own chat template, the ``calc`` tool described to it and called in
its native ``<tool_call>`` format.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from tandem.runtime.local_ports import free_local_port
from tests.e2e.conftest import fresh_database
from tests.redis_servers import own_redis_server


@pytest.mark.timeout(1800)  # above its inner waits (tests/test_timeouts.py)
def test_the_real_model_demo_runs_the_calculator_in_the_models_own_format(tmp_path, smollm2):
    with own_redis_server(tmp_path / "redis") as redis_url, fresh_database() as database_url:
        env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
               "TANDEM_SMOLLM2_DIR": str(smollm2)}
        completed = subprocess.run(
            [sys.executable, "-m", "tandem.cli", "up", "--demo", "--model", "smollm2", "--rl-steps", "1",
             "--exit-when-done", "--port", str(free_local_port()), "--workers", "1", "--var-dir", str(tmp_path)],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1500,
        )
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
        with psycopg.connect(database_url) as connection:
            (status, config), = connection.execute(
                "SELECT status, config FROM runs_run WHERE name LIKE 'demo: calculator on SmolLM2%'").fetchall()
            samples = [row[0] for row in connection.execute(
                "SELECT payload FROM trajectories_trajectorysample ORDER BY id").fetchall()]
    assert status == "finished"
    assert config["model"]["hf_checkpoint"] == str(smollm2.resolve())
    assert samples, "the run sent no trajectory samples"
    for sample in samples:
        assert sample["by_message"] and sample["environment"] == "calculator-chat"
        system, user = sample["turns"][0], sample["turns"][1]
        # SmolLM2's template knows no tools: they are described, with the Hermes call syntax, in a system message.
        assert '"name": "calc"' in system["text"] and "<tool_call>" in system["text"]
        assert user["text"].startswith("What is ") and user["text"].endswith("End your reply with the answer.")
        rendered = "".join(span["text"] for span in system["spans"] + user["spans"])
        assert rendered.startswith("<|im_start|>system\n") and "<|im_start|>user\n" in rendered
        policy_turns = [turn for turn in sample["turns"] if turn["role"] == "policy"]
        assert policy_turns and all(turn["policy_version"] is not None for turn in policy_turns)
        # Only the model's own tokens are trained: never the template's headers or the prompt.
        assert not any(span["trained"] for turn in sample["turns"] if turn["role"] != "policy"
                       for span in turn["spans"])
        for turn in policy_turns:
            for call in turn["tool_calls"]:
                assert call["name"] == "calc" and "<tool_call>" in turn["text"]
