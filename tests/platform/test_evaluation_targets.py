"""What a run evaluates on besides its own environment, on the platform's side.

Datasets: runs pin the datasets they evaluate on, refused when a dataset has no held-out row (or,
for SFT, no training row); the trainer reads their rows; a dataset's evaluation is stored beside
the environment's of the same point, with series of its own. Other environments: pinned too,
their specs in the trainer's claim, their secret settings written for producers at the claim and
deleted at the run's end, their evaluations on series of their own."""

from __future__ import annotations

import pytest

from evaluations.models import Evaluation
from runs.models import Run
from runs.services import run_transition
from tandem.contracts import (
    DATASET_HELD_OUT_MIN_ROWS,
    EnvironmentSpec,
    RunStatus,
    dataset_rows_held_out,
    run_evaluation_secrets_key,
)
from tandem.runtime.secrets_at_rest import SecretsCipher, environment_secrets_open
from telemetry.models import MetricPoint
from tests.platform.conftest import TRAINER_NAME
from tests.platform.test_datasets_api import _held_run_on, conversation, jsonl, upload
from tests.platform.test_evaluations_api import evaluation_report
from tests.workers.secret_environments import API_KEY

pytestmark = pytest.mark.django_db


def _create(api, project, config):
    return api.post("/api/runs/", {"project": project.pk, "environment": "calculator", "config": config},
                    format="json")


def test_a_run_pins_the_datasets_it_evaluates_on(api, project, environment):
    upload(api, project, "exam", jsonl(conversation(metadata={"split": "train"}), conversation("9+9?", "18", metadata={
        "split": "evaluation"})))
    upload(api, project, "exam", jsonl(conversation(metadata={"split": "test"})))

    response = _create(api, project, {"sft_steps": 0, "rl_steps": 1, "evaluation": {"datasets": [{"name": "exam"}]}})

    assert response.status_code == 201, response.json()
    assert response.json()["config"]["evaluation"]["datasets"] == [{"name": "exam", "version": 2}]


def test_a_dataset_without_the_rows_a_run_needs_is_a_400_naming_it(api, project, environment):
    # Too few rows for a hashed split, and none marked: nothing held out to evaluate on.
    small = [conversation(f"{n}+1?", str(n + 1)) for n in range(DATASET_HELD_OUT_MIN_ROWS - 1)]
    assert not any(dataset_rows_held_out([{"messages": row["messages"], "metadata": {}} for row in small]))
    upload(api, project, "small", jsonl(*small))
    upload(api, project, "exam", jsonl(conversation(metadata={"split": "evaluation"})))

    response = _create(api, project, {"sft_steps": 0, "evaluation": {"datasets": [{"name": "exam"},
                                                                                   {"name": "small"}]}})
    assert response.status_code == 400
    error = response.json()["error"]
    assert list(error["fields"]) == ["config.evaluation.datasets.1.name"]
    assert "small@1 has no held-out rows to evaluate on" in error["message"]
    # And SFT on a dataset whose every row is held out: nothing to train on.
    response = _create(api, project, {"sft_steps": 3, "sft": {"datasets": [{"name": "exam"}]}})
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["config.sft.datasets.0.name"]
    assert "exam@1 has no training rows: all 1 are held out" in response.json()["error"]["message"]
    # An evaluation dataset the project does not have is named like an SFT one.
    response = _create(api, project, {"sft_steps": 0, "evaluation": {"datasets": [{"name": "nope"}]}})
    assert list(response.json()["error"]["fields"]) == ["config.evaluation.datasets.0.name"]


def test_the_trainer_reads_the_rows_of_the_datasets_its_run_evaluates_on(api, trainer_api, project, environment):
    upload(api, project, "exam", jsonl(conversation(metadata={"split": "evaluation"}), conversation()))
    run = _held_run_on(api, project, {"sft_steps": 0, "rl_steps": 1, "evaluation": {"datasets": [{"name": "exam"}]}})

    page = trainer_api.get(f"/api/trainer/runs/{run.pk}/datasets/exam/versions/1/rows/").json()

    assert page["total"] == 2 and page["rows"][0]["metadata"] == {"split": "evaluation"}


def test_a_datasets_evaluation_is_stored_beside_the_environments_with_series_of_its_own(trainer_api, running_run):
    base = f"/api/trainer/runs/{running_run.pk}/evaluations/"
    assert trainer_api.post(base, evaluation_report(1, step=30), format="json").status_code == 201
    dataset = evaluation_report(1, step=30, kind="dataset", environment="exam@2", tasks=16, samples_per_task=1,
                                episodes=16, temperature=0.0, trajectory_ids=[],
                                metrics={"loss": 1.25, "perplexity": 3.49, "token_accuracy": 0.5, "wall_s": 0.2},
                                intervals={"loss": [1.0, 1.5]})
    created = trainer_api.post(base, dataset, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["kind"] == "dataset"
    # Retried: the same row.
    assert trainer_api.post(base, dataset, format="json").status_code == 200

    rows = Evaluation.objects.filter(run=running_run, index=1).order_by("kind")
    assert [(row.kind, row.environment, row.target_label) for row in rows] == [
        ("dataset", "exam@2", "dataset exam@2"), ("environment", "calculator@1", "calculator@1")]
    names = set(MetricPoint.objects.filter(run=running_run, step=30).values_list("name", flat=True))
    assert {"eval/dataset:exam@2/loss", "eval/dataset:exam@2/token_accuracy", "eval/success_rate"} <= names
    assert "eval/loss" not in names  # a dataset's loss is never the environment's series


# -- other environments ------------------------------------------------------------------------

def test_a_run_pins_the_other_environments_it_evaluates_on_and_its_claim_carries_their_specs(
        api, trainer_api, project, environment, keyed_version, django_capture_on_commit_callbacks, redis_client):
    refused = _create(api, project, {"sft_steps": 0, "evaluation": {"environments": ["keyed", "nope"]}})
    assert refused.status_code == 400 and list(refused.json()["error"]["fields"]) == [
        "config.evaluation.environments.1"]
    own = _create(api, project, {"sft_steps": 0, "evaluation": {"environments": ["calculator"]}})
    assert own.status_code == 400 and "is the run's own environment" in own.json()["error"]["message"]

    created = _create(api, project, {"sft_steps": 0, "rl_steps": 1, "evaluation": {"environments": ["keyed"]}})
    assert created.status_code == 201, created.json()
    assert created.json()["config"]["evaluation"]["environments"] == [f"keyed@{keyed_version.number}"]
    run_id = created.json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        claim = trainer_api.post("/api/trainer/claim/", {"worker": TRAINER_NAME}, format="json")
    assert claim.status_code == 200, claim.content
    (spec,) = [EnvironmentSpec.model_validate(raw) for raw in claim.json()["run"]["evaluation_environments"]]
    assert (spec.label, spec.version_id, spec.secret_setting_names) == (
        f"keyed@{keyed_version.number}", keyed_version.pk, ("api_key",))
    assert API_KEY.encode() not in claim.content
    # Producers get its secret settings by version id; the run's end deletes them.
    stored = environment_secrets_open(
        redis_client.hget(run_evaluation_secrets_key(run_id), str(keyed_version.pk)), SecretsCipher.from_environment())
    assert stored.revealed() == {"api_key": API_KEY}
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=Run.objects.get(pk=run_id), to_status=RunStatus.PAUSED, reason="paused")
    assert not redis_client.exists(run_evaluation_secrets_key(run_id))


def test_another_environments_evaluation_charts_on_series_of_its_own(trainer_api, running_run):
    base = f"/api/trainer/runs/{running_run.pk}/evaluations/"
    own_label = str(running_run.environment_version)
    assert trainer_api.post(base, evaluation_report(0, step=5, environment=own_label), format="json").status_code == 201
    assert trainer_api.post(base, evaluation_report(0, step=5, environment="guess@2"), format="json").status_code == 201

    names = set(MetricPoint.objects.filter(run=running_run, step=5).values_list("name", flat=True))
    assert {"eval/success_rate", "eval/guess@2/success_rate", "eval/guess@2/pass@4"} <= names
    assert Evaluation.objects.filter(run=running_run, index=0).count() == 2
