"""Who may change what in a project.

Viewers read; members also register environments and start or cancel runs;
owners also manage who belongs to the project.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from domain_errors import Forbidden, NotFound

from .models import Membership, Project
from .selectors import project_role


def project_require_writer(*, user: AbstractBaseUser, project: Project) -> None:
    """Raise unless the user may register environments and start or cancel runs."""
    role = project_role(user=user, project=project)
    if role is None:
        raise NotFound(f"Project {project.pk} not found.")
    if role not in Membership.WRITER_ROLES:
        raise Forbidden(f"Your role in project '{project.name}' is {role}; it cannot make changes.")


def project_require_owner(*, user: AbstractBaseUser, project: Project) -> None:
    """Raise unless the user may add, change and remove the project's members."""
    role = project_role(user=user, project=project)
    if role is None:
        raise NotFound(f"Project {project.pk} not found.")
    if role != Membership.Role.OWNER:
        raise Forbidden(
            f"Your role in project '{project.name}' is {role}; only owners manage members."
        )
