"""SFT datasets through tandem.sdk.client and ``tandem datasets ...`` against a real platform."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tandem.cli.stack import REPO_ROOT
from tandem.sdk.client import TandemAPIError

from .test_cli_client import _env


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _conversation(answer: str) -> dict:
    return {"messages": [{"role": "user", "content": "Say it."}, {"role": "assistant", "content": answer}],
            "metadata": {"answer": answer}}


def test_the_sdk_registers_versions_and_reads_their_rows(client, tmp_path):
    first = client.datasets.register("sdk-dataset", _write(tmp_path / "a.jsonl", [_conversation("a")]))
    second = client.datasets.register("sdk-dataset", _write(tmp_path / "b.jsonl",
                                                            [_conversation("b"), _conversation("c")]))

    assert (first.version, first.row_count) == (1, 1)
    assert (second.version, second.row_count) == (2, 2)
    assert [version["number"] for version in client.datasets.get("sdk-dataset").versions] == [2, 1]
    assert [row["metadata"]["answer"] for row in client.datasets.rows("sdk-dataset")] == ["b", "c"]
    assert [row["metadata"]["answer"] for row in client.datasets.rows("sdk-dataset", version=1)] == ["a"]
    run = client.runs.create(environment="calculator", config={
        "sft_steps": 1, "rl_steps": 1, "sft": {"datasets": [{"name": "sdk-dataset", "version": 1}]}})
    assert run.config["sft"]["datasets"] == [{"name": "sdk-dataset", "version": 1, "weight": 1.0}]
    client.runs.cancel(run.id)


def test_the_sdk_raises_the_bad_lines_and_stores_nothing(client, tmp_path):
    bad = _write(tmp_path / "bad.jsonl", [_conversation("a"), {"messages": [{"role": "user"}]}])
    with pytest.raises(TandemAPIError) as raised:
        client.datasets.register("sdk-bad", bad)

    assert raised.value.status_code == 400
    assert raised.value.fields["file"][0].startswith("line 2: messages")
    assert all(dataset.name != "sdk-bad" for dataset in client.datasets.list())


def test_the_cli_registers_lists_and_shows_a_dataset(platform, tmp_path):
    def tandem(*args):
        return subprocess.run([sys.executable, "-m", "tandem.cli", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=60, env=_env(platform, tmp_path / "config", login=True))

    registered = tandem("datasets", "register", "cli-dataset", _write(tmp_path / "rows.jsonl",
                                                                      [_conversation("x"), _conversation("y")]))
    assert registered.returncode == 0, registered.stderr
    assert "dataset cli-dataset version 1 registered" in registered.stdout and "2 rows" in registered.stdout

    listed = tandem("datasets", "list")
    assert listed.returncode == 0 and any(line.split()[:1] == ["cli-dataset"] for line in listed.stdout.splitlines())
    shown = tandem("datasets", "show", "cli-dataset", "--rows", "1")
    assert json.loads(shown.stdout)["metadata"] == {"answer": "x"}

    refused = tandem("datasets", "register", "cli-dataset", _write(tmp_path / "bad.jsonl", ["not a row"]))
    assert refused.returncode == 1
    assert "file: line 1: expected a JSON object with 'messages'" in refused.stderr
