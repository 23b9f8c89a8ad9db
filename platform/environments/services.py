"""Writes of environments."""

from __future__ import annotations

import re

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction

from accounts.models import Project
from accounts.permissions import project_require_writer
from domain_errors import Conflict, InvalidInput
from tandem.contracts import EnvironmentSpec

from .models import Environment

# `package.module:ClassName`: what producers pass to importlib and getattr.
ENTRYPOINT_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
# Names appear in URLs, CLI arguments and stream records, so they stay plain.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@transaction.atomic
def environment_register(
    *, user: AbstractBaseUser, project: Project, spec: EnvironmentSpec
) -> Environment:
    """Register ``spec`` in ``project``; its name must be new in the project."""
    project_require_writer(user=user, project=project)
    if not NAME_PATTERN.match(spec.name):
        raise InvalidInput.for_field(
            "name", "Use letters, digits, '_', '.' and '-', starting with a letter or digit."
        )
    if not ENTRYPOINT_PATTERN.match(spec.entrypoint):
        raise InvalidInput.for_field(
            "entrypoint",
            f"'{spec.entrypoint}' is not of the form 'package.module:ClassName'.",
        )
    try:
        with transaction.atomic():
            return Environment.objects.create(
                project=project,
                name=spec.name,
                kind=spec.kind,
                entrypoint=spec.entrypoint,
                params=spec.params,
            )
    except IntegrityError:
        message = f"Project '{project.name}' already has an environment named '{spec.name}'."
        raise Conflict(message, fields={"name": [message]}) from None


@transaction.atomic
def environment_ensure(
    *, user: AbstractBaseUser, project: Project, spec: EnvironmentSpec
) -> Environment:
    """The environment named ``spec.name`` in ``project``, registered if missing."""
    existing = Environment.objects.filter(project=project, name=spec.name).first()
    return existing or environment_register(user=user, project=project, spec=spec)
