"""Writes of environments: registering versions, probing them, and acting on the reports."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

import pydantic
import redis
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef, Q, Subquery
from django.utils import timezone
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from accounts.models import Project
from accounts.permissions import project_require_writer
from alerts.services import alerts_probe_recorded
from common.domain_errors import Conflict, InvalidInput, NotFound
from common.tasks import send_task
from tandem.allowlists.agent_commands import AgentCommandRefused, check_agent_command
from tandem.allowlists.environment_modules import EnvironmentModuleRefused, check_environment_target
from tandem.allowlists.environment_urls import (
    MCP_SERVER_URL_SCHEMES,
    EnvironmentURLRefused,
    check_environment_url,
)
from tandem.allowlists.mcp_servers import McpServerRefused, check_mcp_server
from tandem.allowlists.model_paths import ModelPathRefused, check_model_path
from tandem.contracts import (
    ADAPTER_ENTRYPOINTS,
    ENVIRONMENT_KINDS,
    KEY_PREFIX,
    PROBE,
    EnvironmentSpec,
    ProbeBaselineRequest,
    ProbeCheck,
    ProbeReport,
    ProbeRequest,
    ProbeTimeouts,
    RunStatus,
    environment_paused_key,
    probe_environment_secrets_key,
    probe_request_key,
)
from tandem.runtime.secrets_at_rest import SecretsKeyError

from .models import Environment, EnvironmentProbe, EnvironmentVersion, EnvironmentVersionSecrets
from .secret_values import platform_secrets_cipher, secret_values_seal, secrets_record_seal
from .selectors import environment_version_secret_settings

logger = logging.getLogger(__name__)

Status = EnvironmentVersion.Status
Purpose = EnvironmentProbe.Purpose

# `package.module:ClassName`: what producers pass to importlib and getattr.
ENTRYPOINT_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
# Names appear in URLs, CLI arguments and stream records, so they stay plain.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
# A probe request outlives any sensible queue wait; an expired one is reported as such.
PROBE_REQUEST_TTL_S = 24 * 3600
# Secret settings are keyword arguments, like the ordinary ones.
SECRET_SETTING_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# An API key or token, not a file: the value is copied to Redis for every probe and claimed run.
SECRET_SETTING_MAX_CHARS = 4096
SECRET_SETTINGS_MAX = 32
# Settings the platform checks against the operator's allowlists: a secret one would go unchecked.
CHECKED_SETTINGS = frozenset({"url", "factory"})
# What a version's failed probe means for the apps above this one, each called with
# (version=, reason=) in the transaction that fails it. runs/apps.py registers the runs
# app's rule (its queued runs pinned to the version fail): runs import environments, and
# environments import nothing of runs.
VERSION_FAILED_HANDLERS: list[Callable[..., None]] = []


def _validate_spec(spec: EnvironmentSpec) -> None:
    """Raise InvalidInput naming the field of ``spec`` that cannot work, before any probe runs."""
    if not NAME_PATTERN.match(spec.name):
        raise InvalidInput.for_field(
            "name", "Use letters, digits, '_', '.' and '-', starting with a letter or digit."
        )
    if not ENTRYPOINT_PATTERN.match(spec.entrypoint):
        raise InvalidInput.for_field(
            "entrypoint",
            f"'{spec.entrypoint}' is not of the form 'package.module:ClassName'.",
        )
    # Code a worker would import: only from the modules the operator allows, checked here so
    # that a refused registration never reaches a probe.
    # The adapters are Tandem's own code; the gymnasium one calls the factory it is given.
    adapters = ADAPTER_ENTRYPOINTS.values()
    targets = {} if spec.entrypoint in adapters else {"entrypoint": spec.entrypoint}
    factory = spec.settings.get("factory")
    if spec.entrypoint == ADAPTER_ENTRYPOINTS["gymnasium"] and isinstance(factory, str):
        targets["settings.factory"] = factory
    for field, target in targets.items():
        try:
            check_environment_target(target, allowed=settings.TANDEM_ENVIRONMENT_MODULES)
        except EnvironmentModuleRefused as error:
            raise InvalidInput.for_field(field, str(error)) from None
    # The settings each adapter cannot work without: the contract's table of kinds says which.
    for required in ENVIRONMENT_KINDS[spec.kind].required_settings:
        value = spec.settings.get(required.key)
        if not isinstance(value, str) or not value.strip():
            raise InvalidInput.for_field(
                f"settings.{required.key}", f"Kind '{spec.kind}' needs {required.what}."
            )
    alternatives = ENVIRONMENT_KINDS[spec.kind].exactly_one_of
    given = [setting for setting in alternatives if spec.settings.get(setting.key) not in (None, "")]
    if alternatives and len(given) != 1:
        field = given[1].key if given else alternatives[0].key
        raise InvalidInput.for_field(f"settings.{field}", f"Kind '{spec.kind}' needs exactly one of: " + "; or ".join(
            f"`{setting.key}`, {setting.what}" for setting in alternatives) + ".")
    for setting in given:
        if not isinstance(spec.settings[setting.key], str) or not spec.settings[setting.key].strip():
            raise InvalidInput.for_field(f"settings.{setting.key}", f"Kind '{spec.kind}' needs {setting.what}.")
    command = spec.settings.get("command")
    if spec.kind == "agent" and isinstance(command, str):
        try:
            check_agent_command(command, commands=settings.TANDEM_AGENT_COMMANDS)
        except AgentCommandRefused as error:
            raise InvalidInput.for_field("settings.command", str(error)) from None
    url = spec.settings.get("url")
    if isinstance(url, str):
        try:
            check_environment_url(url, allowlist=settings.TANDEM_ENVIRONMENT_URL_ALLOWLIST,
                                  refuse_private=settings.TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE)
        except EnvironmentURLRefused as error:
            raise InvalidInput.for_field("settings.url", str(error)) from None
    if spec.tool_server is not None and spec.tool_server.command is not None:
        try:
            check_mcp_server(spec.tool_server.command, servers=settings.TANDEM_MCP_SERVERS)
        except McpServerRefused as error:
            raise InvalidInput.for_field("tool_server.command", str(error)) from None
    if spec.tool_server is not None and spec.tool_server.url is not None:
        try:
            check_environment_url(spec.tool_server.url, allowlist=settings.TANDEM_ENVIRONMENT_URL_ALLOWLIST,
                                  refuse_private=settings.TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE,
                                  schemes=MCP_SERVER_URL_SCHEMES)
        except EnvironmentURLRefused as error:
            raise InvalidInput.for_field("tool_server.url", str(error)) from None
    declared = {tool.name for tool in spec.tools}
    for index, call in enumerate(spec.tool_server.probe_calls if spec.tool_server else ()):
        if call.name not in declared:
            raise InvalidInput.for_field(f"tool_server.probe_calls.{index}.name",
                                         f"'{call.name}' is not one of the declared tools.")
    names = set()
    for index, tool in enumerate(spec.tools):
        if not TOOL_NAME_PATTERN.match(tool.name):
            raise InvalidInput.for_field(
                f"tools.{index}.name", f"'{tool.name}' is not a plain identifier."
            )
        if tool.name in names:
            raise InvalidInput.for_field(f"tools.{index}.name", f"'{tool.name}' is declared twice.")
        names.add(tool.name)
        if tool.parameters.get("type") != "object":
            raise InvalidInput.for_field(
                f"tools.{index}.parameters", "Must be a JSON schema of type 'object'."
            )
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as error:
            raise InvalidInput.for_field(
                f"tools.{index}.parameters", f"Not a valid JSON schema: {error.message}"
            ) from None


def _validate_secret_settings(
    spec: EnvironmentSpec, secret_settings: Mapping[str, str], *, kept_from: int | None = None
) -> None:
    """Raise InvalidInput naming ``secret_settings.<name>``; no message ever holds a value.

    ``kept_from``: the version number they were kept from, when the request sent none.
    """
    if len(secret_settings) > SECRET_SETTINGS_MAX:
        raise InvalidInput.for_field("secret_settings", f"At most {SECRET_SETTINGS_MAX} secret settings.")
    kept = f" (kept from version {kept_from}; send secret_settings to replace them)" if kept_from else ""
    for name, value in secret_settings.items():
        field = f"secret_settings.{name}"
        if not SECRET_SETTING_NAME_PATTERN.match(name):
            raise InvalidInput.for_field(field, "A name is a keyword argument: letters, digits and '_'.")
        if name in spec.settings:
            raise InvalidInput.for_field(
                field, f"Also an ordinary setting{kept}; a setting is either secret or not."
            )
        if name in CHECKED_SETTINGS:
            raise InvalidInput.for_field(
                field, f"'{name}' is checked against the operator's allowlist; put it in settings."
            )
        if not isinstance(value, str) or not value or len(value) > SECRET_SETTING_MAX_CHARS:
            raise InvalidInput.for_field(
                field, f"Must be a non-empty string of at most {SECRET_SETTING_MAX_CHARS} characters."
            )
        if "\x00" in value:
            raise InvalidInput.for_field(field, "NUL characters (\\u0000) cannot be stored.")


def _version_create(
    *, environment: Environment, spec: EnvironmentSpec, user: AbstractBaseUser | None, number: int,
    secret_settings: Mapping[str, str], secrets_kept_from: int | None = None,
    baseline: ProbeBaselineRequest | None = None,
) -> EnvironmentVersion:
    _validate_spec(spec)
    _validate_secret_settings(spec, secret_settings, kept_from=secrets_kept_from)
    version = EnvironmentVersion.objects.create(
        environment=environment,
        number=number,
        kind=spec.kind,
        entrypoint=spec.entrypoint,
        settings=spec.settings,
        tools=[tool.model_dump(mode="json") for tool in spec.tools],
        tool_server=_tool_server_record(spec),
        secret_setting_names=sorted(secret_settings),
        max_concurrent_episodes=spec.max_concurrent_episodes,
        created_by=user if user is not None and user.is_authenticated else None,
    )
    if secret_settings:
        EnvironmentVersionSecrets.objects.create(version=version, ciphertext=secret_values_seal(secret_settings))
    environment_probe_request(version=version, purpose=Purpose.REGISTRATION,
                              baseline=baseline or registration_baseline_default())
    return version


def probe_baseline_parse(raw: Mapping | None) -> ProbeBaselineRequest | None:
    """A request's ``baseline`` (``{"model": "<imported model directory>", "episodes": 8, ...}``), checked:
    its fields, and its model directory under the operator's model roots. None: no baseline."""
    if raw is None:
        return None
    try:
        baseline = ProbeBaselineRequest.model_validate(raw)
    except pydantic.ValidationError as error:
        raise InvalidInput.from_pydantic(error, prefix="baseline") from None
    try:
        check_model_path(baseline.model)
    except ModelPathRefused as exc:
        raise InvalidInput.for_field("baseline.model", str(exc)) from None
    return baseline


def registration_baseline_default() -> ProbeBaselineRequest | None:
    """The operator's baseline model for registrations that name none (TANDEM_PROBE_BASELINE_MODEL)."""
    model = settings.TANDEM_PROBE_BASELINE_MODEL
    return ProbeBaselineRequest(model=model) if model else None


@transaction.atomic
def environment_register(
    *, user: AbstractBaseUser, project: Project, spec: EnvironmentSpec,
    secret_settings: Mapping[str, str] | None = None, baseline: ProbeBaselineRequest | None = None,
) -> EnvironmentVersion:
    """Register ``spec`` under a name new in ``project``: the environment and its version 1.

    ``secret_settings`` (name -> value) are keyword arguments like ``spec.settings``, but
    write-only: only their names are ever shown, and only producers and probes get the
    values. The version is probed once the transaction commits; it is ``pending`` until then.
    ``baseline`` (:func:`probe_baseline_parse`): the probe then plays a few episodes of that
    imported model and reports its tool-call rate; None: the operator's default, if any.
    """
    project_require_writer(user=user, project=project)
    secret_settings = secret_settings or {}
    _validate_spec(spec)
    _validate_secret_settings(spec, secret_settings)
    try:
        with transaction.atomic():
            environment = Environment.objects.create(project=project, name=spec.name)
    except IntegrityError:
        message = (
            f"Project '{project.name}' already has an environment named '{spec.name}'; "
            "register a new version of it instead."
        )
        raise Conflict(message, fields={"name": [message]}) from None
    return _version_create(environment=environment, spec=spec, user=user, number=1,
                           secret_settings=secret_settings, baseline=baseline)


@transaction.atomic
def environment_version_register(
    *, user: AbstractBaseUser, environment: Environment, spec: EnvironmentSpec,
    secret_settings: Mapping[str, str] | None = None, baseline: ProbeBaselineRequest | None = None,
) -> EnvironmentVersion:
    """Register ``spec`` (its name is ignored) as the next version of ``environment``; ``baseline``
    as :func:`environment_register`'s.

    ``secret_settings`` None keeps the latest version's (nobody has to send an API key
    again to change a setting); ``{}`` registers the version without any.
    """
    project_require_writer(user=user, project=environment.project)
    # The row lock numbers concurrent registrations one after the other.
    Environment.objects.select_for_update().get(pk=environment.pk)
    latest = environment.versions.order_by("-number").first()
    kept_from = None
    if secret_settings is None:
        secret_settings = {} if latest is None else environment_version_secret_settings(version=latest)
        kept_from = latest.number if secret_settings else None
        if secret_settings and not _same_destination(latest, spec):
            # Else any writer could point the environment at code or a server of their own and
            # be handed a key they can never read.
            raise InvalidInput.for_field("secret_settings", (
                f"This version changes what runs or where it connects (kind, entrypoint, {', '.join(DESTINATION_SETTINGS)}"
                f"): version {latest.number}'s secret settings are not carried over to it; send them again."))
    spec = spec.model_copy(update={"name": environment.name})
    return _version_create(environment=environment, spec=spec, user=user,
                           number=(latest.number if latest else 0) + 1,
                           secret_settings=secret_settings, secrets_kept_from=kept_from, baseline=baseline)


# The settings that say where an environment connects or what it imports.
DESTINATION_SETTINGS = ("url", "factory")


def _same_destination(version: EnvironmentVersion, spec: EnvironmentSpec) -> bool:
    """Whether ``spec`` runs the same code against the same server as ``version``."""
    return (version.kind == spec.kind and version.entrypoint == spec.entrypoint
            and all(version.settings.get(name) == spec.settings.get(name) for name in DESTINATION_SETTINGS))


def _tool_server_record(spec: EnvironmentSpec) -> dict[str, str] | None:
    """``spec``'s tool server as a version stores it: only the transport it names (command or url)."""
    return spec.tool_server.model_dump(mode="json", exclude_defaults=True) if spec.tool_server else None


def _same_definition(version: EnvironmentVersion, spec: EnvironmentSpec) -> bool:
    return (
        version.kind == spec.kind
        and version.entrypoint == spec.entrypoint
        and version.settings == spec.settings
        and version.tools == [tool.model_dump(mode="json") for tool in spec.tools]
        and version.tool_server == _tool_server_record(spec)
        and version.max_concurrent_episodes == spec.max_concurrent_episodes
    )


@transaction.atomic
def environment_ensure(
    *, user: AbstractBaseUser, project: Project, spec: EnvironmentSpec
) -> EnvironmentVersion:
    """The latest version of ``spec.name`` in ``project`` if it is ``spec``; else a new version."""
    environment = Environment.objects.filter(project=project, name=spec.name).first()
    if environment is None:
        return environment_register(user=user, project=project, spec=spec)
    latest = environment.versions.order_by("-number").first()
    if latest is not None and _same_definition(latest, spec):
        return latest
    return environment_version_register(user=user, environment=environment, spec=spec)


def environment_probe_request(
    *, version: EnvironmentVersion, purpose: str, user: AbstractBaseUser | None = None,
    baseline: ProbeBaselineRequest | None = None,
) -> EnvironmentProbe:
    """Ask a worker to probe ``version``; the request is sent when the transaction commits.

    ``baseline``: the imported model whose baseline episodes the probe plays once its checks
    pass (a registration or requested probe; a health check, every minute, never does).
    """
    if user is not None:
        project_require_writer(user=user, project=version.environment.project)
    if purpose == Purpose.HEALTH:
        baseline = None
    with transaction.atomic():
        probe = EnvironmentProbe.objects.create(
            version=version, purpose=purpose,
            baseline_request=baseline.model_dump(mode="json") if baseline is not None else None)
        request = ProbeRequest(
            probe_id=probe.pk,
            purpose=purpose,
            environment=version.to_spec(),
            timeouts=probe_timeouts(),
            url_allowlist=settings.TANDEM_ENVIRONMENT_URL_ALLOWLIST,
            baseline=baseline,
        )
        secret_settings = environment_version_secret_settings(version=version)
        secrets = secrets_record_seal(version_id=version.pk, values=secret_settings) if secret_settings else None
        # robust: the registration stands if Redis is away; the probe then expires, visibly.
        transaction.on_commit(lambda: _probe_send(request, secrets), robust=True)
    return probe


def probe_timeouts() -> ProbeTimeouts:
    return ProbeTimeouts(**settings.TANDEM_PROBE_TIMEOUTS)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)


def _probe_send(request: ProbeRequest, secrets: str | None) -> None:
    """``secrets``: the version's EnvironmentSecrets, sealed (secret_values.secrets_record_seal)."""
    client = _redis()
    try:
        # The secrets first: a worker that finds the request finds them too. Never in the
        # task's arguments, which Celery logs.
        if secrets is not None:
            client.set(probe_environment_secrets_key(request.probe_id), secrets, ex=PROBE_REQUEST_TTL_S)
        client.set(probe_request_key(request.probe_id), request.model_dump_json(), ex=PROBE_REQUEST_TTL_S)
    finally:
        client.close()
    send_task(PROBE, request.probe_id)


def _probe_secrets_delete(probe_id: int) -> None:
    client = _redis()
    try:
        client.delete(probe_environment_secrets_key(probe_id))
    finally:
        client.close()


@dataclass(frozen=True)
class SecretsRotation:
    versions: int  # rows of EnvironmentVersionSecrets re-encrypted
    redis_values: int  # values under tandem:secrets: re-encrypted (a run's, a probe's)
    redis_values_skipped: int  # changed or deleted while rotating, or under no key of the list


def environment_secrets_rotate() -> SecretsRotation:
    """Re-encrypt every stored secret setting, and the Redis copies workers read, under the first key.

    The stored rows change in one transaction, and not at all if any is under no key of
    TANDEM_SECRETS_KEYS (SecretsKeyError). The Redis copies are rewritten only where they
    did not change meanwhile (the platform writes new ones under the first key anyway).
    """
    cipher = platform_secrets_cipher()
    with transaction.atomic():
        rows = list(EnvironmentVersionSecrets.objects.select_for_update().order_by("pk"))
        for row in rows:
            row.ciphertext = cipher.rotate(row.ciphertext)
        EnvironmentVersionSecrets.objects.bulk_update(rows, ["ciphertext"], batch_size=500)
    rotated = skipped = 0
    client = _redis()
    try:
        for key in client.scan_iter(match=f"{KEY_PREFIX}:secrets:*", count=500):
            done, passed = _redis_secrets_rotate(client, key, cipher.rotate)
            rotated, skipped = rotated + done, skipped + passed
    finally:
        client.close()
    return SecretsRotation(versions=len(rows), redis_values=rotated, redis_values_skipped=skipped)


def _redis_secrets_rotate(client: redis.Redis, key: bytes, rotate: Callable[[str], str]) -> tuple[int, int]:
    """Rotate the string or hash at ``key`` unless it changes meanwhile (WATCH); (rotated, skipped)."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            kind = pipe.type(key)
            if kind == b"string":
                values = {None: pipe.get(key)}
            elif kind == b"hash":
                values = pipe.hgetall(key)
            else:
                return 0, 0  # expired meanwhile
            try:
                rotated = {field: rotate(value.decode()) for field, value in values.items()}
            except SecretsKeyError:
                return 0, len(values)
            pipe.multi()
            if kind == b"string":
                pipe.set(key, rotated[None], keepttl=True)
            else:
                pipe.hset(key, mapping=rotated)  # a hash's fields change, its expiry stays
            pipe.execute()
        except redis.WatchError:
            return 0, 1
    return len(rotated), 0


@transaction.atomic
def environment_probe_record(*, report: ProbeReport) -> EnvironmentProbe:
    """Store a worker's probe report and move the version's status by it.

    A registration or requested probe decides ``ready`` or ``failed``; a health
    check moves a version that passed its probe between ``ready`` and
    ``unhealthy``. A second report of the same probe (a redelivered task) changes nothing.
    """
    # The probe's row only: FOR UPDATE over the join would lock the project's row too, which run
    # heartbeats and quota checks take in another order (a deadlock, seen under load).
    probe = (
        EnvironmentProbe.objects.select_for_update(of=("self",))
        .select_related("version__environment__project")
        .filter(pk=report.probe_id)
        .first()
    )
    if probe is None:
        raise NotFound(f"Probe {report.probe_id} not found.")
    if probe.status != EnvironmentProbe.Status.PENDING:
        return probe
    probe.status = (
        EnvironmentProbe.Status.PASSED if report.passed else EnvironmentProbe.Status.FAILED
    )
    probe.checks = [check.model_dump(mode="json") for check in report.checks]
    probe.worker = report.worker
    probe.finished_at = timezone.now()
    probe.duration_s = round(max(report.finished_at - report.started_at, 0.0), 6)
    probe.baseline = report.baseline.model_dump(mode="json") if report.baseline is not None else None
    probe.save(update_fields=["status", "checks", "worker", "finished_at", "duration_s", "baseline"])
    # The version's secret settings for the probe: gone once it is over, not at their TTL.
    transaction.on_commit(lambda: _probe_secrets_delete(probe.pk), robust=True)
    _version_apply_probe(probe, advertised_capacity=report.max_concurrent_episodes)
    alerts_probe_recorded(probe=probe)
    if probe.purpose == Purpose.HEALTH:
        _health_history_trim(version_id=probe.version_id)
    return probe


def _health_history_trim(*, version_id: int) -> None:
    """Beat adds a health probe per version in use every minute; keep the newest only."""
    finished = EnvironmentProbe.objects.filter(
        version_id=version_id, purpose=Purpose.HEALTH
    ).exclude(status=EnvironmentProbe.Status.PENDING)
    old = finished.order_by("-requested_at", "-id").values_list("pk", flat=True)[
        settings.TANDEM_HEALTH_PROBES_KEPT:
    ]
    EnvironmentProbe.objects.filter(pk__in=list(old)).delete()


def _version_apply_probe(probe: EnvironmentProbe, *, advertised_capacity: int | None) -> None:
    version = EnvironmentVersion.objects.select_for_update().get(pk=probe.version_id)
    passed = probe.status == EnvironmentProbe.Status.PASSED
    if passed and version.advertised_max_concurrent_episodes != advertised_capacity:
        # What the environment says now; runs claimed from here on hold to it (EnvironmentSpec).
        version.advertised_max_concurrent_episodes = advertised_capacity
        version.save(update_fields=["advertised_max_concurrent_episodes"])
    if probe.purpose == Purpose.HEALTH:
        if version.status not in (Status.READY, Status.UNHEALTHY):
            return  # a health check never overrules the probe's own verdict
        status = Status.READY if passed else Status.UNHEALTHY
    else:
        status = Status.READY if passed else Status.FAILED
    reason = "" if passed else f"{probe.get_purpose_display()} probe {probe.pk} failed: {probe.failure_message}"
    if (status, reason) == (version.status, version.status_reason):
        return
    version.status, version.status_reason = status, reason
    version.status_changed_at = timezone.now()
    version.save(update_fields=["status", "status_reason", "status_changed_at"])
    transaction.on_commit(lambda: _pause_flag_write(version.pk, status, reason), robust=True)
    if status == Status.FAILED:
        for handler in VERSION_FAILED_HANDLERS:
            handler(version=version, reason=f"Environment {version} failed its probe: {probe.failure_message}")


def _pause_flag_write(version_id: int, status: str, reason: str) -> None:
    """Producers read this flag; a version that is not ready starts no episode."""
    client = _redis()
    try:
        if status in (Status.UNHEALTHY, Status.FAILED):
            client.set(environment_paused_key(version_id), reason or status)
        else:
            client.delete(environment_paused_key(version_id))
    finally:
        client.close()


def environment_probes_expire(*, now=None) -> int:
    """Fail the probes no worker reported on within TANDEM_PROBE_EXPIRY_S (and, for a probe that plays
    a baseline, its ``baseline`` timeout more); returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TANDEM_PROBE_EXPIRY_S)
    baseline_cutoff = cutoff - timedelta(seconds=probe_timeouts().baseline)
    stale = EnvironmentProbe.objects.filter(
        Q(baseline_request__isnull=True, requested_at__lt=cutoff)
        | Q(baseline_request__isnull=False, requested_at__lt=baseline_cutoff),
        status=EnvironmentProbe.Status.PENDING,
    ).values_list("pk", flat=True)
    expired = 0
    for probe_id in list(stale):
        check = ProbeCheck(
            name="report",
            status="failed",
            message=(
                f"no worker reported within {settings.TANDEM_PROBE_EXPIRY_S:g}s; is a `tandem "
                f"worker` consuming the '{PROBE.queue}' queue?"
            ),
        )
        report = ProbeReport(
            probe_id=probe_id, checks=(check,), worker="platform",
            started_at=now.timestamp(), finished_at=now.timestamp(),
        )
        environment_probe_record(report=report)
        expired += 1
    return expired


# Not one transaction: each expired probe and each health probe request commits
# on its own, so one failure leaves the rest of the sweep done.
def environment_health_sweep(*, now=None) -> dict[str, int]:
    """Probe again every version in use that passed its probe; run periodically by Celery beat.

    In use: the latest version of its environment, or pinned by a queued or
    running run. A version with a probe still in flight is left alone. The
    pause flags of versions that are not ready are written again, so a Redis
    that lost them (a restart) pauses dispatch again within one sweep.
    """
    expired = environment_probes_expire(now=now)
    # Through the runs' reverse relation: the version's runs, without importing the runs app.
    active_runs = EnvironmentVersion.objects.filter(
        pk=OuterRef("pk"), runs__status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
    )
    in_flight = EnvironmentProbe.objects.filter(
        version=OuterRef("pk"), status=EnvironmentProbe.Status.PENDING
    )
    latest_numbers = Environment.objects.filter(pk=OuterRef("environment_id")).annotate(
        latest=Max("versions__number")
    ).values("latest")
    candidates = (
        EnvironmentVersion.objects.filter(status__in=[Status.READY, Status.UNHEALTHY])
        .annotate(in_use=Exists(active_runs), in_flight=Exists(in_flight))
        .filter(Q(in_use=True) | Q(number=Subquery(latest_numbers)))
        .filter(in_flight=False)
        .select_related("environment")
    )
    requested = 0
    for version in candidates:
        environment_probe_request(version=version, purpose=Purpose.HEALTH)
        requested += 1
    not_ready = EnvironmentVersion.objects.filter(status__in=[Status.UNHEALTHY, Status.FAILED])
    for version_id, status, reason in not_ready.values_list("pk", "status", "status_reason"):
        _pause_flag_write(version_id, status, reason)
    return {"expired": expired, "health_probes": requested}
