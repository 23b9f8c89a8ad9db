"""Writes of alerts: rules, the hooks that evaluate them where their conditions arise, firings with
their notifications, and webhook delivery attempts.

The hooks (``alerts_run_status_changed``, ``alerts_step_events_recorded``,
``alerts_progress_check``, ``alerts_probe_recorded``) are called by the services
that write what a rule watches, after their write. Each evaluates once that
write commits (``transaction.on_commit``), so a write rolled back fires nothing,
and an error here never undoes the write (``robust=True``: it is logged).

A rule fires once per episode of its condition: the subject's ``AlertCondition``
turns ``active`` when the rule fires and clears when the condition stops holding;
only then can it fire again. This module imports neither runs nor telemetry (they
call it): it reads what it needs of runs through the project's relation.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Membership, Project
from accounts.permissions import project_require_writer
from domain_errors import Conflict, InvalidInput
from environment_registry.models import EnvironmentProbe, EnvironmentVersion
from tandem.contracts import PLATFORM_QUEUE, RunStatus, TrainerStepEvent

from .models import (
    AlertCondition,
    AlertFiring,
    AlertRule,
    Notification,
    WebhookAttempt,
    WebhookDelivery,
)
from .webhooks import WebhookURLRefused, webhook_post, webhook_url_check

logger = logging.getLogger(__name__)

Kind = AlertRule.Kind
WEBHOOK_TASK_NAME = "tandem.alerts.deliver_webhook"

# The run status each status rule waits for.
RUN_STATUS_OF_KIND = {Kind.RUN_FAILED: RunStatus.FAILED, Kind.RUN_FINISHED: RunStatus.FINISHED}
# Kinds judged on each trainer step, and on each probe report.
STEP_KINDS = (Kind.METRIC_THRESHOLD, Kind.TRAINER_IDLE)
PROBE_KINDS = (Kind.PROBE_FAILED, Kind.ENVIRONMENT_UNHEALTHY)
# The series a trainer_idle rule reads (TrainerStepEvent.metric_values): data_wait over wall time.
IDLE_METRIC = "trainer_idle_fraction"
# Which of a rule's settings each kind uses; the others must be left empty.
SETTINGS_OF_KIND: dict[str, tuple[str, ...]] = {
    Kind.RUN_FAILED: (), Kind.RUN_FINISHED: (), Kind.PROBE_FAILED: (), Kind.ENVIRONMENT_UNHEALTHY: (),
    Kind.METRIC_THRESHOLD: ("metric", "comparison", "threshold", "steps"),
    Kind.TRAINER_IDLE: ("threshold", "minutes"),
    Kind.NO_PROGRESS: ("minutes",),
}
RULE_SETTINGS = ("metric", "comparison", "threshold", "steps", "minutes")
EDITABLE_FIELDS = ("name", "kind", "enabled", *RULE_SETTINGS, "webhook_url", "webhook_secret")


def subject_key(kind: str, object_id: int) -> str:
    """How an AlertCondition and an AlertFiring name what they are about: ``run:12``, ``environment_version:3``."""
    return f"{kind}:{object_id}"


# ---- rules ----------------------------------------------------------------------------------------

@transaction.atomic
def alert_rule_create(*, user: AbstractBaseUser, project: Project, name: str, kind: str,
                      enabled: bool = True, metric: str = "", comparison: str = "",
                      threshold: float | None = None, steps: int | None = None, minutes: float | None = None,
                      webhook_url: str = "", webhook_secret: str = "") -> AlertRule:
    project_require_writer(user=user, project=project)
    rule = AlertRule(project=project, name=name.strip(), kind=kind, enabled=enabled, metric=metric.strip(),
                     comparison=comparison, threshold=threshold, steps=steps, minutes=minutes,
                     webhook_url=webhook_url.strip(), webhook_secret=webhook_secret, created_by=user)
    _rule_check(rule)
    return _rule_save(rule)


@transaction.atomic
def alert_rule_update(*, user: AbstractBaseUser, rule: AlertRule, changes: dict[str, Any]) -> AlertRule:
    """Change the fields in ``changes``; a webhook secret left out is kept.

    A changed rule starts over: what its conditions had counted was measured against
    the old definition, so they are forgotten and the rule may fire again.
    """
    project_require_writer(user=user, project=rule.project)
    rule = AlertRule.objects.select_for_update().get(pk=rule.pk)
    for field, value in changes.items():
        if field not in EDITABLE_FIELDS:
            raise InvalidInput.for_field(field, "Not a field of an alert rule that can be changed.")
        setattr(rule, field, value.strip() if isinstance(value, str) and field != "webhook_secret" else value)
    if "kind" in changes:
        # Settings the new kind does not use go, rather than failing the change.
        for field in set(RULE_SETTINGS) - set(SETTINGS_OF_KIND.get(rule.kind, ())) - set(changes):
            setattr(rule, field, "" if field in ("metric", "comparison") else None)
    if changes.get("webhook_url") == "":
        rule.webhook_secret = ""
    _rule_check(rule)
    rule = _rule_save(rule)
    rule.conditions.all().delete()
    return rule


@transaction.atomic
def alert_rule_delete(*, user: AbstractBaseUser, rule: AlertRule) -> None:
    """Delete the rule; its firings, notifications and deliveries stay (a pending delivery fails)."""
    project_require_writer(user=user, project=rule.project)
    rule.delete()


def _rule_save(rule: AlertRule) -> AlertRule:
    try:
        with transaction.atomic():
            rule.save()
    except IntegrityError:
        raise Conflict(f"Project '{rule.project.name}' already has an alert rule named '{rule.name}'.") from None
    return rule


def _rule_check(rule: AlertRule) -> None:
    """Raise InvalidInput naming the first field the rule's kind needs and lacks, or has and must not."""
    if not rule.name:
        raise InvalidInput.for_field("name", "An alert rule needs a name.")
    if rule.kind not in Kind.values:
        raise InvalidInput.for_field("kind", f"Expected one of {', '.join(Kind.values)}.")
    used = SETTINGS_OF_KIND[rule.kind]
    for field in RULE_SETTINGS:
        value = getattr(rule, field)
        if field in used and value in (None, ""):
            raise InvalidInput.for_field(field, f"A {rule.kind} rule needs {field}.")
        if field not in used and value not in (None, ""):
            raise InvalidInput.for_field(field, f"A {rule.kind} rule does not use {field}; leave it out.")
    if "comparison" in used and rule.comparison not in AlertRule.Comparison.values:
        raise InvalidInput.for_field("comparison", "Expected 'above' or 'below'.")
    if "steps" in used and rule.steps < 1:
        raise InvalidInput.for_field("steps", "At least 1 step.")
    if "minutes" in used and not rule.minutes > 0:
        raise InvalidInput.for_field("minutes", "More than 0 minutes.")
    if rule.kind == Kind.TRAINER_IDLE and not 0 <= rule.threshold < 1:
        raise InvalidInput.for_field("threshold", "The idle fraction of a step's wall time: 0 to 1 (0.5 is 50%).")
    if rule.webhook_url:
        try:
            webhook_url_check(rule.webhook_url)
        except WebhookURLRefused as error:
            raise InvalidInput.for_field("webhook_url", str(error)) from None
        if not rule.webhook_secret:
            raise InvalidInput.for_field("webhook_secret", "A webhook needs a secret to sign its posts with.")
    elif rule.webhook_secret:
        raise InvalidInput.for_field("webhook_secret", "A secret signs a webhook's posts: set webhook_url too.")


# ---- hooks: where conditions arise ------------------------------------------------------------------

def alerts_run_status_changed(*, run) -> None:
    """A run's status changed (runs.services.run_transition): judge the run_failed and run_finished rules."""
    seen = _RunSeen(run_id=run.pk, project_id=run.project_id, name=run.name)
    status, reason = run.status, run.status_reason
    transaction.on_commit(lambda: _run_status_evaluate(seen, status=status, reason=reason), robust=True)


def alerts_step_events_recorded(*, run, events: Sequence[TrainerStepEvent]) -> None:
    """A run's trainer steps were stored (telemetry.services.metric_events_record): judge the
    metric_threshold and trainer_idle rules on them, step by step."""
    seen = _RunSeen(run_id=run.pk, project_id=run.project_id, name=run.name)
    events = list(events)
    transaction.on_commit(lambda: _steps_evaluate(seen, events), robust=True)


def alerts_progress_check(*, now=None) -> None:
    """Judge the no_progress rules on every running run (the progress watchdog's beat,
    runs.services.runs_flag_stalled): a run whose step stood still for a rule's minutes fires it."""
    now = now or timezone.now()
    transaction.on_commit(lambda: _progress_evaluate(now), robust=True)


def alerts_probe_recorded(*, probe: EnvironmentProbe) -> None:
    """A probe reported (environment_registry.services.environment_probe_record), its version's status
    moved by it: judge the probe_failed and environment_unhealthy rules."""
    probe_id = probe.pk
    transaction.on_commit(lambda: _probe_evaluate(probe_id), robust=True)


@dataclass(frozen=True)
class _RunSeen:
    run_id: int
    project_id: int
    name: str

    @property
    def label(self) -> str:
        return f"Run '{self.name}' (#{self.run_id})" if self.name else f"Run #{self.run_id}"


def _rules(project_id: int, kinds) -> list[AlertRule]:
    return list(AlertRule.objects.filter(project_id=project_id, kind__in=kinds, enabled=True)
                .select_related("project"))


def _condition_locked(rule: AlertRule, subject: str) -> AlertCondition:
    condition, _ = AlertCondition.objects.get_or_create(rule=rule, subject=subject)
    return AlertCondition.objects.select_for_update().get(pk=condition.pk)


@transaction.atomic
def _observe(rule: AlertRule, subject: str, *, holds: bool, text: str, details: dict,
             run_id: int | None = None, environment_version_id: int | None = None) -> AlertFiring | None:
    """Fire ``rule`` if its condition on ``subject`` starts to hold; re-arm it once it no longer does."""
    if not holds:
        # No row for a condition that never held: most runs never fail.
        AlertCondition.objects.filter(rule=rule, subject=subject, active=True).update(active=False)
        return None
    condition = _condition_locked(rule, subject)
    if condition.active:
        return None
    condition.active = True
    condition.save(update_fields=["active", "updated_at"])
    return alert_fire(rule=rule, subject=subject, text=text, details=details, run_id=run_id,
                      environment_version_id=environment_version_id)


def _run_status_evaluate(seen: _RunSeen, *, status: str, reason: str) -> None:
    for rule in _rules(seen.project_id, RUN_STATUS_OF_KIND):
        awaited = RUN_STATUS_OF_KIND[rule.kind]
        text = f"{seen.label} {awaited}" + (f": {reason}" if reason else ".")
        _observe(rule, subject_key("run", seen.run_id), holds=status == awaited, text=text,
                 details={"status": status, "reason": reason}, run_id=seen.run_id)


@transaction.atomic
def _steps_evaluate(seen: _RunSeen, events: list[TrainerStepEvent]) -> None:
    rules = _rules(seen.project_id, STEP_KINDS)
    if not rules:
        return
    steps = [(event, event.metric_values()) for event in sorted(events, key=lambda event: event.step)]
    for rule in rules:
        condition = _condition_locked(rule, subject_key("run", seen.run_id))
        metric = rule.metric if rule.kind == Kind.METRIC_THRESHOLD else IDLE_METRIC
        for step, values in steps:
            value = values.get(metric)
            # A step without the series (an SFT step has no reward, a diverged loss is not finite)
            # neither extends nor breaks a streak; a step seen before (a retried post, a resumed
            # trainer) counts once.
            if value is None or not math.isfinite(value) or (
                    condition.last_step is not None and step.step <= condition.last_step):
                continue
            condition.last_step = step.step
            if not _past_threshold(rule, value):
                condition.active, condition.streak, condition.streak_started_at = False, 0, None
                continue
            if condition.streak == 0:
                condition.streak_started_at = step.emitted_at - step.wall_s
            condition.streak += 1
            if condition.active or not _streak_long_enough(rule, condition, step):
                continue
            condition.active = True
            alert_fire(rule=rule, subject=condition.subject, run_id=seen.run_id,
                       text=_step_text(rule, seen, condition, step, value),
                       details={"metric": metric, "value": value, "step": step.step, "threshold": rule.threshold,
                                "comparison": rule.comparison or "above", "steps": condition.streak,
                                "seconds": round(step.emitted_at - condition.streak_started_at, 3)})
        condition.save()


def _past_threshold(rule: AlertRule, value: float) -> bool:
    if rule.kind == Kind.TRAINER_IDLE or rule.comparison == AlertRule.Comparison.ABOVE:
        return value > rule.threshold
    return value < rule.threshold


def _streak_long_enough(rule: AlertRule, condition: AlertCondition, step: TrainerStepEvent) -> bool:
    if rule.kind == Kind.METRIC_THRESHOLD:
        return condition.streak >= rule.steps
    # Measured by the trainer's own clock: from the start of the first idle step to this one's end.
    return step.emitted_at - condition.streak_started_at >= rule.minutes * 60


def _step_text(rule: AlertRule, seen: _RunSeen, condition: AlertCondition, step: TrainerStepEvent,
               value: float) -> str:
    if rule.kind == Kind.METRIC_THRESHOLD:
        return (f"{seen.label}: {rule.metric} {rule.comparison} {rule.threshold:g} for {condition.streak} "
                f"steps ({value:.4g} at step {step.step}).")
    return (f"{seen.label}: trainer idle above {rule.threshold:.0%} for {rule.minutes:g} min "
            f"({value:.0%} of step {step.step} waiting for data).")


def _progress_evaluate(now) -> None:
    for rule in AlertRule.objects.filter(kind=Kind.NO_PROGRESS, enabled=True).select_related("project"):
        cutoff = now - timezone.timedelta(minutes=rule.minutes)
        # Through the project's runs, so that this module need not import the runs app.
        stalled = {
            run_id: (name, trainer_step, progress_at)
            for run_id, name, trainer_step, progress_at in rule.project.runs.filter(
                status=RunStatus.RUNNING, progress_at__lt=cutoff,
            ).values_list("pk", "name", "trainer_step", "progress_at")
        }
        active = set(rule.conditions.filter(active=True).values_list("subject", flat=True))
        for run_id, (name, trainer_step, progress_at) in stalled.items():
            subject = subject_key("run", run_id)
            if subject in active:
                continue
            seen = _RunSeen(run_id=run_id, project_id=rule.project_id, name=name)
            minutes_still = (now - progress_at).total_seconds() / 60
            _observe(rule, subject, holds=True, run_id=run_id,
                     text=f"{seen.label}: no progress for {minutes_still:.0f} min (still at step {trainer_step}).",
                     details={"trainer_step": trainer_step, "progress_at": progress_at.isoformat(),
                              "minutes": rule.minutes})
        for subject in active - {subject_key("run", run_id) for run_id in stalled}:
            _observe(rule, subject, holds=False, text="", details={})


def _probe_evaluate(probe_id: int) -> None:
    probe = (EnvironmentProbe.objects.select_related("version__environment").filter(pk=probe_id).first())
    if probe is None or probe.status == EnvironmentProbe.Status.PENDING:
        return
    version = probe.version
    subject = subject_key("environment_version", version.pk)
    failed = probe.status == EnvironmentProbe.Status.FAILED
    for rule in _rules(version.environment.project_id, PROBE_KINDS):
        if rule.kind == Kind.PROBE_FAILED:
            _observe(rule, subject, holds=failed, environment_version_id=version.pk,
                     text=f"Environment {version}: {probe.get_purpose_display().lower()} probe {probe.pk} "
                          f"failed: {probe.failure_message}",
                     details={"probe": probe.pk, "purpose": probe.purpose, "reason": probe.failure_message})
        else:
            unhealthy = version.status == EnvironmentVersion.Status.UNHEALTHY
            _observe(rule, subject, holds=unhealthy, environment_version_id=version.pk,
                     text=f"Environment {version} is unhealthy: {version.status_reason}",
                     details={"status": version.status, "reason": version.status_reason})


# ---- firing ----------------------------------------------------------------------------------------

@transaction.atomic
def alert_fire(*, rule: AlertRule, subject: str, text: str, details: dict, run_id: int | None = None,
               environment_version_id: int | None = None) -> AlertFiring:
    """Record one firing of ``rule``: a notification for each member of its project, and a webhook
    delivery (sent by the platform worker once this commits) if the rule has a webhook."""
    now = timezone.now()
    firing = AlertFiring.objects.create(
        project_id=rule.project_id, rule=rule, rule_name=rule.name, kind=rule.kind, subject=subject,
        run_id=run_id, environment_version_id=environment_version_id, text=text, details=details, fired_at=now,
    )
    members = Membership.objects.filter(project_id=rule.project_id).values_list("user_id", flat=True)
    Notification.objects.bulk_create(
        Notification(user_id=user_id, firing=firing, created_at=now) for user_id in members
    )
    logger.info("alert rule %s fired on %s (firing %s)", rule.pk, subject, firing.pk)
    if rule.webhook_url:
        delivery = WebhookDelivery.objects.create(
            firing=firing, rule=rule, url=rule.webhook_url, body=_webhook_body(rule, firing), created_at=now,
        )
        transaction.on_commit(lambda: _delivery_send(delivery.pk), robust=True)
    return firing


def _webhook_body(rule: AlertRule, firing: AlertFiring) -> str:
    """Slack-compatible: ``text`` is what Slack shows; ``attachments`` its fields; ``alert`` the same for machines."""
    alert = {
        "firing": firing.pk, "rule": rule.pk, "rule_name": rule.name, "kind": rule.kind,
        "project": {"id": rule.project_id, "name": rule.project.name}, "subject": firing.subject,
        "run": firing.run_id, "environment_version": firing.environment_version_id,
        "fired_at": firing.fired_at.isoformat(), "details": firing.details,
    }
    fields = [{"title": "rule", "value": rule.name, "short": True},
              {"title": "kind", "value": rule.get_kind_display(), "short": True},
              {"title": "project", "value": rule.project.name, "short": True},
              *({"title": key, "value": str(value), "short": True} for key, value in firing.details.items())]
    return json.dumps({"text": f"[Tandem] {firing.text}", "attachments": [{"fields": fields}], "alert": alert})


def _delivery_send(delivery_id: int) -> None:
    # Imported here: the task module imports this one. Through the task object rather than by
    # name, so that a Celery app told to run tasks eagerly (the tests) runs it, retries included.
    from .tasks import deliver_webhook

    deliver_webhook.apply_async(args=[delivery_id], queue=PLATFORM_QUEUE)


# ---- notifications ---------------------------------------------------------------------------------

def notification_mark_read(*, notification: Notification) -> Notification:
    """Mark one of the caller's notifications read (the caller's: selectors.notification_get_for_user)."""
    if notification.read_at is None:
        notification.read_at = timezone.now()
        notification.save(update_fields=["read_at"])
    return notification


def notifications_mark_all_read(*, user: AbstractBaseUser) -> int:
    """Mark every unread notification of ``user`` read; returns how many."""
    return Notification.objects.filter(user=user, read_at__isnull=True).update(read_at=timezone.now())


# ---- webhook deliveries ----------------------------------------------------------------------------

@transaction.atomic
def webhook_delivery_attempt(*, delivery_id: int) -> float | None:
    """Post a pending delivery once and record the attempt; returns the seconds to wait before the
    next attempt, or None when the delivery is over (delivered, failed for good, or not pending).

    The delivery's row stays locked during the post, so a redelivered task cannot post it twice at once.
    """
    delivery = (WebhookDelivery.objects.select_for_update(of=("self",)).select_related("rule")
                .filter(pk=delivery_id).first())
    if delivery is None or delivery.status != WebhookDelivery.Status.PENDING:
        return None
    number = delivery.attempts + 1
    started = timezone.now()
    if delivery.rule is None or not delivery.rule.webhook_secret:
        outcome_code, error = None, "the rule was deleted, or its webhook removed, before this attempt"
        delivered, final = False, True
    else:
        result = webhook_post(url=delivery.url, body=delivery.body.encode(), secret=delivery.rule.webhook_secret,
                              delivery_id=delivery.pk)
        outcome_code, error, delivered = result.response_code, result.error, result.delivered
        final = delivered or number >= settings.TANDEM_WEBHOOK_MAX_ATTEMPTS
    finished = timezone.now()
    WebhookAttempt.objects.create(
        delivery=delivery, number=number, response_code=outcome_code, error=error, attempted_at=started,
        outcome=WebhookAttempt.Outcome.DELIVERED if delivered else WebhookAttempt.Outcome.FAILED,
        duration_s=(finished - started).total_seconds(),
    )
    delivery.attempts = number
    if final:
        delivery.status = WebhookDelivery.Status.DELIVERED if delivered else WebhookDelivery.Status.FAILED
        delivery.finished_at = finished
    delivery.save(update_fields=["attempts", "status", "finished_at"])
    if not delivered:
        # The URL is left out: a chat webhook's URL is itself a credential.
        logger.warning("webhook delivery %s of rule %s, attempt %d: %s%s", delivery.pk, delivery.rule_id, number,
                       error, " (gave up)" if final else "")
    return None if final else settings.TANDEM_WEBHOOK_BACKOFF_S * 2 ** (number - 1)
