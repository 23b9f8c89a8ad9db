"""Reads of SFT datasets: lists, versions, their rows, and the versions a run pins."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Prefetch, QuerySet

from accounts.models import Project
from common.domain_errors import Conflict, InvalidInput, NotFound
from tandem.contracts import (
    DATASET_HELD_OUT_FRACTION,
    DATASET_HELD_OUT_MIN_ROWS,
    dataset_rows_held_out,
)

from .models import Dataset, DatasetRow, DatasetTokenStats, DatasetVersion


def dataset_list(*, user: AbstractBaseUser, project: Project | None = None) -> QuerySet[Dataset]:
    """Datasets of the projects the user belongs to, with ``versions`` prefetched newest first."""
    datasets = Dataset.objects.filter(project__memberships__user=user)
    if project is not None:
        datasets = datasets.filter(project=project)
    return (
        datasets.select_related("project")
        .prefetch_related(Prefetch(
            "versions", queryset=DatasetVersion.objects.select_related("created_by").order_by("-number")))
        .order_by("project__name", "project_id", "name")
    )


def dataset_get_for_user(*, user: AbstractBaseUser, dataset_id: int) -> Dataset:
    """The dataset, if it is in one of the user's projects; others' are reported as missing."""
    dataset = dataset_list(user=user).filter(pk=dataset_id).first()
    if dataset is None:
        raise NotFound(f"Dataset {dataset_id} not found.")
    return dataset


def dataset_version_get(*, dataset: Dataset, number: int) -> DatasetVersion:
    version = (DatasetVersion.objects.select_related("dataset__project", "created_by")
               .filter(dataset=dataset, number=number).first())
    if version is None:
        raise NotFound(f"Dataset '{dataset.name}' has no version {number}.")
    return version


def dataset_version_resolve(*, project: Project, name: str, number: int | None) -> DatasetVersion:
    """Version ``number`` of dataset ``name`` in ``project``, or its latest (failed ones aside) when
    ``number`` is None."""
    dataset = Dataset.objects.filter(project=project, name=name).first()
    if dataset is None:
        raise NotFound(f"No dataset named '{name}' in project '{project.name}'.")
    if number is not None:
        return dataset_version_get(dataset=dataset, number=number)
    version = (dataset.versions.select_related("dataset").exclude(status=DatasetVersion.Status.FAILED)
               .order_by("-number").first())
    if version is None:
        raise NotFound(f"Dataset '{name}' has no version.")
    return version


def dataset_version_split_counts(*, version: DatasetVersion) -> tuple[int, int]:
    """``(training rows, held-out rows)`` of the version (``tandem.contracts.dataset_rows_held_out``)."""
    rows = [{"messages": messages, "metadata": metadata} for messages, metadata in
            DatasetRow.objects.filter(version=version).order_by("index").values_list("messages", "metadata")
            .iterator(chunk_size=2000)]
    held_out = sum(dataset_rows_held_out(rows))
    return len(rows) - held_out, held_out


def dataset_versions_pin(*, project: Project, datasets: Iterable[dict], field: str,
                         split: Literal["training", "held_out"]) -> list[dict]:
    """``datasets`` (a run config's ``sft.datasets`` or ``evaluation.datasets``) with each version resolved
    to its number, each checked to have rows of ``split``: SFT trains on the training rows, evaluation
    scores the held-out ones.

    Raises:
      InvalidInput: naming ``<field>.<index>.name`` (or ``.version``) of a dataset or version
        the project does not have, whose rows are not all stored yet, or whose ``split`` is empty.
    """
    pinned = []
    for index, entry in enumerate(datasets):
        try:
            version = dataset_version_resolve(project=project, name=entry["name"], number=entry.get("version"))
        except NotFound as error:
            part = "version" if entry.get("version") is not None and Dataset.objects.filter(
                project=project, name=entry["name"]).exists() else "name"
            raise InvalidInput.for_field(f"{field}.{index}.{part}", error.message) from None
        # The row lock deleting a version takes: it is not deleted under the run being created.
        DatasetVersion.objects.select_for_update().filter(pk=version.pk).first()
        try:
            dataset_version_require_ready(version=version)
        except Conflict as error:
            raise InvalidInput.for_field(f"{field}.{index}.name", error.message) from None
        training, held_out = dataset_version_split_counts(version=version)
        if split == "training" and not training:
            raise InvalidInput.for_field(f"{field}.{index}.name", (
                f"Dataset {version} has no training rows: all {held_out} are held out for evaluation "
                "(their metadata.split says so)."))
        if split == "held_out" and not held_out:
            raise InvalidInput.for_field(f"{field}.{index}.name", (
                f"Dataset {version} has no held-out rows to evaluate on: mark some with metadata.split "
                f"'evaluation' (or 'validation', 'test'). Unmarked, about {DATASET_HELD_OUT_FRACTION:.0%} of "
                f"a dataset's rows are held out by hash once it has {DATASET_HELD_OUT_MIN_ROWS} rows; none "
                f"of its {training} is."))
        pinned.append({**entry, "version": version.number})
    return pinned


def dataset_rows(*, version: DatasetVersion) -> QuerySet[DatasetRow]:
    """The version's rows in file order (of a version not ready, those stored so far)."""
    return DatasetRow.objects.filter(version=version).order_by("index")


def dataset_version_require_ready(*, version: DatasetVersion) -> None:
    """Raise Conflict, saying how far it is, unless every row of the version is stored."""
    if version.status == DatasetVersion.Status.READY:
        return
    if version.status == DatasetVersion.Status.FAILED:
        raise Conflict(f"Dataset {version} failed to be stored and has no rows: {version.failure_reason} "
                       "Upload it again.")
    raise Conflict(f"Dataset {version} is still being stored ({version.status}: {version.rows_stored} of "
                   f"{version.row_count} rows); wait until it is ready.")


def dataset_token_stats_get(*, version: DatasetVersion, tokenizer: str) -> DatasetTokenStats | None:
    """The stored token statistics of ``version`` under ``tokenizer``, if they were asked for."""
    return DatasetTokenStats.objects.filter(version=version, tokenizer=tokenizer).first()


def dataset_version_for_run(*, run_project: Project, run_config: dict, name: str, number: int) -> DatasetVersion:
    """Version ``number`` of ``name``, if the run's config pins it (``sft.datasets`` or
    ``evaluation.datasets``); else NotFound."""
    pinned = [*(run_config.get("sft") or {}).get("datasets", ()),
              *(run_config.get("evaluation") or {}).get("datasets", ())]
    if not any(entry.get("name") == name and entry.get("version") == number for entry in pinned):
        raise NotFound(f"The run's config does not name dataset {name}@{number} "
                       "(sft.datasets or evaluation.datasets).")
    version = dataset_version_resolve(project=run_project, name=name, number=number)
    dataset_version_require_ready(version=version)
    return version
