"""Reads of environments."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from accounts.models import Project
from domain_errors import NotFound

from .models import Environment


def environment_list(
    *, user: AbstractBaseUser, project: Project | None = None
) -> QuerySet[Environment]:
    """Environments of the projects the user belongs to, optionally of one project."""
    environments = Environment.objects.filter(project__memberships__user=user)
    if project is not None:
        environments = environments.filter(project=project)
    return environments.select_related("project").order_by("project__name", "project_id", "name")


def environment_get(*, project: Project, name: str) -> Environment:
    environment = Environment.objects.filter(project=project, name=name).first()
    if environment is None:
        raise NotFound(f"No environment named '{name}' in project '{project.name}'.")
    return environment
