"""Query-string filters of the environments list."""

import django_filters

from config.query_params import IdFilter

from .models import Environment


class EnvironmentFilter(django_filters.FilterSet):
    project = IdFilter(
        field_name="project_id", help_text="Only this project's environments (404 if not yours)."
    )
    name = django_filters.CharFilter(lookup_expr="icontains", help_text="Part of the name.")
    kind = django_filters.ChoiceFilter(choices=Environment.Kind.choices)

    class Meta:
        model = Environment
        fields = ["project", "name", "kind"]
