"""Writes of users and projects."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from rest_framework.authtoken.models import Token

from domain_errors import Conflict, InvalidInput

from .models import Membership, Project

User = get_user_model()


@transaction.atomic
def project_create(*, owner: AbstractBaseUser, name: str) -> Project:
    """A new project owned by ``owner``, who becomes its first member."""
    name = name.strip()
    if not name:
        raise InvalidInput.for_field("name", "A project needs a name.")
    try:
        with transaction.atomic():
            project = Project.objects.create(owner=owner, name=name)
    except IntegrityError:
        raise Conflict(
            f"You already own a project named '{name}'.",
            fields={"name": [f"You already own a project named '{name}'."]},
        ) from None
    Membership.objects.create(project=project, user=owner, role=Membership.Role.OWNER)
    return project


@transaction.atomic
def project_ensure(*, owner: AbstractBaseUser, name: str) -> Project:
    """The project ``owner`` owns under ``name``, created if missing."""
    project = Project.objects.filter(owner=owner, name=name).first()
    return project or project_create(owner=owner, name=name)


@transaction.atomic
def membership_add(*, project: Project, user: AbstractBaseUser, role: str) -> Membership:
    """Add ``user`` to ``project`` with ``role``, or change the role of a member."""
    if role not in Membership.Role.values:
        raise InvalidInput.for_field("role", f"Unknown role '{role}'.")
    membership, _ = Membership.objects.update_or_create(
        project=project, user=user, defaults={"role": role}
    )
    return membership


@transaction.atomic
def user_create_with_token(
    *, username: str, password: str | None, is_staff: bool = False
) -> tuple[AbstractBaseUser, Token]:
    """A new user with an API token; ``password=None`` leaves it token-only."""
    if User.objects.filter(username=username).exists():
        raise Conflict(
            f"User '{username}' already exists.",
            fields={"username": [f"User '{username}' already exists."]},
        )
    user = User.objects.create_user(username=username, password=password, is_staff=is_staff)
    return user, Token.objects.create(user=user)


@transaction.atomic
def user_ensure_with_token(
    *, username: str, password: str | None, is_staff: bool = False
) -> tuple[AbstractBaseUser, Token]:
    """Like :func:`user_create_with_token`, but an existing user is brought in line.

    The password and staff flag are reset to the given ones, so that what a
    bootstrap prints is what works; the existing token is kept.
    """
    user = User.objects.filter(username=username).first()
    if user is None:
        return user_create_with_token(username=username, password=password, is_staff=is_staff)
    if password is None:
        user.set_unusable_password()
    else:
        user.set_password(password)
    user.is_staff = is_staff
    user.is_active = True
    user.save(update_fields=["password", "is_staff", "is_active"])
    token, _ = Token.objects.get_or_create(user=user)
    return user, token
