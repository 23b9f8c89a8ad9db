"""Reading typed query parameters, failing with an error that names the parameter."""

import django_filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from accounts.selectors import project_get_for_user
from domain_errors import InvalidInput


def int_query_param(request, name: str, *, default: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput.for_field(name, f"Expected an integer, got '{raw}'.") from None


def project_query_param(request):
    """The project ``?project=<id>`` names, checked to be the caller's (404 if not), or None."""
    project_id = int_query_param(request, "project")
    if project_id is None:
        return None
    return project_get_for_user(user=request.user, project_id=project_id)


@extend_schema_field(OpenApiTypes.INT)
class IdFilter(django_filters.NumberFilter):
    """A filter on an object id, documented as an integer (NumberFilter says "number")."""
