"""Query-string filters of the runs list."""

import django_filters

from common.query_params import IdFilter

from .models import Run


class RunFilter(django_filters.FilterSet):
    project = IdFilter(
        field_name="project_id", help_text="Only this project's runs (404 if not yours)."
    )
    status = django_filters.ChoiceFilter(choices=Run.Status.choices)
    environment = django_filters.CharFilter(
        field_name="environment__name", help_text="Name of the run's environment."
    )
    name = django_filters.CharFilter(lookup_expr="icontains", help_text="Part of the name.")

    class Meta:
        model = Run
        fields = ["project", "status", "environment", "name"]
