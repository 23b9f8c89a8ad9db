"""Reads of SFT datasets: lists, versions, their rows, and the versions a run pins."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Prefetch, QuerySet

from accounts.models import Project
from domain_errors import InvalidInput, NotFound

from .models import Dataset, DatasetRow, DatasetVersion


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
    """Version ``number`` of dataset ``name`` in ``project``, or its latest when ``number`` is None."""
    dataset = Dataset.objects.filter(project=project, name=name).first()
    if dataset is None:
        raise NotFound(f"No dataset named '{name}' in project '{project.name}'.")
    if number is not None:
        return dataset_version_get(dataset=dataset, number=number)
    version = dataset.versions.select_related("dataset").order_by("-number").first()
    if version is None:
        raise NotFound(f"Dataset '{name}' has no version.")
    return version


def dataset_versions_pin(*, project: Project, datasets: Iterable[dict], field: str) -> list[dict]:
    """``datasets`` (a run config's ``sft.datasets``) with each version resolved to its number.

    Raises:
      InvalidInput: naming ``<field>.<index>.name`` (or ``.version``) of a dataset or version
        the project does not have.
    """
    pinned = []
    for index, entry in enumerate(datasets):
        try:
            version = dataset_version_resolve(project=project, name=entry["name"], number=entry.get("version"))
        except NotFound as error:
            part = "version" if entry.get("version") is not None and Dataset.objects.filter(
                project=project, name=entry["name"]).exists() else "name"
            raise InvalidInput.for_field(f"{field}.{index}.{part}", error.message) from None
        pinned.append({**entry, "version": version.number})
    return pinned


def dataset_rows(*, version: DatasetVersion) -> QuerySet[DatasetRow]:
    """The version's rows in file order."""
    return DatasetRow.objects.filter(version=version).order_by("index")


def dataset_version_for_run(*, run_project: Project, run_config: dict, name: str, number: int) -> DatasetVersion:
    """Version ``number`` of ``name``, if the run's config pins it (``sft.datasets``); else NotFound."""
    named = any(entry.get("name") == name and entry.get("version") == number
                for entry in (run_config.get("sft") or {}).get("datasets", ()))
    if not named:
        raise NotFound(f"The run's config does not name dataset {name}@{number} (sft.datasets).")
    return dataset_version_resolve(project=run_project, name=name, number=number)
