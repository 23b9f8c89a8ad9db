"""Writes of runs: creation, the status lifecycle, and the trainer's claim and heartbeats."""

from __future__ import annotations

import datetime
import logging
from typing import Any

import pydantic
import redis
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import Project
from accounts.permissions import project_require_writer
from alerts.services import alerts_progress_check, alerts_run_status_changed
from common.domain_errors import Conflict, InvalidInput
from dataset_registry.selectors import dataset_versions_pin
from environment_registry.models import EnvironmentProbe, EnvironmentVersion
from environment_registry.secret_values import secrets_record_seal
from environment_registry.selectors import (
    environment_version_pin,
    environment_version_secret_settings,
)
from tandem.allowlists.model_paths import ModelPathRefused, check_model_config_paths
from tandem.configs.changes import merge_changes
from tandem.configs.memory_plan import check_trainer_memory, trainer_memory_plan
from tandem.configs.quotas import QUOTA_SETTINGS, QuotaExceeded, check_run_quotas
from tandem.configs.run import RunConfig, upgrade_run_config
from tandem.contracts import (
    DEMONSTRATIONS_PROBE_CHECK,
    TERMINAL_RUN_STATUSES,
    TRAINER_HELD_RUN_STATUSES,
    RunStatus,
    TrainerConflictCode,
    TrainerHeartbeat,
    environment_declares_demonstrations,
    probe_check_demonstrates,
    run_environment_secrets_key,
    run_evaluation_secrets_key,
    run_keys,
    run_stop_key,
)

from .models import Run, RunAttempt
from .realtime import run_broadcast_on_commit
from .selectors import run_evaluation_environments, trainer_device_memory

logger = logging.getLogger(__name__)

# The only status changes there are; anything else is refused with a Conflict.
# starting: a trainer claimed the run and is building it; running: its first
# heartbeat came. paused: the trainer checkpointed and let go of it; resuming
# (from paused or failed) queues it again, and the next trainer continues
# from its last checkpoint.
LEGAL_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.STARTING, RunStatus.CANCELLED, RunStatus.FAILED}),
    # Queued again from a trainer-held status: the platform restarts a run whose trainer died.
    RunStatus.STARTING: frozenset({RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.FAILED, RunStatus.CANCELLED,
                                   RunStatus.QUEUED}),
    RunStatus.RUNNING: frozenset({RunStatus.PAUSED, RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELLED,
                                  RunStatus.QUEUED}),
    RunStatus.PAUSED: frozenset({RunStatus.QUEUED, RunStatus.CANCELLED}),
    RunStatus.FINISHED: frozenset(),
    RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
    RunStatus.CANCELLED: frozenset(),
}


def run_config_normalise(config: dict[str, Any] | None) -> dict[str, Any]:
    """``config`` validated against RunConfig, as JSON with every default filled in.

    A config without ``schema_version`` is read as version 1 (the flat shape) and
    upgraded first, so client scripts written before sections keep working.
    """
    try:
        normalised = RunConfig.model_validate(upgrade_run_config(config or {})).model_dump(mode="json")
    except pydantic.ValidationError as error:
        raise InvalidInput.from_pydantic(error, prefix="config") from None
    # Model directories the trainer and producers would read: only under the operator's roots.
    try:
        check_model_config_paths(normalised["model"], roots=settings.TANDEM_MODEL_ROOTS,
                                 refused_root=settings.TANDEM_CHECKPOINT_ROOT)
    except ModelPathRefused as error:
        field, _, message = str(error).partition(": ")
        raise InvalidInput.for_field(f"config.model.{field}", message) from None
    # The trainer creates and deletes model copies in the weight directory: the operator's.
    if normalised["weights"]["dir"] is not None:
        raise InvalidInput.for_field("config.weights.dir", (
            "The filesystem weight transport's directory is an operator setting "
            "(TANDEM_WEIGHT_DIR on the trainer); leave it out."))
    # What the run would ask of the shared trainer and workers: within the operator's caps.
    try:
        check_run_quotas(normalised, settings.TANDEM_RUN_QUOTAS)
        limit_bytes, setting = settings.TANDEM_RUN_QUOTAS.trainer_memory_bytes, QUOTA_SETTINGS["trainer_memory_bytes"]
        device = trainer_device_memory()
        if limit_bytes is None and device is not None:
            limit_bytes, setting = device.bytes, f"the device memory that trainer {device.trainer} reports"
        plan = trainer_memory_plan(normalised, device_platform=device.platform if device else None)
        check_trainer_memory(plan, limit_bytes=limit_bytes, setting=setting)
    except QuotaExceeded as error:
        raise InvalidInput.for_field(error.field, str(error)) from None
    return normalised


def environment_version_demonstrates(version: EnvironmentVersion) -> bool | None:
    """Whether ``version`` has demonstrations: as its kind or class declares, else as its probe found.

    None: nobody has said (a class of the user's own, an HTTP server whose probe has not
    reported on them).
    """
    declared = environment_declares_demonstrations(kind=version.kind, entrypoint=version.entrypoint)
    if declared is not None:
        return declared
    probes = EnvironmentProbe.objects.filter(version=version).exclude(status=EnvironmentProbe.Status.PENDING)
    for checks in probes.order_by("-requested_at", "-id").values_list("checks", flat=True)[:5]:
        for check in checks:
            if check.get("name") == DEMONSTRATIONS_PROBE_CHECK and check.get("status") != "skipped":
                return probe_check_demonstrates(check)
    return None


def _config_references_pin(*, project: Project, version: EnvironmentVersion, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its ``sft.datasets`` and ``evaluation.datasets`` pinned to version numbers; refused
    if SFT would have no data, or a dataset no row of the split it is used for.

    A run with ``sft_steps`` > 0 trains on its datasets, or on the environment's
    demonstrations, or both (by weight); one that has neither is a 400 naming
    ``config.sft_steps``, never an SFT phase skipped without a word.
    """
    sft = config["sft"]
    pinned = dataset_versions_pin(project=project, datasets=sft["datasets"], field="config.sft.datasets",
                                  split="training")
    config = {**config, "sft": {**sft, "datasets": pinned}}
    evaluation = config["evaluation"]
    if evaluation is not None:
        config["evaluation"] = {
            **evaluation,
            "datasets": dataset_versions_pin(project=project, datasets=evaluation["datasets"],
                                             field="config.evaluation.datasets", split="held_out"),
            "environments": _evaluation_environments_pin(project=project, version=version,
                                                         references=evaluation["environments"]),
        }
    if config["sft_steps"] == 0 or pinned:
        return config
    weight = sft["demonstrations_weight"]
    if weight == 0:
        raise InvalidInput.for_field("config.sft_steps", (
            f"{config['sft_steps']} SFT steps with sft.demonstrations_weight 0 and no sft.datasets: "
            "there is nothing to train on. Name a dataset, or set sft_steps to 0."))
    demonstrates = environment_version_demonstrates(version)
    if not demonstrates:
        known = "has no demonstrations" if demonstrates is False else "is not known to have demonstrations"
        raise InvalidInput.for_field("config.sft_steps", (
            f"Environment {version} {known}, and the config names no sft.datasets: {config['sft_steps']} "
            "SFT steps would have nothing to train on. Register a dataset (tandem datasets register) and name "
            "it in sft.datasets, or set sft_steps to 0."))
    return config


def _evaluation_environments_pin(*, project: Project, version: EnvironmentVersion,
                                 references: list[str]) -> list[str]:
    """``evaluation.environments`` as pinned labels (``name@3``); refused naming the entry if the project
    has no such version, its probe failed, or it is the run's own (evaluated by ``evaluation.environment``)."""
    pinned = []
    for index, reference in enumerate(references):
        field = f"config.evaluation.environments.{index}"
        other = environment_version_pin(project=project, reference=reference, field=field)
        if other.pk == version.pk or str(other) in pinned:
            raise InvalidInput.for_field(field, (
                f"{other} is the run's own environment, which evaluation.environment evaluates"
                if other.pk == version.pk else f"{other} is listed twice"))
        pinned.append(str(other))
    return pinned


@transaction.atomic  # the datasets' pins lock their versions (dataset_versions_pin)
def run_config_check(*, user: AbstractBaseUser, project: Project, environment_name: str,
                     config: dict[str, Any] | None) -> tuple[EnvironmentVersion, dict[str, Any]]:
    """The environment version a run of ``config`` would pin, and its config as it would be stored (references
    pinned), creating nothing; raises what :func:`run_create` would for them, the project's quota apart.

    The new-run form's review step asks it, so that what Start would refuse (an SFT dataset without training
    rows) is refused before it."""
    project_require_writer(user=user, project=project)
    # `name` pins the latest version, `name@3` version 3; a failed probe is a Conflict.
    version = environment_version_pin(project=project, reference=environment_name)
    normalised = _config_references_pin(project=project, version=version, config=run_config_normalise(config))
    _refuse_unchecked_start_from(normalised, allowed=None)
    return version, normalised


@transaction.atomic
def run_create(
    *,
    user: AbstractBaseUser,
    project: Project,
    environment_name: str,
    config: dict[str, Any] | None = None,
    name: str = "",
) -> Run:
    """Queue a run of ``environment_name`` (an environment of ``project``, or ``name@version``)."""
    version, normalised = run_config_check(user=user, project=project, environment_name=environment_name,
                                           config=config)
    cap = settings.TANDEM_RUN_QUOTAS.max_active_runs_per_project
    # Locks the project's row: two creations racing for the last place cannot both win.
    Project.objects.select_for_update().filter(pk=project.pk).first()
    active = Run.objects.filter(project=project).exclude(status__in=TERMINAL_RUN_STATUSES).count()
    if active >= cap:
        raise InvalidInput.for_field("project", (
            f"project '{project.name}' has {active} runs that have not ended; this deployment "
            f"allows at most {cap} (TANDEM_MAX_ACTIVE_RUNS_PER_PROJECT)"))
    now = timezone.now()
    name = name.strip() or f"{version.environment.name}-{now:%Y%m%d-%H%M%S}"
    return Run.objects.create(
        project=project,
        environment=version.environment,
        environment_version=version,
        name=name,
        config=normalised,
        created_at=now,
    )


@transaction.atomic
def run_transition(*, run: Run, to_status: str, reason: str = "") -> Run:
    """Move ``run`` to ``to_status`` if LEGAL_TRANSITIONS allows it from its current status.

    The current status is read under a row lock, so two racing transitions (a
    user's cancel and the trainer's finish, say) cannot both win. ``run`` is
    updated in place and returned.
    """
    current = Run.objects.select_for_update().values_list("status", flat=True).get(pk=run.pk)
    run.status = current
    if to_status not in LEGAL_TRANSITIONS[current]:
        raise Conflict(f"Run {run.pk} is {current}; it cannot become {to_status}.")

    now = timezone.now()
    if current in TRAINER_HELD_RUN_STATUSES and to_status not in TRAINER_HELD_RUN_STATUSES:
        # The trainer lets go of the run, or is presumed dead: its attempt ends here.
        RunAttempt.objects.filter(run_id=run.pk, ended_at__isnull=True).update(
            ended_at=now, outcome=to_status, reason=reason,
            trainer_step=Run.objects.filter(pk=run.pk).values_list("progress_step", flat=True).get())
    run.status = to_status
    run.status_reason = reason
    update_fields = ["status", "status_reason"]
    if to_status == RunStatus.RUNNING:
        # The watchdog's clock starts when training does (building and compiling are not stalls).
        run.progress_at = now
        run.stalled_since = None
        update_fields += ["progress_at", "stalled_since"]
    elif current == RunStatus.RUNNING and run.stalled_since is not None:
        run.stalled_since = None
        update_fields.append("stalled_since")
    if to_status == RunStatus.RUNNING and run.started_at is None:
        run.started_at = now
        update_fields.append("started_at")
    if to_status in TERMINAL_RUN_STATUSES:
        run.finished_at = now
        update_fields.append("finished_at")
    if to_status == RunStatus.QUEUED:  # resumed: it is not over, and no trainer holds it
        run.finished_at = None
        run.claimed_by = ""
        # Claimable at once, unless the trainer that gives it back asks otherwise (_run_restart_or_fail).
        run.claimable_after = None
        update_fields += ["finished_at", "claimed_by", "claimable_after"]
    run.save(update_fields=update_fields)
    if to_status in TERMINAL_RUN_STATUSES or to_status == RunStatus.PAUSED:
        run_producers_stop_on_commit(run.pk)
    run_keys_retain_on_commit(run.pk, to_status)
    alerts_run_status_changed(run=run)

    run_broadcast_on_commit(run.pk, [_status_message(run)])
    return run


def runs_fail_queued_of_version(*, version: EnvironmentVersion, reason: str) -> list[Run]:
    """Fail the queued runs pinned to ``version``, which failed its probe: no producer could run them.

    Called by the environment registry when it fails a version (registered in runs/apps.py),
    in the transaction that fails it.
    """
    runs = list(Run.objects.filter(environment_version=version, status=RunStatus.QUEUED))
    for run in runs:
        run_transition(run=run, to_status=RunStatus.FAILED, reason=reason)
    return runs


def run_cancel(*, user: AbstractBaseUser, run: Run) -> Run:
    project_require_writer(user=user, project=run.project)
    return run_transition(run=run, to_status=RunStatus.CANCELLED, reason=f"Cancelled by {user}.")


def run_pause(*, user: AbstractBaseUser, run: Run) -> Run:
    """Ask the trainer to checkpoint and let go of ``run``; it learns so at its next heartbeat."""
    project_require_writer(user=user, project=run.project)
    return run_transition(run=run, to_status=RunStatus.PAUSED, reason=f"Paused by {user}.")


def run_resume(*, user: AbstractBaseUser, run: Run) -> Run:
    """Queue a paused or failed run again; the trainer that claims it continues from its checkpoint."""
    project_require_writer(user=user, project=run.project)
    # Queued from a trainer-held status is the reaper's restart, never a user's: it would take
    # the run from a live trainer. Read under the row lock, as run_transition reads it.
    with transaction.atomic():
        current = Run.objects.select_for_update().values_list("status", flat=True).get(pk=run.pk)
        if current in TRAINER_HELD_RUN_STATUSES:
            raise Conflict(f"Run {run.pk} is {current}; only a paused or failed run can be resumed.")
        return run_transition(run=run, to_status=RunStatus.QUEUED, reason=f"Resumed by {user}.")


RUN_TAGS_MAX = 20
RUN_TAG_LENGTH_MAX = 40
RUN_NOTES_LENGTH_MAX = 10_000


@transaction.atomic
def run_annotate(*, user: AbstractBaseUser, run: Run, tags: list[str] | None = None,
                 notes: str | None = None) -> Run:
    """Replace the run's tags and/or notes (None leaves one as it is); a writer's change, at any status.

    Tags are stripped, blank ones dropped and repeats removed, first spelling kept.
    """
    project_require_writer(user=user, project=run.project)
    changed = []
    if tags is not None:
        kept: list[str] = []
        for tag in (tag.strip() for tag in tags):
            if len(tag) > RUN_TAG_LENGTH_MAX:
                raise InvalidInput.for_field("tags", f"A tag has at most {RUN_TAG_LENGTH_MAX} characters: '{tag}'.")
            if tag and tag.casefold() not in {seen.casefold() for seen in kept}:
                kept.append(tag)
        if len(kept) > RUN_TAGS_MAX:
            raise InvalidInput.for_field("tags", f"A run has at most {RUN_TAGS_MAX} tags.")
        run.tags = kept
        changed.append("tags")
    if notes is not None:
        if len(notes) > RUN_NOTES_LENGTH_MAX:
            raise InvalidInput.for_field("notes", f"Notes have at most {RUN_NOTES_LENGTH_MAX} characters.")
        run.notes = notes.strip()
        changed.append("notes")
    if changed:
        run.save(update_fields=changed)
    return run


def _refuse_unchecked_start_from(config: dict[str, Any], *, allowed: dict[str, Any] | None) -> None:
    """A run starts from another run's checkpoint only as a service that checked it made it so
    (``evaluations.services.evaluation_run_create``: the same project, a kept checkpoint); a
    config naming one itself could read any run's weights."""
    if config.get("start_from") not in (None, allowed):
        raise InvalidInput.for_field("config.start_from", (
            "A run starts from another run's checkpoint through POST /api/runs/<id>/evaluate/ "
            "(tandem eval create), which checks the checkpoint; it cannot be set in a config."))


@transaction.atomic
def run_clone(*, user: AbstractBaseUser, run: Run, config_changes: dict[str, Any] | None = None,
              name: str = "", checked_start_from: dict[str, Any] | None = None) -> Run:
    """A new queued run of the same environment whose config differs from ``run``'s only by ``config_changes``.

    Changes merge into the original config key by key (nested sections too), so
    ``{"algorithm": {"epsilon_high": 0.3}}`` keeps every other algorithm setting.
    Changes without ``schema_version`` are upgraded like a new run's config; the
    original is in the current shape however it was stored (``RunConfigField``).
    ``checked_start_from``: the ``start_from`` a caller checked and may set (a clone
    otherwise keeps the original's, which was checked for the same project).
    """
    project_require_writer(user=user, project=run.project)
    config = merge_changes(run.config, upgrade_run_config(config_changes or {}))
    normalised = _config_references_pin(project=run.project, version=run.environment_version,
                               config=run_config_normalise(config))
    if normalised.get("start_from") != run.config.get("start_from"):
        _refuse_unchecked_start_from(normalised, allowed=checked_start_from)
    return Run.objects.create(
        project=run.project, environment=run.environment, environment_version=run.environment_version,
        config=normalised, name=name.strip() or f"{run.name} (clone)"[:200], created_at=timezone.now(),
    )


def run_reap_dead_trainers(*, heartbeat_timeout_s: float) -> list[Run]:
    """Restart, or fail, the runs whose trainer stopped sending heartbeats ``heartbeat_timeout_s`` ago.

    Such a run is queued again, up to its ``config.max_restarts`` times: the next
    trainer to claim it resumes from its last checkpoint and the stream's pending
    entries. Past them it fails, and the user can still resume it. Either way the
    reason says which trainer went silent and since when; a failed run's producers
    are told to stop.
    """
    cutoff = timezone.now() - timezone.timedelta(seconds=heartbeat_timeout_s)
    reaped = []
    candidates = Run.objects.filter(status__in=TRAINER_HELD_RUN_STATUSES, heartbeat_at__lt=cutoff)
    for run_id in candidates.values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.select_for_update(skip_locked=True).filter(pk=run_id).first()
            # Re-checked under the lock: a heartbeat may have arrived since the scan.
            if run is None or run.status not in TRAINER_HELD_RUN_STATUSES or run.heartbeat_at >= cutoff:
                continue
            silent = (f"Trainer {run.claimed_by or '(unknown)'} sent no heartbeat since "
                      f"{run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC (timeout {heartbeat_timeout_s:g} s)")
            reaped.append(_run_restart_or_fail(run=run, cause=silent))
    return reaped


def _run_restart_or_fail(*, run: Run, cause: str, retry_after_s: float | None = None) -> Run:
    """Queue ``run`` again for the next trainer, a restart counted against ``config.max_restarts``; past
    them, fail it. ``cause`` (why its trainer let go of it) starts the reason. ``retry_after_s``: no
    trainer claims it again before that many seconds (its trainer set it aside to train other runs
    meanwhile). Under the run's row lock."""
    max_restarts = _config_value(run, "max_restarts")
    if run.restarts < max_restarts:
        run.restarts += 1
        run.save(update_fields=["restarts"])
        claimable_after = (timezone.now() + datetime.timedelta(seconds=retry_after_s)
                           if retry_after_s else None)
        wait = f", claimable from {claimable_after:%Y-%m-%d %H:%M:%S} UTC" if claimable_after else ""
        reason = (f"{cause}; restart {run.restarts} of {max_restarts}: queued again{wait}, the next "
                  "trainer resumes from the last checkpoint.")
        logger.warning("run %s: %s", run.pk, reason)
        run = run_transition(run=run, to_status=RunStatus.QUEUED, reason=reason)
        if claimable_after is not None:
            run.claimable_after = claimable_after
            run.save(update_fields=["claimable_after"])
        return run
    reason = (f"{cause}; no restarts left (config.max_restarts={max_restarts}): resume the run "
              "to continue from its last checkpoint.")
    return run_transition(run=run, to_status=RunStatus.FAILED, reason=reason)


def _config_value(run: Run, name: str):
    """A top-level setting of the run's stored config, or its default where the config predates it."""
    return run.config.get(name, RunConfig.model_fields[name].default)


def runs_flag_stalled(*, now=None) -> list[Run]:
    """Flag running runs whose trainer step has not advanced for their ``config.stall_timeout_s``.

    The progress watchdog: a trainer that still heartbeats but no longer trains (a
    deadlock, a producer fleet that never delivers) would otherwise keep its run
    "running" forever. The flag (``stalled_since``) shows on the run's page and in
    the API; it is cleared when the step advances. Returns the runs newly flagged.
    """
    now = now or timezone.now()
    flagged = []
    # The shortest timeout a config may set bounds the scan; each run's own is checked below.
    shortest_s = min(meta.ge for meta in RunConfig.model_fields["stall_timeout_s"].metadata if hasattr(meta, "ge"))
    candidates = Run.objects.filter(status=RunStatus.RUNNING, stalled_since__isnull=True,
                                    progress_at__lt=now - timezone.timedelta(seconds=shortest_s))
    for run_id in candidates.values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.select_for_update(skip_locked=True).filter(pk=run_id).first()
            if run is None or run.status != RunStatus.RUNNING or run.stalled_since is not None:
                continue
            timeout_s = _config_value(run, "stall_timeout_s")
            if run.progress_at is None or (now - run.progress_at).total_seconds() < timeout_s:
                continue
            run.stalled_since = run.progress_at
            run.save(update_fields=["stalled_since"])
            logger.warning("run %s stalled: no step past %d since %s (stall_timeout_s %g)", run.pk,
                           run.trainer_step, run.progress_at, timeout_s)
            run_broadcast_on_commit(run.pk, [_status_message(run)])
            flagged.append(run)
    # The no_progress alert rules keep minutes of their own, apart from each run's stall_timeout_s.
    alerts_progress_check(now=now)
    return flagged


def run_producers_stop_on_commit(run_id: int) -> None:
    """Once the transaction commits, tell producers to start no more episodes of ``run_id``.

    The trainer sets the same key when it lets go of a run; this covers a
    trainer that died, or a run cancelled before any trainer held it. The
    environment's secret settings go too: no producer of the run needs them now.
    """

    def stop(client: redis.Redis) -> None:
        client.set(run_stop_key(run_id), "1")
        client.delete(run_environment_secrets_key(run_id), run_evaluation_secrets_key(run_id))

    _redis_on_commit(stop, f"could not tell producers to stop run {run_id}")


def run_environment_secrets_publish_on_commit(run: Run) -> None:
    """Once the claim commits, write the secret settings of ``run``'s environment version for its producers.

    The trainer's claim carries only their names; producers read them from their own key
    (workers/producer.py), deleted when the run stops its producers and written again
    at the next claim. The key also expires after TANDEM_RELEASED_RUN_KEYS_RETENTION_S,
    so that a deletion Redis missed does not keep a key there for good.
    """
    retention_s = int(settings.TANDEM_RELEASED_RUN_KEYS_RETENTION_S)
    version = run.environment_version
    if version.secret_setting_names:
        payload = _secrets_payload(version)
        _redis_on_commit(lambda client: client.set(run_environment_secrets_key(run.pk), payload, ex=retention_s),
                         f"could not write the secret settings of run {run.pk}'s environment")
    # Those of the other environments its evaluations run on, by version id, in one hash.
    evaluated = {str(other.pk): _secrets_payload(other) for other in run_evaluation_environments(run)
                 if other.secret_setting_names}
    if evaluated:
        key = run_evaluation_secrets_key(run.pk)

        def write(client: redis.Redis) -> None:
            with client.pipeline(transaction=True) as pipe:
                pipe.delete(key).hset(key, mapping=evaluated).expire(key, retention_s).execute()

        _redis_on_commit(write, f"could not write the secret settings of run {run.pk}'s evaluation environments")


def _secrets_payload(version: EnvironmentVersion) -> str:
    """The sealed EnvironmentSecrets of ``version`` (ciphertext, as in the database), for its producers."""
    return secrets_record_seal(version_id=version.pk, values=environment_version_secret_settings(version=version))


def _redis_on_commit(write, failure: str) -> None:
    """Once the transaction commits, ``write(client)`` to Redis; a Redis error is logged as ``failure``."""

    def run() -> None:
        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)
            try:
                write(client)
            finally:
                client.close()
        except redis.RedisError:
            logger.exception(failure)

    transaction.on_commit(run)


def run_keys_retain_on_commit(run_id: int, status: str) -> None:
    """Once the transaction commits, set how long the run's Redis keys live in ``status``.

    A finished or cancelled run's keys (its streams, weights blob, spec...) expire after
    TANDEM_ENDED_RUN_KEYS_RETENTION_S; a paused or failed one's after the longer
    TANDEM_RELEASED_RUN_KEYS_RETENTION_S, since a resume needs them; a run queued again
    (resumed) keeps its keys for good. Redis itself must never evict them (docs/deploy.md).
    """
    if status in (RunStatus.FINISHED, RunStatus.CANCELLED):
        retention = settings.TANDEM_ENDED_RUN_KEYS_RETENTION_S
    elif status in (RunStatus.PAUSED, RunStatus.FAILED):
        retention = settings.TANDEM_RELEASED_RUN_KEYS_RETENTION_S
    elif status == RunStatus.QUEUED:
        retention = None
    else:
        return

    def retain(client: redis.Redis) -> None:
        with client.pipeline(transaction=False) as pipe:
            for key in run_keys(run_id):
                if retention is None:
                    pipe.persist(key)
                else:
                    pipe.expire(key, retention)
            pipe.execute()

    _redis_on_commit(retain, f"could not set the retention of run {run_id}'s Redis keys")


@transaction.atomic
def run_claim_next(*, worker: str, now: datetime.datetime | None = None) -> Run | None:
    """Start the oldest claimable queued run on behalf of trainer ``worker``; None if there is none.

    SKIP LOCKED lets two trainers claim at once without waiting on, or taking,
    the same run. A trainer that claims while it holds a run already (the reply to its
    claim was lost, and it asked again) gets that run back, not a second one. A run set
    aside until ``claimable_after`` waits till then, and the runs behind it are claimed
    meanwhile. ``now``: the clock that is compared with it (tests set it).
    """
    held = Run.objects.filter(status__in=TRAINER_HELD_RUN_STATUSES, claimed_by=worker).order_by("id").first()
    if held is not None:
        return held
    now = now or timezone.now()
    run = (
        Run.objects.select_for_update(skip_locked=True)
        # A run waits while its environment version's probe is pending or it is unhealthy.
        .filter(status=RunStatus.QUEUED, environment_version__status=EnvironmentVersion.Status.READY)
        .filter(Q(claimable_after__isnull=True) | Q(claimable_after__lte=now))
        .order_by("created_at", "id")
        .first()
    )
    if run is None:
        return None
    run_transition(run=run, to_status=RunStatus.STARTING, reason=f"Claimed by trainer {worker}.")
    run.claimed_by = worker
    run.heartbeat_at = timezone.now()
    run.attempts += 1
    run.progress_step = 0  # the new attempt's steps count from its checkpoint
    run.claimable_after = None
    run.save(update_fields=["claimed_by", "heartbeat_at", "attempts", "progress_step", "claimable_after"])
    RunAttempt.objects.create(run=run, number=run.attempts, trainer=worker, started_at=run.heartbeat_at)
    run_environment_secrets_publish_on_commit(run)
    return run


@transaction.atomic
def run_heartbeat(*, run: Run, heartbeat: TrainerHeartbeat) -> Run:
    """Record the trainer's progress and, when it says so, finish or fail the run.

    A run that already ended (a user cancelled it, say) is left as it is and
    returned, so the trainer reads the status and stops: cancel wins.
    """
    # The run's row only: every heartbeat locking its project's row would serialise a project's runs
    # and deadlock with probe reports and quota checks that lock it in another order.
    run = Run.objects.select_for_update(of=("self",)).select_related("project").get(pk=run.pk)
    # Every heartbeat names its trainer: an unnamed one cannot pass for the holder.
    if run.claimed_by and heartbeat.worker != run.claimed_by:
        # The run was presumed dead and resumed by another trainer: this one must stop.
        raise Conflict(f"Run {run.pk} is held by trainer {run.claimed_by}, not {heartbeat.worker}.",
                       code=TrainerConflictCode.RUN_HELD_BY_ANOTHER_TRAINER)
    if run.is_terminal or run.status == RunStatus.PAUSED:
        return run
    if run.status == RunStatus.QUEUED:
        raise Conflict(f"Run {run.pk} is queued; claim it before reporting on it.",
                       code=TrainerConflictCode.RUN_NOT_CLAIMED)

    run.heartbeat_at = timezone.now()
    # max(): a late heartbeat must not move progress back behind newer telemetry.
    run.policy_version = max(run.policy_version, heartbeat.policy_version)
    run.save(update_fields=["heartbeat_at", "policy_version",
                            *_advance_step(run, heartbeat.trainer_step, run.heartbeat_at)])
    if heartbeat.status is None:
        return run
    if heartbeat.status == RunStatus.QUEUED:
        # The trainer lost a part of itself (a process of its JAX job), not the run, or it sets the run
        # aside for retry_after_s (the platform kept failing a read of its data): a restart, as the
        # reaper makes one for a trainer that died.
        return _run_restart_or_fail(
            run=run, cause=f"Trainer {heartbeat.worker or '(unknown)'} {heartbeat.message or 'gave the run back'}",
            retry_after_s=heartbeat.retry_after_s)
    if run.status == RunStatus.STARTING and heartbeat.status != RunStatus.FAILED:
        run_transition(run=run, to_status=RunStatus.RUNNING, reason="")
    if heartbeat.status == RunStatus.FINISHED:
        run_transition(run=run, **_finished_outcome(run, heartbeat.message))
    elif heartbeat.status != RunStatus.RUNNING:
        run_transition(run=run, to_status=heartbeat.status, reason=heartbeat.message)
    return run


def _finished_outcome(run: Run, message: str) -> dict[str, str]:
    """How a run its trainer finished ends: finished, unless evaluations of it came back incomplete.

    The trainer posts its last evaluations before it reports the end. A run that only evaluates (no
    SFT or RL step) and whose evaluation is incomplete did not do its one job: it fails, with the
    evaluation's reason. A training run that trained every step
    finishes, its reason naming the incomplete evaluations, never hiding them under a plain finished.
    """
    incomplete = run.evaluations.filter(status="incomplete").order_by("index")
    if not incomplete.exists():
        return {"to_status": RunStatus.FINISHED, "reason": message}
    count = incomplete.count()
    details = "; ".join(
        f"evaluation {evaluation.index} of {evaluation.environment or 'the run'} at step {evaluation.step}: "
        f"{evaluation.episodes} of {evaluation.tasks * evaluation.samples_per_task} episodes"
        + (f" ({evaluation.reason})" if evaluation.reason else "")
        for evaluation in incomplete[:3])
    more = f"; and {count - 3} more" if count > 3 else ""
    evaluation_only = not run.config.get("sft_steps") and not run.config.get("rl_steps")
    if evaluation_only:
        return {"to_status": RunStatus.FAILED,
                "reason": f"Its evaluation is incomplete: {details}{more}."[:2000]}
    return {"to_status": RunStatus.FINISHED,
            "reason": f"Finished with {count} incomplete evaluation{'s' if count > 1 else ''}: {details}{more}."[:2000]}


@transaction.atomic
def run_progress_record(*, run: Run, trainer_step: int, policy_version: int, at=None) -> Run:
    """Move a running run's step and policy version forward to what its telemetry reports.

    Telemetry posts count as heartbeats. Progress only grows (a late post never
    moves it back), and only while the run runs: events that arrive after a
    cancel are kept by telemetry but do not revive the run. The caller may hold
    the run's row lock already (telemetry takes it first, to order its posts).
    """
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status != RunStatus.RUNNING:
        return run
    run.policy_version = max(run.policy_version, policy_version)
    run.heartbeat_at = at or timezone.now()
    run.save(update_fields=["policy_version", "heartbeat_at", *_advance_step(run, trainer_step, run.heartbeat_at)])
    return run


def _advance_step(run: Run, trainer_step: int, now) -> list[str]:
    """Move ``run``'s step up to ``trainer_step`` (never back); the fields changed, for ``save``.

    A step past the current attempt's last (``progress_step``) restarts the progress
    watchdog's clock and clears its flag, though a resumed trainer's may lie below the
    run's highest step.
    """
    if trainer_step <= run.progress_step:
        return []
    was_stalled = run.stalled_since is not None
    run.progress_step, run.progress_at, run.stalled_since = trainer_step, now, None
    run.trainer_step = max(run.trainer_step, trainer_step)
    if was_stalled:
        logger.info("run %s advanced to step %d: no longer stalled", run.pk, trainer_step)
        run_broadcast_on_commit(run.pk, [_status_message(run)])
    return ["trainer_step", "progress_step", "progress_at", "stalled_since"]


def _status_message(run: Run) -> dict:
    return {
        "type": "status",
        "run": run.pk,
        "status": run.status,
        "status_reason": run.status_reason,
        "policy_version": run.policy_version,
        "trainer_step": run.trainer_step,
        "stalled_since": run.stalled_since.isoformat() if run.stalled_since else None,
    }
