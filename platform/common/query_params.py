"""Reading typed query parameters, failing with an error that names the parameter."""

import django_filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from common.domain_errors import InvalidInput


def int_query_param(request, name: str, *, default: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput.for_field(name, f"Expected an integer, got '{raw}'.") from None


@extend_schema_field(OpenApiTypes.INT)
class IdFilter(django_filters.NumberFilter):
    """A filter on an object id, documented as an integer (NumberFilter says "number")."""
