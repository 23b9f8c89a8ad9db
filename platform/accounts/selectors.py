"""Reads of users and projects."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import OuterRef, QuerySet, Subquery
from rest_framework.authtoken.models import Token

from domain_errors import InvalidInput, NotFound

from .models import Membership, Project


def project_list(*, user: AbstractBaseUser) -> QuerySet[Project]:
    """Projects the user belongs to, each annotated with the user's ``role`` in it."""
    role = Membership.objects.filter(project=OuterRef("pk"), user=user).values("role")[:1]
    return (
        Project.objects.filter(memberships__user=user)
        .select_related("owner")
        .annotate(role=Subquery(role))
        .order_by("name", "id")
    )


def project_get_for_user(*, user: AbstractBaseUser, project_id: int) -> Project:
    """The project, if the user belongs to it; others' projects are reported as missing."""
    project = project_list(user=user).filter(pk=project_id).first()
    if project is None:
        raise NotFound(f"Project {project_id} not found.")
    return project


def project_resolve_for_user(*, user: AbstractBaseUser, project_id: int | None) -> Project:
    """The named project, or the user's only project when none is named."""
    if project_id is not None:
        return project_get_for_user(user=user, project_id=project_id)
    projects = list(project_list(user=user)[:2])
    if len(projects) == 1:
        return projects[0]
    if not projects:
        raise InvalidInput.for_field("project", "You belong to no project; create one first.")
    raise InvalidInput.for_field("project", "You belong to several projects; name one.")


def project_role(*, user: AbstractBaseUser, project: Project) -> str | None:
    """The user's role in the project, or None for a non-member."""
    return (
        Membership.objects.filter(project=project, user=user).values_list("role", flat=True).first()
    )


def user_for_token(*, key: str) -> AbstractBaseUser | None:
    """The active user an API token belongs to, or None."""
    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return None
    return token.user
