"""docs/run_config.md is generated from RunConfig's schema and must not drift from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tandem.configs.docs import run_config_markdown, run_config_rows
from tandem.configs.run import RunConfig

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_reference_is_what_the_schema_generates():
    committed = (REPO_ROOT / "docs" / "run_config.md").read_text()

    assert committed == run_config_markdown(), (
        "docs/run_config.md is out of date: run `python -m tandem.configs.docs > docs/run_config.md`"
    )


def test_the_command_prints_the_reference():
    printed = subprocess.run(
        [sys.executable, "-m", "tandem.configs.docs"], cwd=REPO_ROOT, capture_output=True, text=True,
        check=True,
    ).stdout

    assert printed == run_config_markdown()


def test_every_field_is_a_row_with_type_default_and_description():
    rows = {name: (kind, default, description) for name, kind, default, description in run_config_rows()}

    for name, field in RunConfig.model_fields.items():
        assert name in rows
        assert rows[name][2] == field.description
    assert rows["schema_version"][:2] == ("`2`", "`2`")
    assert rows["rollout"][:2] == ("section", "see fields")
    assert rows["rollout.group_size"][:2] == ("integer (≥ 2, ≤ 256)", "`8`")
    assert rows["algorithm.epsilon_high"][1] == "`0.2`"
    assert rows["algorithm.kl"][:2] == ("section, optional", "`null`")
    assert rows["algorithm.kl.coef"][1] == "`0.001`"
    assert rows["model.param_dtype"][0] == '`"float32"` | `"bfloat16"`'
    assert rows["sampling.stop_strings"][1] == "`[]`"
