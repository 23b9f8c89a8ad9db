"""An environment's demonstrations written as a JSONL chat dataset (``http_example_server --write-dataset``)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from environments import demonstration_messages
from environments.builtin.calculator import CalculatorEnvironment
from environments.http_example_server import demonstrations_dataset
from tandem.contracts import DemonstrationMessage, parse_dataset_line, stored_row_messages
from trainer.datasets import with_written_calls

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("tool_call_format", ["tandem", "hermes"])
def test_a_written_dataset_trains_on_exactly_what_the_environments_own_demonstrations_render(tool_call_format):
    """Uploaded, each row reaches the SFT batch as the producer's demonstration of the same task would."""
    environment = CalculatorEnvironment()
    lines = demonstrations_dataset(environment, count=40, seed=3).splitlines()
    assert len(lines) == 40
    produced = [[DemonstrationMessage.model_validate(message)
                 for message in demonstration_messages(demonstration, environment.tools, tool_call_format)]
                for demonstration in environment.demonstrations(40, random.Random(3))]
    from_dataset = [with_written_calls(stored_row_messages(parse_dataset_line(line, line=number + 1).stored()),
                                       tool_call_format)
                    for number, line in enumerate(lines)]
    assert from_dataset == produced
    # Both kinds of demonstration are in it: a tool call then the answer, and a bare answer.
    assert {len(messages) for messages in from_dataset} == {2, 4}


def test_the_server_writes_the_dataset_of_the_environment_it_would_serve():
    written = subprocess.run(
        [sys.executable, "-m", "environments.http_example_server", "--write-dataset", "5", "--seed", "7",
         "--environment", "environments.builtin.guessing_game:GuessingGameEnvironment", "--settings", '{"high": 20}'],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    from environments.builtin.guessing_game import GuessingGameEnvironment

    assert written.stdout == demonstrations_dataset(GuessingGameEnvironment(high=20), count=5, seed=7)
    rows = [parse_dataset_line(line, line=number + 1) for number, line in enumerate(written.stdout.splitlines())]
    assert len(rows) == 5 and all(row.messages[0].role == "user" for row in rows)
