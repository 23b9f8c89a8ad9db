"""The dashboard's alert rule form: the REST body, as form fields."""

from django import forms

from common.form_errors import DomainErrorForm

from .models import AlertRule
from .services import RULE_SETTINGS


class AlertRuleForm(DomainErrorForm):
    project = forms.ChoiceField()
    name = forms.CharField(max_length=100)
    kind = forms.ChoiceField(choices=AlertRule.Kind.choices, label="When")
    metric = forms.CharField(max_length=200, required=False,
                             help_text="Metric rules: the series, as charted (reward_mean, loss ...).")
    comparison = forms.ChoiceField(choices=[("", "—"), *AlertRule.Comparison.choices], required=False,
                                   help_text="Metric rules: fire when the metric is above or below the threshold.")
    threshold = forms.FloatField(required=False, help_text="Metric rules: the bound. Trainer idle: the idle "
                                 "fraction of each step, 0 to 1 (0.5 is 50%).")
    steps = forms.IntegerField(required=False, min_value=1,
                               help_text="Metric rules: consecutive steps past the threshold.")
    minutes = forms.FloatField(required=False, min_value=0, help_text="Trainer idle: for how long. "
                               "No progress: how long the step stands still.")
    run = forms.IntegerField(required=False, min_value=1, label="Only run (id)",
                             help_text="Judge this run of the project only (run kinds); empty: every run.")
    cooldown_minutes = forms.FloatField(required=False, min_value=0, label="Cooldown (minutes)",
                                        help_text="After a notification, stay quiet on the same run or "
                                        "environment this long; firings within it are recorded, held back.")
    webhook_url = forms.CharField(max_length=500, required=False, label="Webhook URL",
                                  help_text="Slack-compatible JSON is posted here on each firing.")
    webhook_secret = forms.CharField(max_length=200, required=False, label="Webhook secret", strip=False,
                                     widget=forms.PasswordInput(render_value=False),
                                     help_text="Signs each post (X-Tandem-Signature: sha256=…); never shown again.")

    #: Settings each kind either needs or refuses (alerts.services.SETTINGS_OF_KIND): never "optional"; the
    #: page shows a kind's own, marked required (alert_rules.js).
    kind_settings = RULE_SETTINGS

    def __init__(self, *args, projects, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [(project.pk, project.name) for project in projects]

    @classmethod
    def for_rule(cls, rule: AlertRule, data=None) -> "AlertRuleForm":
        """The form to change ``rule``: its project fixed, its fields filled in (its secret never)."""
        initial = {field: getattr(rule, field) for field in cls.base_fields
                   if field not in ("project", "run", "webhook_secret")} | {"run": rule.run_id}
        form = cls(data, initial=initial, projects=[rule.project])
        del form.fields["project"]
        form.fields["webhook_secret"].help_text = "Left empty: the rule keeps its secret."
        return form

    def changes(self) -> dict:
        """alert_rule_update's changes: every field, a secret left empty kept."""
        changes = self.service_arguments()
        if not changes.get("webhook_secret") and changes.get("webhook_url"):
            changes.pop("webhook_secret", None)
        return changes

    def service_arguments(self) -> dict:
        """alert_rule_create's arguments, with the settings left empty as the service expects them."""
        data = {key: value for key, value in self.cleaned_data.items() if key != "project"}
        return {key: ("" if value is None and key in ("metric", "comparison") else value)
                for key, value in data.items()}
