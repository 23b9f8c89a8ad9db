"""Query-string filters of the environments list."""

import django_filters

from common.query_params import IdFilter

from .models import Environment, EnvironmentVersion


class EnvironmentFilter(django_filters.FilterSet):
    project = IdFilter(
        field_name="project_id", help_text="Only this project's environments (404 if not yours)."
    )
    name = django_filters.CharFilter(lookup_expr="icontains", help_text="Part of the name.")
    kind = django_filters.ChoiceFilter(
        field_name="versions__kind", choices=EnvironmentVersion.Kind.choices, distinct=True,
        help_text="Environments with a version of this kind.",
    )

    class Meta:
        model = Environment
        fields = ["project", "name", "kind"]
