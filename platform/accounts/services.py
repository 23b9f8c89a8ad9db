"""Writes of users and projects."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone

from alerts.services import alert_default_rules_create
from common.domain_errors import Conflict, InvalidInput

from .models import ApiToken, Membership, MetricExplorerLayout, Project
from .permissions import project_require_owner
from .realtime import user_access_changed_on_commit
from .selectors import TRAINER_GROUP, auth_failure_key
from .tokens import token_digest, token_generate, token_prefix

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
    alert_default_rules_create(project=project)
    return project


@transaction.atomic
def project_ensure(*, owner: AbstractBaseUser, name: str) -> Project:
    """The project ``owner`` owns under ``name``, created if missing."""
    project = Project.objects.filter(owner=owner, name=name).first()
    return project or project_create(owner=owner, name=name)


@transaction.atomic
def membership_add(*, project: Project, user: AbstractBaseUser, role: str) -> Membership:
    """Add ``user`` to ``project`` with ``role``, or change the role of a member.

    For trusted callers (bootstrap, tests); requests go through
    :func:`membership_create` and friends, which check that the actor is an owner.
    """
    if role not in Membership.Role.values:
        raise InvalidInput.for_field("role", f"Unknown role '{role}'.")
    membership, _ = Membership.objects.update_or_create(
        project=project, user=user, defaults={"role": role}
    )
    return membership


@transaction.atomic
def membership_create(
    *, actor: AbstractBaseUser, project: Project, username: str, role: str
) -> Membership:
    """An owner adds the user named ``username`` to the project."""
    project_require_owner(user=actor, project=project)
    _require_role(role)
    user = User.objects.filter(username=username, is_active=True).first()
    if user is None:
        raise InvalidInput.for_field("username", f"No user named '{username}'.")
    membership, created = Membership.objects.get_or_create(
        project=project, user=user, defaults={"role": role}
    )
    if not created:
        message = f"'{username}' is already a member of '{project.name}' ({membership.role})."
        raise Conflict(message, fields={"username": [message]})
    return membership


@transaction.atomic
def membership_change_role(
    *, actor: AbstractBaseUser, membership: Membership, role: str
) -> Membership:
    """An owner changes a member's role; the project always keeps an owner."""
    project_require_owner(user=actor, project=membership.project)
    _require_role(role)
    if role != Membership.Role.OWNER:
        _require_another_owner(membership)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def membership_remove(*, actor: AbstractBaseUser, membership: Membership) -> None:
    """An owner removes a member (themselves included, unless they are the last owner)."""
    project_require_owner(user=actor, project=membership.project)
    _require_another_owner(membership)
    membership.delete()
    user_access_changed_on_commit(membership.user_id)  # open sockets on its runs close


def _require_role(role: str) -> None:
    if role not in Membership.Role.values:
        raise InvalidInput.for_field(
            "role", f"Unknown role '{role}'; one of {', '.join(Membership.Role.values)}."
        )


def _require_another_owner(membership: Membership) -> None:
    if membership.role != Membership.Role.OWNER:
        return
    # Locked, so two owners demoting each other at once cannot leave the project ownerless.
    owners = list(
        Membership.objects.select_for_update()
        .filter(project_id=membership.project_id, role=Membership.Role.OWNER)
        .values_list("pk", flat=True)
    )
    if owners == [membership.pk]:
        raise Conflict(
            f"{membership.user} is the last owner of '{membership.project.name}'; "
            "make someone else an owner first.",
            fields={"role": ["A project needs at least one owner."]},
        )


@transaction.atomic
def api_token_create(*, user: AbstractBaseUser, name: str) -> tuple[ApiToken, str]:
    """A new API token of ``user``; returns it with its raw value, which is not stored."""
    name = name.strip()
    if not name:
        raise InvalidInput.for_field("name", "A token needs a name.")
    raw = token_generate()
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                user=user, name=name, prefix=token_prefix(raw), digest=token_digest(raw)
            )
    except IntegrityError:
        message = f"You already have a token named '{name}'."
        raise Conflict(message, fields={"name": [message]}) from None
    return token, raw


@transaction.atomic
def api_token_revoke(*, token: ApiToken) -> None:
    """Delete the token; the next request that presents it is refused, and its user's sockets re-check theirs."""
    user_id = token.user_id
    token.delete()
    user_access_changed_on_commit(user_id)


# How stale ``last_used_at`` may get: a write on every request would cost more
# than a "last used" column is worth.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def api_token_mark_used(*, token: ApiToken) -> None:
    now = timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < LAST_USED_RESOLUTION:
        return
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now


@transaction.atomic
def user_create_with_token(
    *, username: str, password: str | None, is_staff: bool = False, token_name: str = "default"
) -> tuple[AbstractBaseUser, str]:
    """A new user and the raw value of its first API token; ``password=None`` leaves it token-only."""
    if User.objects.filter(username=username).exists():
        raise Conflict(
            f"User '{username}' already exists.",
            fields={"username": [f"User '{username}' already exists."]},
        )
    user = User.objects.create_user(username=username, password=password, is_staff=is_staff)
    _, raw = api_token_create(user=user, name=token_name)
    return user, raw


@transaction.atomic
def user_ensure_with_token(
    *, username: str, password: str | None, is_staff: bool = False, token_name: str = "bootstrap"
) -> tuple[AbstractBaseUser, str, bool]:
    """The user ``username`` (created as :func:`user_create_with_token` if missing) and a new token.

    An existing user is never changed: its password, staff flag and active
    flag stay as they are (``password`` and ``is_staff`` apply only to a new
    user), so re-running a bootstrap cannot reset a password or bring back a
    deactivated account. Only hashes of tokens are stored, so the user's token
    named ``token_name`` is replaced by a new one whose raw value is returned;
    its other tokens are kept. Returns (user, raw token, whether it was created).

    Raises:
      Conflict: the user exists and is deactivated.
    """
    user = User.objects.filter(username=username).first()
    if user is None:
        user, raw = user_create_with_token(
            username=username, password=password, is_staff=is_staff, token_name=token_name
        )
        return user, raw, True
    if not user.is_active:
        message = f"User '{username}' is deactivated; a bootstrap does not re-activate users."
        raise Conflict(message, fields={"username": [message]})
    ApiToken.objects.filter(user=user, name=token_name).delete()
    _, raw = api_token_create(user=user, name=token_name)
    return user, raw, False


# -- failed authentication ------------------------------------------------------------


def auth_failure_record(*, username: str | None = None, address: str | None) -> None:
    """Count one failed login (``username``) or unknown token from ``address``, for the window.

    The window starts at the first failure and is not extended by later ones, so a
    lock-out ends ``TANDEM_AUTH_FAILURE_WINDOW_S`` after it began.
    """
    window = settings.TANDEM_AUTH_FAILURE_WINDOW_S
    for kind, value in (("user", username), ("address", address)):
        if value:
            key = auth_failure_key(kind, value)
            cache.add(key, 0, timeout=window)
            try:
                cache.incr(key)
            except ValueError:  # expired between add and incr
                cache.set(key, 1, timeout=window)


def auth_failures_clear(*, username: str) -> None:
    """A successful login forgets that user's failures (not its address's)."""
    cache.delete(auth_failure_key("user", username))


def user_make_trainer(*, user: AbstractBaseUser) -> None:
    """Let ``user`` act as a trainer: the ``tandem-trainers`` group (idempotent)."""
    group, _ = Group.objects.get_or_create(name=TRAINER_GROUP)
    user.groups.add(group)


@transaction.atomic
def metric_explorer_layout_save(*, user: AbstractBaseUser, page: str, layout: dict) -> MetricExplorerLayout:
    """Replaces the user's explorer layout on ``page`` with ``layout`` (already validated)."""
    saved, _ = MetricExplorerLayout.objects.update_or_create(user=user, page=page, defaults={"layout": layout})
    return saved
