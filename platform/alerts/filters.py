"""Query-string filters of the alert lists."""

import django_filters

from common.query_params import IdFilter

from .models import AlertRule, Notification


class AlertRuleFilter(django_filters.FilterSet):
    project = IdFilter(field_name="project_id", help_text="Only this project's rules (404 if not yours).")
    kind = django_filters.ChoiceFilter(choices=AlertRule.Kind.choices, help_text="Rules of this kind.")

    class Meta:
        model = AlertRule
        fields = ["project", "kind"]


class NotificationFilter(django_filters.FilterSet):
    unread = django_filters.BooleanFilter(
        field_name="read_at", lookup_expr="isnull", help_text="true: only unread ones; false: only read ones.")

    class Meta:
        model = Notification
        fields = ["unread"]
