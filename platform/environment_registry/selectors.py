"""Reads of environments, their versions and probes."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Prefetch, QuerySet

from accounts.models import Project
from common.domain_errors import Conflict, InvalidInput, NotFound

from .models import Environment, EnvironmentProbe, EnvironmentVersion, EnvironmentVersionSecrets
from .secret_values import secret_values_open

# Probes shown with a version: its registration and the recent health history.
PROBES_SHOWN = 50


def environment_list(
    *, user: AbstractBaseUser, project: Project | None = None
) -> QuerySet[Environment]:
    """Environments of the projects the user belongs to, optionally of one project.

    Each has ``versions`` prefetched, newest first, so the latest is ``versions.all()[0]``.
    """
    environments = Environment.objects.filter(project__memberships__user=user)
    if project is not None:
        environments = environments.filter(project=project)
    return (
        environments.select_related("project")
        .prefetch_related(
            Prefetch(
                "versions",
                queryset=EnvironmentVersion.objects.select_related("created_by").order_by("-number"),
            )
        )
        .order_by("project__name", "project_id", "name")
    )


def environment_get_for_user(*, user: AbstractBaseUser, environment_id: int) -> Environment:
    """The environment, if it is in one of the user's projects; others' are reported as missing."""
    environment = environment_list(user=user).filter(pk=environment_id).first()
    if environment is None:
        raise NotFound(f"Environment {environment_id} not found.")
    return environment


def environment_get(*, project: Project, name: str) -> Environment:
    environment = Environment.objects.filter(project=project, name=name).first()
    if environment is None:
        raise NotFound(f"No environment named '{name}' in project '{project.name}'.")
    return environment


def environment_version_get(*, environment: Environment, number: int) -> EnvironmentVersion:
    version = (
        EnvironmentVersion.objects.select_related("environment__project")
        .filter(environment=environment, number=number)
        .first()
    )
    if version is None:
        raise NotFound(f"Environment '{environment.name}' has no version {number}.")
    return version


def environment_version_latest(*, environment: Environment) -> EnvironmentVersion:
    version = (
        EnvironmentVersion.objects.select_related("environment__project")
        .filter(environment=environment)
        .order_by("-number")
        .first()
    )
    if version is None:
        raise NotFound(f"Environment '{environment.name}' has no version.")
    return version


def environment_version_resolve(*, project: Project, reference: str) -> EnvironmentVersion:
    """The version ``reference`` names in ``project``: ``name`` (its latest version) or ``name@3``."""
    name, _, number = reference.partition("@")
    environment = environment_get(project=project, name=name)
    if not number:
        return environment_version_latest(environment=environment)
    if not number.isdigit():
        raise NotFound(f"'{reference}': the version after '@' must be a number.")
    return environment_version_get(environment=environment, number=int(number))


def environment_version_pin(*, project: Project, reference: str, field: str = "environment") -> EnvironmentVersion:
    """The version a new run named ``reference`` pins; refused if its probe failed, naming ``field``.

    A version whose probe is pending, or that is unhealthy, may be pinned: the
    run waits in the queue until the version is ready (the trainer's claim
    skips it), as the platform README documents.
    """
    try:
        version = environment_version_resolve(project=project, reference=reference)
    except NotFound as error:
        raise InvalidInput.for_field(field, error.message) from None
    if version.status == EnvironmentVersion.Status.FAILED:
        message = (
            f"Environment {version} failed its probe, so no new run may use it: "
            f"{version.status_reason} Register a fixed version, or probe it again."
        )
        raise Conflict(message, fields={field: [message]})
    return version


def environment_probe_list(*, version: EnvironmentVersion) -> QuerySet[EnvironmentProbe]:
    """The version's probes, newest first: its registration probe and health history."""
    return EnvironmentProbe.objects.filter(version=version).order_by("-requested_at", "-id")


def environment_version_last_probe_times(*, versions: list[EnvironmentVersion]) -> dict[int, object]:
    """When each version was last probed (its newest probe's finish, else request), by version id."""
    times: dict[int, object] = {}
    probes = (
        EnvironmentProbe.objects.filter(version__in=versions)
        .order_by("version_id", "-requested_at", "-id")
        .values_list("version_id", "finished_at", "requested_at")
    )
    for version_id, finished_at, requested_at in probes:
        times.setdefault(version_id, finished_at or requested_at)
    return times


def environment_version_secret_settings(*, version: EnvironmentVersion) -> dict[str, str]:
    """The values of ``version``'s secret settings, for the Redis records workers read; never for a user.

    Raises SecretsKeyError if none of TANDEM_SECRETS_KEYS decrypts them.
    """
    ciphertext = (
        EnvironmentVersionSecrets.objects.filter(version=version).values_list("ciphertext", flat=True).first()
    )
    return {} if ciphertext is None else secret_values_open(ciphertext)
