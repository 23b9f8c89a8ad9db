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

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime, timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from accounts.models import Membership, Project
from accounts.permissions import project_require_writer
from common.domain_errors import Conflict, InvalidInput
from environment_registry.models import EnvironmentProbe, EnvironmentVersion
from tandem.contracts import RunStatus, TrainerStepEvent, tool_call_rates

from .models import (
    AlertCondition,
    AlertFiring,
    AlertRule,
    Notification,
    WebhookAttempt,
    WebhookDelivery,
)
from .realtime import notifications_changed_on_commit
from .selectors import run_alert_change, subject_key
from .webhooks import PostResult, WebhookURLRefused, slack_escape, webhook_post, webhook_url_check

logger = logging.getLogger(__name__)

Kind = AlertRule.Kind
Delivery = WebhookDelivery.Status
# The window of TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE, and its counters' key (in the Redis cache).
RATE_WINDOW_S = 60
RATE_KEY = "alerts:webhook-posts:{url_hash}:{window}"

# The run status each status rule waits for.
RUN_STATUS_OF_KIND = {Kind.RUN_FAILED: RunStatus.FAILED, Kind.RUN_FINISHED: RunStatus.FINISHED}
# Kinds judged on each trainer step, and on each probe report.
STEP_KINDS = (Kind.METRIC_THRESHOLD, Kind.TRAINER_IDLE, Kind.TOOLS_UNUSED)
PROBE_KINDS = (Kind.PROBE_FAILED, Kind.ENVIRONMENT_UNHEALTHY)
# The series a trainer_idle rule reads (TrainerStepEvent.metric_values): data_wait over wall time.
IDLE_METRIC = "trainer_idle_fraction"
# Which of a rule's settings each kind uses; the others must be left empty.
SETTINGS_OF_KIND: dict[str, tuple[str, ...]] = {
    Kind.RUN_FAILED: (), Kind.RUN_FINISHED: (), Kind.PROBE_FAILED: (), Kind.ENVIRONMENT_UNHEALTHY: (),
    Kind.METRIC_THRESHOLD: ("metric", "comparison", "threshold", "steps"),
    Kind.TRAINER_IDLE: ("threshold", "minutes"),
    Kind.NO_PROGRESS: ("minutes",),
    Kind.TOOLS_UNUSED: ("steps",),
}
# The tools_unused rule every project starts with (alert_default_rules_create): on, and editable.
DEFAULT_TOOLS_UNUSED_RULE = {"name": "Tools unused", "kind": Kind.TOOLS_UNUSED, "steps": 10}
RULE_SETTINGS = ("metric", "comparison", "threshold", "steps", "minutes")
# A rule's cooldown, at most: a week.
MAX_COOLDOWN_MINUTES = 7 * 24 * 60
EDITABLE_FIELDS = ("name", "kind", "enabled", *RULE_SETTINGS, "run", "cooldown_minutes", "webhook_url",
                   "webhook_secret")
# Kinds judged on a run, which a rule may scope to one run (alert_rule_create's ``run``).
RUN_KINDS = (*RUN_STATUS_OF_KIND, *STEP_KINDS, Kind.NO_PROGRESS)


# ---- rules ----------------------------------------------------------------------------------------

@transaction.atomic
def alert_rule_create(*, user: AbstractBaseUser, project: Project, name: str, kind: str,
                      enabled: bool = True, metric: str = "", comparison: str = "",
                      threshold: float | None = None, steps: int | None = None, minutes: float | None = None,
                      run: int | None = None, cooldown_minutes: float | None = None,
                      webhook_url: str = "", webhook_secret: str = "") -> AlertRule:
    project_require_writer(user=user, project=project)
    rule = AlertRule(project=project, name=name.strip(), kind=kind, enabled=enabled, metric=metric.strip(),
                     comparison=comparison, threshold=threshold, steps=steps, minutes=minutes, run_id=run,
                     cooldown_minutes=cooldown_minutes, webhook_url=webhook_url.strip(),
                     webhook_secret=webhook_secret, created_by=user)
    _rule_check(rule)
    cap = settings.TANDEM_MAX_ALERT_RULES_PER_PROJECT
    # Locks the project's row: two creations racing for the last place cannot both win.
    Project.objects.select_for_update().filter(pk=project.pk).first()
    rules = AlertRule.objects.filter(project=project).count()
    if rules >= cap:
        raise InvalidInput.for_field("project", (
            f"project '{project.name}' has {rules} alert rules; this deployment allows at most {cap} "
            f"(TANDEM_MAX_ALERT_RULES_PER_PROJECT): delete one first"))
    return _rule_save(rule)


def alert_default_rules_create(*, project: Project) -> None:
    """The rules a new project starts with, on, which its writers may change or delete: tools_unused,
    so that a policy that answers without the tools its environment offers is said out loud."""
    AlertRule.objects.create(project=project, **DEFAULT_TOOLS_UNUSED_RULE)


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
        if field == "run":
            rule.run_id = value
            continue
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
    if rule.run_id is not None:
        if rule.kind not in RUN_KINDS:
            raise InvalidInput.for_field("run", f"A {rule.kind} rule is about environments, not runs: leave run out.")
        # Through the project's runs, so that this module need not import the runs app.
        if not rule.project.runs.filter(pk=rule.run_id).exists():
            raise InvalidInput.for_field("run", f"Project '{rule.project.name}' has no run #{rule.run_id}.")
    if rule.cooldown_minutes is not None and not 0 < rule.cooldown_minutes <= MAX_COOLDOWN_MINUTES:
        raise InvalidInput.for_field("cooldown_minutes", f"More than 0 and at most {MAX_COOLDOWN_MINUTES} minutes "
                                                         "(a week), or null for none.")
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


def alerts_step_events_recorded(*, run, events: Sequence[TrainerStepEvent],
                                on_change: Callable[[list[dict]], None] | None = None) -> None:
    """A run's trainer steps were stored (telemetry.services.metric_events_record): judge the
    metric_threshold, trainer_idle and tools_unused rules on them, step by step.

    ``on_change`` hears, once they are judged, of each of the run's alerts that started or stopped
    holding (as :func:`run_alert_change` describes it), so the run's open pages can show it.
    """
    seen = _RunSeen(run_id=run.pk, project_id=run.project_id, name=run.name)
    events = list(events)

    def evaluate() -> None:
        changes = _steps_evaluate(seen, events)
        if changes and on_change is not None:
            on_change(changes)

    transaction.on_commit(evaluate, robust=True)


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


def _rules(project_id: int, kinds, *, run_id: int | None = None) -> list[AlertRule]:
    """The project's enabled rules of ``kinds`` that judge run ``run_id`` (those of every run, and those
    scoped to it); without ``run_id``, those scoped to no run."""
    rules = AlertRule.objects.filter(project_id=project_id, kind__in=kinds, enabled=True)
    rules = rules.filter(Q(run__isnull=True) | Q(run_id=run_id)) if run_id is not None else rules.filter(
        run__isnull=True)
    return list(rules.select_related("project"))


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
    for rule in _rules(seen.project_id, RUN_STATUS_OF_KIND, run_id=seen.run_id):
        awaited = RUN_STATUS_OF_KIND[rule.kind]
        text = f"{seen.label} {awaited}" + (f": {reason}" if reason else ".")
        _observe(rule, subject_key("run", seen.run_id), holds=status == awaited, text=text,
                 details={"status": status, "reason": reason}, run_id=seen.run_id)


@transaction.atomic
def _steps_evaluate(seen: _RunSeen, events: list[TrainerStepEvent]) -> list[dict]:
    """Judge the step rules; returns the run's alerts that started or stopped holding (run_alert_change)."""
    rules = _rules(seen.project_id, STEP_KINDS, run_id=seen.run_id)
    changes: list[dict] = []
    if not rules:
        return changes
    steps = [(event, event.metric_values()) for event in sorted(events, key=lambda event: event.step)]
    for rule in rules:
        condition = _condition_locked(rule, subject_key("run", seen.run_id))
        was_active, firing = condition.active, None
        metric = rule.metric if rule.kind == Kind.METRIC_THRESHOLD else IDLE_METRIC
        for step, values in steps:
            if rule.kind == Kind.TOOLS_UNUSED:
                # The least used of the step's environments that offer tools (none: an SFT step, or
                # no tools, which neither extends nor breaks a streak).
                metric, value = min(tool_call_rates(values).items(), key=lambda item: item[1],
                                    default=(None, None))
            else:
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
            firing = alert_fire(rule=rule, subject=condition.subject, run_id=seen.run_id,
                               text=_step_text(rule, seen, condition, step, value, metric),
                               details={"metric": metric, "value": value, "step": step.step, "threshold": rule.threshold,
                                        "comparison": rule.comparison or "above", "steps": condition.streak,
                                        "seconds": round(step.emitted_at - condition.streak_started_at, 3)})
        condition.save()
        if firing is not None or (was_active and not condition.active):
            changes.append(run_alert_change(rule, active=condition.active, firing=firing if condition.active else None))
    return changes


def _past_threshold(rule: AlertRule, value: float) -> bool:
    if rule.kind == Kind.TOOLS_UNUSED:
        return value == 0
    if rule.kind == Kind.TRAINER_IDLE or rule.comparison == AlertRule.Comparison.ABOVE:
        return value > rule.threshold
    return value < rule.threshold


def _streak_long_enough(rule: AlertRule, condition: AlertCondition, step: TrainerStepEvent) -> bool:
    if rule.kind in (Kind.METRIC_THRESHOLD, Kind.TOOLS_UNUSED):
        return condition.streak >= rule.steps
    # Measured by the trainer's own clock: from the start of the first idle step to this one's end.
    return step.emitted_at - condition.streak_started_at >= rule.minutes * 60


def _step_text(rule: AlertRule, seen: _RunSeen, condition: AlertCondition, step: TrainerStepEvent,
               value: float, metric: str) -> str:
    if rule.kind == Kind.METRIC_THRESHOLD:
        return (f"{seen.label}: {rule.metric} {rule.comparison} {rule.threshold:g} for {condition.streak} "
                f"steps ({value:.4g} at step {step.step}).")
    if rule.kind == Kind.TOOLS_UNUSED:
        environment = metric.split("/")[1]
        return (f"{seen.label}: the policy has called none of environment {environment}'s tools for "
                f"{condition.streak} steps (up to step {step.step}): it answers without them.")
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
            if subject in active or rule.run_id not in (None, run_id):
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
    delivery (sent by the webhooks worker once this commits) if the rule has a webhook."""
    now = timezone.now()
    held_back_reason = _cooldown_reason(rule, subject, now=now)
    firing = AlertFiring.objects.create(
        project_id=rule.project_id, rule=rule, rule_name=rule.name, kind=rule.kind, subject=subject,
        run_id=run_id, environment_version_id=environment_version_id, text=text, details=details, fired_at=now,
        held_back_reason=held_back_reason,
    )
    if held_back_reason:
        logger.info("alert rule %s held back on %s (firing %s): %s", rule.pk, subject, firing.pk, held_back_reason)
        return firing
    members = list(Membership.objects.filter(project_id=rule.project_id).values_list("user_id", flat=True))
    Notification.objects.bulk_create(
        Notification(user_id=user_id, firing=firing, created_at=now) for user_id in members
    )
    notifications_changed_on_commit(members)
    logger.info("alert rule %s fired on %s (firing %s)", rule.pk, subject, firing.pk)
    if rule.webhook_url:
        delivery = WebhookDelivery.objects.create(
            firing=firing, rule=rule, url=rule.webhook_url, body=_webhook_body(rule, firing), created_at=now,
        )
        transaction.on_commit(lambda: _delivery_send(delivery.pk), robust=True)
    return firing


def _dashboard_url(name: str, **kwargs) -> str:
    """A dashboard page's address for a reader outside it (TANDEM_PUBLIC_URL, else its path)."""
    return settings.TANDEM_PUBLIC_URL + reverse(name, kwargs=kwargs)


def _cooldown_reason(rule: AlertRule, subject: str, *, now) -> str:
    """Why a firing of ``rule`` on ``subject`` now is held back: its last sent firing there is within the rule's
    cooldown (empty: it is not)."""
    if rule.cooldown_minutes is None:
        return ""
    last = (AlertFiring.objects.filter(rule=rule, subject=subject, held_back_reason="")
            .order_by("-fired_at").values_list("fired_at", flat=True).first())
    if last is None or now - last >= timezone.timedelta(minutes=rule.cooldown_minutes):
        return ""
    return (f"within the rule's cooldown of {rule.cooldown_minutes:g} min: it last notified "
            f"{(now - last).total_seconds():.0f} s ago")


def _webhook_body(rule: AlertRule, firing: AlertFiring) -> str:
    """Slack-compatible: ``text`` is what Slack shows; ``attachments`` its fields; ``alert`` the same for machines."""
    alert = {
        "firing": firing.pk, "rule": rule.pk, "rule_name": rule.name, "kind": rule.kind,
        "project": {"id": rule.project_id, "name": rule.project.name}, "subject": firing.subject,
        "run": firing.run_id, "environment_version": firing.environment_version_id,
        "fired_at": firing.fired_at.isoformat(), "details": firing.details,
        "run_url": _dashboard_url("run-page", run_id=firing.run_id) if firing.run_id is not None else None,
    }
    # What Slack renders is escaped: run names, rule names and environments' errors are anyone's
    # text, and must not mention @channel or disguise a link. ``alert`` keeps the exact values.
    fields = [{"title": "rule", "value": rule.name, "short": True},
              {"title": "kind", "value": rule.get_kind_display(), "short": True},
              {"title": "project", "value": rule.project.name, "short": True},
              *([{"title": "run", "value": alert["run_url"], "short": False}] if alert["run_url"] else []),
              *({"title": key, "value": str(value), "short": True} for key, value in firing.details.items())]
    fields = [{**entry, "title": slack_escape(entry["title"]), "value": slack_escape(entry["value"])}
              for entry in fields]
    return json.dumps({"text": f"[Tandem] {slack_escape(firing.text)}", "attachments": [{"fields": fields}],
                       "alert": alert})


def _delivery_send(delivery_id: int) -> None:
    # Imported here: the task module imports this one. Through the task object rather than by
    # name, so that a Celery app told to run tasks eagerly (the tests) runs it, retries included.
    from .tasks import deliver_webhook

    deliver_webhook.apply_async(args=[delivery_id])  # to its queue (tandem.contracts.WEBHOOK_DELIVERY)


# ---- notifications ---------------------------------------------------------------------------------

def notification_mark_read(*, notification: Notification) -> Notification:
    """Mark one of the caller's notifications read (the caller's: selectors.notification_get_for_user)."""
    if notification.read_at is None:
        notification.read_at = timezone.now()
        notification.save(update_fields=["read_at"])
        notifications_changed_on_commit([notification.user_id])
    return notification


def notifications_mark_all_read(*, user: AbstractBaseUser) -> int:
    """Mark every unread notification of ``user`` read; returns how many."""
    marked = Notification.objects.filter(user=user, read_at__isnull=True).update(read_at=timezone.now())
    notifications_changed_on_commit([user.pk])
    return marked


# ---- webhook deliveries ----------------------------------------------------------------------------
#
# A post is someone else's server's time, so no transaction is open while it runs: a worker claims
# the delivery in one short transaction (status ``sending``, with a lease), posts, and records the
# attempt in another. A second worker handed the same delivery (a redelivered task) finds it
# claimed and leaves it; a claim whose worker died mid-post (killed at the task's hard time limit)
# lapses with its lease, and the next claim records that attempt as failed.

@dataclass(frozen=True)
class DeliveryClaim:
    """A worker's hold on one delivery: what to post, and the number of the attempt it records."""

    delivery_id: int
    number: int
    url: str
    body: str
    secret: str = dataclass_field(repr=False)  # never in a log line


def webhook_delivery_lease() -> timedelta:
    """How long a claim holds: past the task's hard time limit, its worker was killed for sure."""
    return timedelta(seconds=settings.TANDEM_WEBHOOK_TASK_TIME_LIMIT_S + 10)


def webhook_delivery_attempt(*, delivery_id: int) -> float | None:
    """Post a pending delivery once and record the attempt; returns the seconds to wait before the
    next attempt, or None when the delivery is over (delivered, failed for good, rate limited, or
    not this worker's to post). Never inside a transaction: the post holds no lock."""
    claim = webhook_delivery_claim(delivery_id=delivery_id)
    if claim is None:
        return None
    started = timezone.now()
    try:
        result = webhook_post(url=claim.url, body=claim.body.encode(), secret=claim.secret,
                              delivery_id=claim.delivery_id)
    except SoftTimeLimitExceeded:
        result = PostResult(response_code=None, error=(
            f"the post outlasted the delivery task's time limit "
            f"({settings.TANDEM_WEBHOOK_TASK_SOFT_TIME_LIMIT_S:g} s, TANDEM_WEBHOOK_TASK_SOFT_TIME_LIMIT_S)"))
    except Exception as error:  # recorded, so that no delivery stays claimed by a bug
        logger.exception("webhook delivery %s, attempt %d: the post raised", claim.delivery_id, claim.number)
        result = PostResult(response_code=None, error=f"the post failed unexpectedly: {type(error).__name__}")
    return webhook_delivery_record(claim=claim, result=result, started=started)


@transaction.atomic
def webhook_delivery_claim(*, delivery_id: int) -> DeliveryClaim | None:
    """Claim a delivery for one post, or None if there is nothing to post: it is over, another worker
    holds it, its rule or webhook is gone (recorded as failed), or its URL had its posts for the
    minute (recorded as rate limited)."""
    delivery = (WebhookDelivery.objects.select_for_update(of=("self",)).select_related("rule")
                .filter(pk=delivery_id).first())
    if delivery is None:
        return None
    now = timezone.now()
    if delivery.status == Delivery.SENDING:
        if delivery.lease_expires_at is not None and delivery.lease_expires_at > now:
            return None
        _attempt_lapsed_record(delivery, now=now)
        if delivery.attempts >= settings.TANDEM_WEBHOOK_MAX_ATTEMPTS:
            _delivery_finish(delivery, Delivery.FAILED, now=now,
                             reason=f"{delivery.attempts} attempts failed; the last: its worker stopped mid-post")
            return None
    elif delivery.status != Delivery.PENDING:
        return None
    if delivery.rule is None or not delivery.rule.webhook_secret:
        error = "the rule was deleted, or its webhook removed, before this attempt"
        delivery.attempts += 1
        WebhookAttempt.objects.create(delivery=delivery, number=delivery.attempts, error=error, attempted_at=now,
                                      outcome=WebhookAttempt.Outcome.FAILED, duration_s=0.0)
        _delivery_finish(delivery, Delivery.FAILED, now=now, reason=error)
        return None
    if not _webhook_post_allowed(delivery.url):
        limit = settings.TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE
        _delivery_finish(delivery, Delivery.RATE_LIMITED, now=now, reason=(
            f"not posted: its URL had its {limit} posts per minute already "
            f"(TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE); the firing's notifications stand"))
        # The URL is left out of logs: a chat webhook's URL is itself a credential.
        logger.warning("webhook delivery %s of rule %s rate limited (%d posts per URL per minute)",
                       delivery.pk, delivery.rule_id, limit)
        return None
    delivery.attempts += 1
    delivery.status = Delivery.SENDING
    delivery.lease_expires_at = now + webhook_delivery_lease()
    delivery.save(update_fields=["attempts", "status", "lease_expires_at"])
    return DeliveryClaim(delivery_id=delivery.pk, number=delivery.attempts, url=delivery.url, body=delivery.body,
                         secret=delivery.rule.webhook_secret)


@transaction.atomic
def webhook_delivery_record(*, claim: DeliveryClaim, result: PostResult, started: datetime) -> float | None:
    """Record the claimed attempt's outcome and release the claim; returns the seconds to wait before the
    next attempt, or None when the delivery is over (or no longer this claim's: its lease lapsed and
    another worker took it over)."""
    finished = timezone.now()
    delivery = WebhookDelivery.objects.select_for_update().get(pk=claim.delivery_id)
    delivered = result.delivered
    if not WebhookAttempt.objects.filter(delivery=delivery, number=claim.number).exists():
        WebhookAttempt.objects.create(
            delivery=delivery, number=claim.number, response_code=result.response_code, error=result.error,
            response_excerpt=result.response_excerpt, attempted_at=started,
            outcome=WebhookAttempt.Outcome.DELIVERED if delivered else WebhookAttempt.Outcome.FAILED,
            duration_s=(finished - started).total_seconds(),
        )
    if delivery.status != Delivery.SENDING or delivery.attempts != claim.number:
        return None
    final = delivered or claim.number >= settings.TANDEM_WEBHOOK_MAX_ATTEMPTS
    if not delivered:
        # The URL is left out: a chat webhook's URL is itself a credential.
        logger.warning("webhook delivery %s of rule %s, attempt %d: %s%s", delivery.pk, delivery.rule_id,
                       claim.number, result.error, " (gave up)" if final else "")
    if final:
        _delivery_finish(delivery, Delivery.DELIVERED if delivered else Delivery.FAILED, now=finished,
                         reason="" if delivered else f"{claim.number} attempts failed; the last: {result.error}")
        return None
    delivery.status, delivery.lease_expires_at = Delivery.PENDING, None
    delivery.save(update_fields=["status", "lease_expires_at"])
    return settings.TANDEM_WEBHOOK_BACKOFF_S * 2 ** (claim.number - 1)


def webhook_deliveries_resume(*, now: datetime | None = None) -> int:
    """Send again each delivery whose claim lapsed (its worker was killed mid-post, or lost): the next
    claim records that attempt as failed and goes on. Celery beat runs this; returns how many."""
    now = now or timezone.now()
    lapsed = list(WebhookDelivery.objects.filter(status=Delivery.SENDING, lease_expires_at__lt=now)
                  .order_by("lease_expires_at").values_list("pk", flat=True)[:1000])
    for delivery_id in lapsed:
        _delivery_send(delivery_id)
    return len(lapsed)


def _attempt_lapsed_record(delivery: WebhookDelivery, *, now: datetime) -> None:
    lease = webhook_delivery_lease()
    attempted_at = (delivery.lease_expires_at - lease) if delivery.lease_expires_at else now
    WebhookAttempt.objects.get_or_create(delivery=delivery, number=delivery.attempts, defaults={
        "outcome": WebhookAttempt.Outcome.FAILED, "attempted_at": attempted_at,
        "duration_s": max((now - attempted_at).total_seconds(), 0.0),
        "error": "its worker stopped before recording an answer, and its lease lapsed "
                 "(killed at the task's hard time limit, or lost)",
    })
    logger.warning("webhook delivery %s, attempt %d: its worker stopped mid-post", delivery.pk, delivery.attempts)


def _delivery_finish(delivery: WebhookDelivery, status: str, *, now: datetime, reason: str) -> None:
    delivery.status, delivery.status_reason = status, reason
    delivery.finished_at, delivery.lease_expires_at = now, None
    delivery.save(update_fields=["attempts", "status", "status_reason", "finished_at", "lease_expires_at"])


def _webhook_post_allowed(url: str) -> bool:
    """Count one post to ``url`` in this minute's window; False past TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE.

    In the shared Redis cache, so that every webhooks worker counts in one place; keyed by the URL's
    hash, never the URL (a credential)."""
    key = RATE_KEY.format(url_hash=hashlib.sha256(url.encode()).hexdigest()[:32],
                          window=int(time.time() // RATE_WINDOW_S))
    cache.add(key, 0, timeout=2 * RATE_WINDOW_S)
    try:
        posts = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=2 * RATE_WINDOW_S)
        posts = 1
    return posts <= settings.TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE
