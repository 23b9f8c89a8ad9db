"""The API's shapes of alert rules, notifications and webhook deliveries.

A rule's webhook secret is write-only: it is accepted on create and update and never
returned; ``webhook_secret_set`` says whether the rule has one. Its webhook URL is a
credential too (a chat webhook's token is in its path): owners and members, who manage
the project's rules, read it whole; viewers read it redacted (scheme, host and port).
Rules are serialized as ``alerts.selectors.alert_rule_list`` gives them (with the caller's
role and the delivery counts); a rule without the caller's role shows its URL redacted.
"""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .models import AlertRule, Notification, WebhookAttempt, WebhookDelivery
from .selectors import COUNTED_DELIVERY_STATUSES, webhook_url_as_seen

WEBHOOK_URL_HELP = ("Whole for the project's owners and members; redacted for viewers (scheme, host and port, "
                    "the path masked: a chat webhook's URL is a credential).")


class DeliveryCountsSerializer(serializers.Serializer):
    pending = serializers.IntegerField()
    sending = serializers.IntegerField()
    delivered = serializers.IntegerField()
    failed = serializers.IntegerField()
    rate_limited = serializers.IntegerField(help_text="Not posted: the URL had its posts for the minute.")


class AlertRuleSerializer(serializers.ModelSerializer):
    webhook_url = serializers.SerializerMethodField(help_text=WEBHOOK_URL_HELP)
    webhook_secret_set = serializers.SerializerMethodField(help_text="Whether the webhook has a signing secret.")
    deliveries = serializers.SerializerMethodField(help_text="The rule's webhook deliveries, counted by status.")
    last_fired_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="When it last notified (a firing its cooldown held back aside).")
    firings_held_back = serializers.IntegerField(
        read_only=True, help_text="Its firings that came within its cooldown: recorded, notifying no one.")

    class Meta:
        model = AlertRule
        fields = ["id", "project", "name", "kind", "enabled", "metric", "comparison", "threshold", "steps",
                  "minutes", "run", "cooldown_minutes", "webhook_url", "webhook_secret_set", "deliveries",
                  "last_fired_at", "firings_held_back", "created_at", "updated_at"]

    def get_webhook_url(self, rule: AlertRule) -> str:
        return webhook_url_as_seen(url=rule.webhook_url, role=getattr(rule, "caller_role", None))

    def get_webhook_secret_set(self, rule: AlertRule) -> bool:
        return bool(rule.webhook_secret)

    @staticmethod
    def _counts(rule: AlertRule) -> dict[str, int]:
        return {status: getattr(rule, f"deliveries_{status}", 0) for status in COUNTED_DELIVERY_STATUSES}

    @extend_schema_field(DeliveryCountsSerializer)
    def get_deliveries(self, rule: AlertRule) -> dict[str, int]:
        return self._counts(rule)


class AlertRuleWriteSerializer(serializers.Serializer):
    """A rule's definition; which settings a kind uses is checked by alerts.services."""

    project = serializers.IntegerField(
        required=False, help_text="The project (on create); optional when you belong to one project only.")
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=AlertRule.Kind.choices)
    enabled = serializers.BooleanField(required=False, default=True)
    metric = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="",
        help_text="metric_threshold: the series, as charted (reward_mean, loss, algorithm/kl ...).")
    comparison = serializers.ChoiceField(
        choices=AlertRule.Comparison.choices, required=False, allow_blank=True, default="",
        help_text="metric_threshold: fire when the metric is above or below the threshold.")
    threshold = serializers.FloatField(
        required=False, allow_null=True, default=None,
        help_text="metric_threshold: the bound; trainer_idle: the idle fraction of a step, 0 to 1.")
    steps = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=1_000_000,
        help_text="metric_threshold: consecutive steps past the threshold before the rule fires; tools_unused: "
                  "consecutive RL steps in which an environment that offers tools saw none called.")
    minutes = serializers.FloatField(
        required=False, allow_null=True, default=None, min_value=0, max_value=100_000,
        help_text="trainer_idle: how long the trainer stays idle; no_progress: how long the step stands still.")
    run = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1,
        help_text="Scope the rule to this run of the project (run kinds only); null: every run of the project.")
    cooldown_minutes = serializers.FloatField(
        required=False, allow_null=True, default=None, min_value=0, max_value=7 * 24 * 60,
        help_text="After a firing, the rule stays quiet on the same run or environment this long: a firing "
        "within it is recorded as held back and notifies no one. Null: no cooldown.")
    webhook_url = serializers.CharField(
        max_length=500, required=False, allow_blank=True, default="",
        help_text="Posted Slack-compatible JSON on each firing; its host must be on TANDEM_WEBHOOK_ALLOWED_HOSTS.")
    # trim_whitespace off: a secret is taken exactly as sent.
    webhook_secret = serializers.CharField(
        max_length=200, required=False, allow_blank=True, write_only=True, trim_whitespace=False,
        help_text="Key of the X-Tandem-Signature header (sha256=<hex HMAC-SHA256 of the body>); never "
        "returned. Left out on update: kept.")

    def validate(self, data):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
        return data

    def changes(self) -> dict:
        """What a PATCH sent (defaults left out), for alert_rule_update."""
        return {key: value for key, value in self.validated_data.items()
                if key in self.initial_data and key != "project"}


class NotificationSerializer(serializers.ModelSerializer):
    rule = serializers.IntegerField(source="firing.rule_id", allow_null=True, help_text="Null once deleted.")
    rule_name = serializers.CharField(source="firing.rule_name")
    kind = serializers.CharField(source="firing.kind")
    project = serializers.IntegerField(source="firing.project_id")
    project_name = serializers.CharField(source="firing.project.name")
    run = serializers.IntegerField(source="firing.run_id", allow_null=True)
    environment_version = serializers.IntegerField(source="firing.environment_version_id", allow_null=True)
    text = serializers.CharField(source="firing.text")
    details = serializers.JSONField(source="firing.details")
    fired_at = serializers.DateTimeField(source="firing.fired_at")

    class Meta:
        model = Notification
        fields = ["id", "rule", "rule_name", "kind", "project", "project_name", "run", "environment_version",
                  "text", "details", "fired_at", "read_at"]


class UnreadCountSerializer(serializers.Serializer):
    unread = serializers.IntegerField(help_text="The caller's unread notifications.")


class MarkedReadSerializer(serializers.Serializer):
    marked = serializers.IntegerField(help_text="Notifications newly marked read.")


class WebhookAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookAttempt
        fields = ["number", "outcome", "response_code", "response_excerpt", "error", "attempted_at", "duration_s"]
        extra_kwargs = {"response_excerpt": {"help_text": "The start of the receiver's answer (1 KiB at most)."}}


class WebhookDeliverySerializer(serializers.ModelSerializer):
    """One delivery; the context's ``caller_role`` (the caller's role in the rule's project) decides
    whether ``url`` is shown whole."""

    attempt_log = WebhookAttemptSerializer(many=True, help_text="Every attempt, first first.")
    text = serializers.CharField(source="firing.text")
    url = serializers.SerializerMethodField(help_text=WEBHOOK_URL_HELP)

    class Meta:
        model = WebhookDelivery
        fields = ["id", "firing", "text", "url", "status", "status_reason", "attempts", "created_at",
                  "finished_at", "attempt_log"]
        extra_kwargs = {"status_reason": {"help_text": "Why it ended undelivered (failed, rate_limited)."}}

    def get_url(self, delivery: WebhookDelivery) -> str:
        return webhook_url_as_seen(url=delivery.url, role=self.context.get("caller_role"))
