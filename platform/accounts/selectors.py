"""Reads of users and projects."""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace

from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db.models import OuterRef, QuerySet, Subquery

from common.domain_errors import InvalidInput, NotFound

from .models import ApiToken, Membership, MetricExplorerLayout, Project
from .tokens import token_digest


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


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    """The token whose raw value is ``raw``, with its user, if that user is active."""
    token = ApiToken.objects.select_related("user").filter(digest=token_digest(raw)).first()
    if token is None or not token.user.is_active:
        return None
    return token


def websocket_credential_is_valid(*, user_id: int, api_token_id: int | None, session_key: str | None) -> bool:
    """Whether what a WebSocket authenticated with still authenticates ``user_id``.

    A token: not revoked, its user active. A session: still logged in as that user, whose
    password has not changed since (Django's own ``get_user`` checks, the ones each request gets).
    """
    if api_token_id is not None:
        return ApiToken.objects.filter(pk=api_token_id, user_id=user_id, user__is_active=True).exists()
    if not session_key:
        return False
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(SimpleNamespace(session=session))
    return user.is_authenticated and user.pk == user_id and user.is_active


def api_token_list(*, user: AbstractBaseUser) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def api_token_get_for_user(*, user: AbstractBaseUser, token_id: int) -> ApiToken:
    """One of the user's tokens; another user's token is reported as missing."""
    token = api_token_list(user=user).filter(pk=token_id).first()
    if token is None:
        raise NotFound(f"Token {token_id} not found.")
    return token


def membership_list(*, project: Project) -> QuerySet[Membership]:
    return (
        Membership.objects.filter(project=project)
        .select_related("user")
        .order_by("user__username", "id")
    )


def membership_get(*, project: Project, username: str) -> Membership:
    membership = (
        Membership.objects.filter(project=project, user__username=username)
        .select_related("user", "project")
        .first()
    )
    if membership is None:
        raise NotFound(f"'{username}' is not a member of project '{project.name}'.")
    return membership


def auth_failure_key(kind: str, value: str) -> str:
    """The cache key counting failed attempts of a user name (``user``) or a client ``address``."""
    return f"auth-failures:{kind}:{value.lower()}"


def auth_locked_out(*, username: str | None = None, address: str | None) -> bool:
    """Whether ``username`` or ``address`` spent its failed attempts of the current window."""
    allowed = settings.TANDEM_AUTH_FAILURES_ALLOWED
    keys = [auth_failure_key(kind, value)
            for kind, value in (("user", username), ("address", address)) if value]
    return any((count or 0) >= allowed for count in cache.get_many(keys).values())


#: The group whose users may act as trainers (accounts.permissions.IsTrainer).
TRAINER_GROUP = "tandem-trainers"


def user_is_trainer(*, user: AbstractBaseUser) -> bool:
    return user.groups.filter(name=TRAINER_GROUP).exists()


def metric_explorer_layout_get(*, user: AbstractBaseUser, page: str) -> dict:
    """The user's explorer layout on ``page`` (``MetricExplorerLayout.Page``); no panels before they add one."""
    layout = MetricExplorerLayout.objects.filter(user=user, page=page).values_list("layout", flat=True).first()
    return layout if layout is not None else {"smoothing": 0.6, "panels": []}
