"""Finding 4 of the security audit, where the files are: producers check model paths before reading them.

The platform checks a config when it is written; a producer checks again,
since only on its host do symbolic links resolve to what it would read.
"""

from __future__ import annotations

import pytest

from tandem.allowlists.model_paths import ModelPathRefused, check_model_path
from tandem.configs.run import RunConfig
from workers.policy import PolicyRuntime


def test_a_producer_refuses_a_tokenizer_outside_the_model_roots_before_reading_it(
    tmp_path, monkeypatch, redis_client
):
    outside = tmp_path / "another-projects-export"
    outside.mkdir()
    (outside / "tokenizer.json").write_text("{not json: reading it would fail differently")
    monkeypatch.setenv("TANDEM_MODEL_ROOTS", str(tmp_path / "models"))
    config = RunConfig.model_validate({"model": {"tokenizer": str(outside), "prompt_format": "byte"}})

    with pytest.raises(ModelPathRefused, match="tokenizer: .*TANDEM_MODEL_ROOTS"):
        PolicyRuntime(run_id=1, config=config, redis_client=redis_client)


def test_symbolic_links_and_dot_dot_cannot_leave_a_root(tmp_path):
    root, outside, checkpoints = tmp_path / "models", tmp_path / "outside", tmp_path / "checkpoints"
    for directory in (root / "good", outside, checkpoints / "run-2"):
        directory.mkdir(parents=True)
    (root / "link").symlink_to(outside)
    (root / "to-checkpoints").symlink_to(checkpoints / "run-2")

    assert check_model_path(str(root / "good"), roots=[root], refused_root=checkpoints) == root / "good"
    for refused in (root / "link", root / "to-checkpoints", outside, f"{root}/good/../../outside"):
        with pytest.raises(ModelPathRefused):
            check_model_path(str(refused), roots=[root, tmp_path / "other"], refused_root=checkpoints)
    with pytest.raises(ModelPathRefused, match="checkpoint root"):
        check_model_path(str(checkpoints / "run-2"), roots=[tmp_path], refused_root=checkpoints)
