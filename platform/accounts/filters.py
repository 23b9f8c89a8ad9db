"""Query-string filters of the accounts list endpoints."""

import django_filters

from .models import ApiToken, Membership, Project


class ProjectFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains", help_text="Part of the name.")
    role = django_filters.ChoiceFilter(
        choices=Membership.Role.choices, help_text="The caller's role in the project."
    )

    class Meta:
        model = Project
        fields = ["name", "role"]


class MembershipFilter(django_filters.FilterSet):
    role = django_filters.ChoiceFilter(choices=Membership.Role.choices)

    class Meta:
        model = Membership
        fields = ["role"]


class ApiTokenFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains", help_text="Part of the name.")

    class Meta:
        model = ApiToken
        fields = ["name"]
