"""Finding 4 of the security audit: a run config reads model files only under the operator's model roots.

Before, ``model.hf_checkpoint`` and ``model.tokenizer`` could name any directory
the trainer and producers can read, another project's exported checkpoint
included (run ids are sequential).
"""

from __future__ import annotations

import pytest

from runs.models import Run


@pytest.fixture
def roots(tmp_path, settings):
    models, checkpoints = tmp_path / "models", tmp_path / "checkpoints"
    (models / "qwen").mkdir(parents=True)
    (checkpoints / "run-1" / "export").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (models / "escape").symlink_to(tmp_path / "elsewhere")
    settings.TANDEM_MODEL_ROOTS = (models,)
    settings.TANDEM_CHECKPOINT_ROOT = checkpoints
    return tmp_path


def _create(api, project, **model):
    return api.post("/api/runs/", {"project": project.pk, "environment": "calculator",
                                   "config": {"model": {"prompt_format": "byte", **model}}},
                    format="json")


@pytest.mark.parametrize(("field", "where"), [
    ("hf_checkpoint", "/etc"),
    ("tokenizer", "/root"),
    ("hf_checkpoint", "{root}/models/../checkpoints/run-1/export"),
    ("tokenizer", "{root}/models/escape"),  # a symbolic link out of the root
    ("hf_checkpoint", "{root}/elsewhere"),
])
def test_a_model_path_outside_the_model_roots_is_400_naming_the_field(
    api, project, environment, roots, field, where
):
    response = _create(api, project, **{field: where.format(root=roots)})

    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    assert list(fields) == [f"config.model.{field}"]
    assert not Run.objects.exists()


def test_the_checkpoint_root_is_refused_even_under_a_listed_root(api, project, environment, roots,
                                                                  settings):
    settings.TANDEM_MODEL_ROOTS = (roots,)  # a root above the checkpoints
    response = _create(api, project, hf_checkpoint=str(roots / "checkpoints" / "run-1" / "export"))

    assert response.status_code == 400
    assert "checkpoint root" in response.json()["error"]["fields"]["config.model.hf_checkpoint"][0]


def test_a_model_under_the_roots_is_accepted(api, project, environment, roots):
    response = _create(api, project, hf_checkpoint=str(roots / "models" / "qwen"))

    assert response.status_code == 201, response.json()


def test_a_run_cannot_choose_where_the_trainer_writes_and_deletes_weights(api, project, environment):
    response = api.post("/api/runs/", {"project": project.pk, "environment": "calculator", "config": {
        "weights": {"transport": "filesystem", "dir": "/home/other-team/models"}}}, format="json")

    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert list(fields) == ["config.weights.dir"] and "TANDEM_WEIGHT_DIR" in fields["config.weights.dir"][0]
    assert not Run.objects.exists()
