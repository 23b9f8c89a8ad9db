"""Reads of alerts: a project's rules and their webhook deliveries, a user's notifications."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from accounts.models import Membership, Project
from common.domain_errors import NotFound

from .models import AlertCondition, AlertFiring, AlertRule, Notification, WebhookDelivery
from .webhooks import webhook_url_redacted


def subject_key(kind: str, object_id: int) -> str:
    """How an AlertCondition and an AlertFiring name what they are about: ``run:12``, ``environment_version:3``."""
    return f"{kind}:{object_id}"


def run_alert_change(rule: AlertRule, *, active: bool, firing: AlertFiring | None = None) -> dict:
    """One of a run's alerts as its page shows it: the rule, and while it holds, what its firing said."""
    return {"rule": rule.pk, "name": rule.name, "kind": rule.kind, "active": active,
            "text": firing.text if firing else "", "fired_at": firing.fired_at.isoformat() if firing else None}


# The delivery statuses each rule counts (``deliveries_<status>``), as the API shows them.
COUNTED_DELIVERY_STATUSES = tuple(WebhookDelivery.Status.values)


def alert_rule_list(*, user: AbstractBaseUser, project: Project | None = None) -> QuerySet[AlertRule]:
    """The rules of the user's projects (of ``project`` only, if given), each with ``caller_role`` (the
    user's role in its project, which decides whether they read its webhook URL whole), its deliveries
    counted by status (``deliveries_<status>``), when it last notified (``last_fired_at``) and how many of its
    firings its cooldown held back (``firings_held_back``)."""
    role = Membership.objects.filter(project=OuterRef("project"), user=user).values("role")[:1]
    counts = {f"deliveries_{status}": Count("deliveries", filter=Q(deliveries__status=status), distinct=True)
              for status in COUNTED_DELIVERY_STATUSES}
    sent = AlertFiring.objects.filter(rule=OuterRef("pk"), held_back_reason="").order_by("-fired_at")
    held_back = (AlertFiring.objects.filter(rule=OuterRef("pk")).exclude(held_back_reason="").order_by()
                 .values("rule").annotate(count=Count("pk")).values("count"))
    rules = (AlertRule.objects.filter(project__memberships__user=user).select_related("project")
             .annotate(caller_role=Subquery(role), last_fired_at=Subquery(sent.values("fired_at")[:1]),
                       firings_held_back=Coalesce(Subquery(held_back), 0), **counts))
    if project is not None:
        rules = rules.filter(project=project)
    return rules.order_by("project__name", "project_id", "name", "id")


def alert_rule_get_for_user(*, user: AbstractBaseUser, rule_id: int) -> AlertRule:
    """One rule of the user's projects; another project's is reported as missing."""
    rule = alert_rule_list(user=user).filter(pk=rule_id).first()
    if rule is None:
        raise NotFound(f"Alert rule {rule_id} not found.")
    return rule


def webhook_url_as_seen(*, url: str, role: str | None) -> str:
    """A webhook URL as a member of ``role`` reads it: whole for those who manage the project's rules
    (owners, members), redacted for viewers. A chat webhook's URL is itself a credential."""
    if not url or role in Membership.WRITER_ROLES:
        return url
    return webhook_url_redacted(url)


def webhook_delivery_list(*, rule: AlertRule) -> QuerySet[WebhookDelivery]:
    """The rule's deliveries, newest first, each with its attempts."""
    return (WebhookDelivery.objects.filter(rule=rule).select_related("firing")
            .prefetch_related("attempt_log").order_by("-created_at", "-id"))


def notification_list(*, user: AbstractBaseUser, unread: bool | None = None) -> QuerySet[Notification]:
    """The user's notifications, newest first; ``unread``: only those not yet read (or only read ones)."""
    notifications = Notification.objects.filter(user=user).select_related("firing", "firing__project")
    if unread is not None:
        notifications = notifications.filter(read_at__isnull=unread)
    return notifications.order_by("-created_at", "-id")


def notification_get_for_user(*, user: AbstractBaseUser, notification_id: int) -> Notification:
    notification = notification_list(user=user).filter(pk=notification_id).first()
    if notification is None:
        raise NotFound(f"Notification {notification_id} not found.")
    return notification


def notification_unread_count(*, user: AbstractBaseUser) -> int:
    """What the navigation's badge shows."""
    return Notification.objects.filter(user=user, read_at__isnull=True).count()


def run_alerts_active(*, run_id: int) -> list[dict]:
    """The run's alerts whose condition holds now, as its page shows them: each rule's newest firing on
    the run (alerts.services.run_alert_change's shape), oldest rule first. The caller may see the run."""
    subject = subject_key("run", run_id)
    active = AlertCondition.objects.filter(subject=subject, active=True, rule__enabled=True).select_related("rule")
    alerts = []
    for condition in active.order_by("rule_id"):
        firing = AlertFiring.objects.filter(rule=condition.rule, subject=subject).first()  # newest: Meta.ordering
        alerts.append(run_alert_change(condition.rule, active=True, firing=firing))
    return alerts
