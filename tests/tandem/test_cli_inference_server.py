"""``tandem inference-server`` becomes ``python -m workers.inference_server``, which starts vLLM only for a
model under the operator's model roots and only from the environment `make vllm` builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(*arguments: str, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tandem.cli", "inference-server", *arguments], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, **environment})


def test_its_help_names_the_model_and_where_an_untied_copy_goes():
    result = _run("--help")

    assert result.returncode == 0, result.stderr
    assert "--model" in result.stdout and "--weights-dir" in result.stdout and "--kv-cache-gib" in result.stdout


def test_a_model_outside_the_model_roots_is_refused_before_vllm_starts(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    result = _run("--model", str(tmp_path), "--weights-dir", str(tmp_path / "served"))

    assert result.returncode != 0
    assert "--model:" in result.stderr and "TANDEM_MODEL_ROOTS" in result.stderr
    assert not (tmp_path / "served").exists()


def test_without_the_vllm_environment_it_says_to_build_it(tmp_path):
    result = _run("--model", "var/models/smollm2-135m-instruct", TANDEM_VLLM_PYTHON=str(tmp_path / "python"))

    assert result.returncode != 0
    assert "run `make vllm`" in result.stderr
