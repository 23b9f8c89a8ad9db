"""``tandem export-worker`` becomes the export worker's own command line (python -m trainer.export_worker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_export_worker_passes_its_arguments_on():
    result = subprocess.run([sys.executable, "-m", "tandem.cli", "--redis-url", "redis://127.0.0.1:1/0",
                             "export-worker", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m trainer.export_worker")
    assert "--concurrency" in result.stdout and "--redis-url" in result.stdout


def test_export_worker_refuses_an_unknown_argument_naming_it():
    result = subprocess.run([sys.executable, "-m", "tandem.cli", "export-worker", "--queues", "platform"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--queues" in result.stderr, result.stderr
