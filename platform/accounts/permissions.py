"""Who may change what in a project, and who may act as a trainer.

Viewers read; members also register environments and start or cancel runs;
owners also manage who belongs to the project. Trainers are the users of the
``tandem-trainers`` group (``tandem_bootstrap`` puts its trainer user there):
they claim runs and post their telemetry, trajectories and checkpoints. Being
staff grants none of that.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from rest_framework.permissions import BasePermission

from common.domain_errors import Forbidden, NotFound

from .models import Membership, Project
from .selectors import TRAINER_GROUP, project_role, user_is_trainer


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


class IsTrainer(BasePermission):
    """DRF permission of the trainer endpoints: a user of the ``tandem-trainers`` group."""

    message = f"Only trainers (users of the '{TRAINER_GROUP}' group) may use the trainer API."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated and user_is_trainer(user=request.user))
