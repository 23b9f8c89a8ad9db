"""Alert rules of a project, the state of their conditions, and what a rule firing leaves behind:
one firing, a notification per member, and a webhook delivery with each of its attempts."""

from django.conf import settings
from django.db import models


class AlertRule(models.Model):
    """A condition a project watches for; it fires once each time the condition starts to hold."""

    class Kind(models.TextChoices):
        RUN_FAILED = "run_failed", "Run failed"
        RUN_FINISHED = "run_finished", "Run finished"
        METRIC_THRESHOLD = "metric_threshold", "Metric above or below a threshold"
        TRAINER_IDLE = "trainer_idle", "Trainer idle"
        NO_PROGRESS = "no_progress", "No progress"
        PROBE_FAILED = "probe_failed", "Probe failed"
        ENVIRONMENT_UNHEALTHY = "environment_unhealthy", "Environment unhealthy"
        TOOLS_UNUSED = "tools_unused", "Tools unused"

    class Comparison(models.TextChoices):
        ABOVE = "above", "above"
        BELOW = "below", "below"

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="alert_rules")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    enabled = models.BooleanField(default=True)
    # metric_threshold: the series (as charted, e.g. reward_mean) and its bound.
    metric = models.CharField(max_length=200, blank=True)
    comparison = models.CharField(max_length=8, choices=Comparison.choices, blank=True)
    # metric_threshold: the bound; trainer_idle: the idle fraction (0..1) the trainer stays above.
    threshold = models.FloatField(null=True, blank=True)
    # metric_threshold: consecutive steps the metric must stay past the bound; tools_unused: consecutive
    # RL steps in which an environment that offers tools saw none of them called.
    steps = models.PositiveIntegerField(null=True, blank=True)
    # trainer_idle: how long the trainer stays idle; no_progress: how long the step stands still.
    minutes = models.FloatField(null=True, blank=True)
    # Scoped to one run of the project: its run kinds judge that run only (null: every run of the project).
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    # After a firing, how long the rule stays quiet on the same subject: a firing within it is recorded,
    # held back (AlertFiring.held_back_reason), and notifies no one (null: no cooldown).
    cooldown_minutes = models.FloatField(null=True, blank=True)
    webhook_url = models.URLField(max_length=500, blank=True)
    # Write-only: the key of the webhook's HMAC-SHA256 signature. Never serialized, never logged.
    webhook_secret = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project_id", "name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="alert_rule_name_unique_per_project"),
        ]
        indexes = [models.Index(fields=["project", "kind", "enabled"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class AlertCondition(models.Model):
    """Where one rule's condition stands for one subject (a run, or an environment version).

    ``active``: the condition holds and the rule fired for it; it fires again only after
    the condition cleared. ``streak`` and ``streak_started_at`` count towards a condition
    that must hold for a while (N steps, Y minutes); ``last_step`` makes a re-sent step count once.
    """

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="conditions")
    # "run:<id>" or "environment_version:<id>" (alerts.services.subject_key).
    subject = models.CharField(max_length=64)
    active = models.BooleanField(default=False)
    streak = models.PositiveIntegerField(default=0)
    # Unix seconds (the trainer's clock) at which the streak began.
    streak_started_at = models.FloatField(null=True)
    last_step = models.BigIntegerField(null=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rule", "subject"], name="alert_condition_unique_per_subject"),
        ]


class AlertFiring(models.Model):
    """One episode of a rule's condition: what it was about and what it said.

    Kept when its rule is deleted (``rule`` becomes null; the name and kind stay), so that
    notifications and deliveries keep their meaning.
    """

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="alert_firings")
    rule = models.ForeignKey(AlertRule, on_delete=models.SET_NULL, null=True, related_name="firings")
    rule_name = models.CharField(max_length=100)
    kind = models.CharField(max_length=32, choices=AlertRule.Kind.choices)
    subject = models.CharField(max_length=64)
    run = models.ForeignKey("runs.Run", on_delete=models.SET_NULL, null=True, related_name="+")
    environment_version = models.ForeignKey("environments.EnvironmentVersion", on_delete=models.SET_NULL,
                                            null=True, related_name="+")
    text = models.TextField()
    # Why it notified no one and posted nothing: within its rule's cooldown (empty: it was sent).
    held_back_reason = models.TextField(blank=True, default="")
    # The condition's figures (status, metric, value, step ...), as the webhook's payload carries them.
    details = models.JSONField(default=dict)
    fired_at = models.DateTimeField()

    class Meta:
        ordering = ["-fired_at", "-id"]


class Notification(models.Model):
    """A firing, as one member of the project sees it in the dashboard."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    firing = models.ForeignKey(AlertFiring, on_delete=models.CASCADE, related_name="notifications")
    read_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "read_at"])]


class WebhookDelivery(models.Model):
    """A firing posted to its rule's webhook; ``body`` is sent as is on every attempt.

    ``sending``: a worker claimed it and is posting it, until ``lease_expires_at``; a claim whose
    lease lapsed (its worker was killed mid-post) is recorded as a failed attempt by the next one.
    ``rate_limited``: not posted, because its URL had its posts for the minute
    (TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE); ``status_reason`` says so.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"
        RATE_LIMITED = "rate_limited", "Rate limited"

    firing = models.ForeignKey(AlertFiring, on_delete=models.CASCADE, related_name="deliveries")
    rule = models.ForeignKey(AlertRule, on_delete=models.SET_NULL, null=True, related_name="deliveries")
    url = models.URLField(max_length=500)
    body = models.TextField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # Why a delivery ended without being delivered (failed, rate_limited); empty otherwise.
    status_reason = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # While sending: when the claiming worker's hold on it lapses (alerts.services.webhook_delivery_claim).
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class WebhookAttempt(models.Model):
    """One post of a delivery: the receiver's status code, or why there was none."""

    class Outcome(models.TextChoices):
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    response_code = models.PositiveIntegerField(null=True)
    # The start of the receiver's answer (alerts.webhooks.RESPONSE_EXCERPT_BYTES at most).
    response_excerpt = models.TextField(blank=True)
    error = models.TextField(blank=True)
    attempted_at = models.DateTimeField()
    duration_s = models.FloatField()

    class Meta:
        ordering = ["delivery_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="webhook_attempt_unique_number"),
        ]
