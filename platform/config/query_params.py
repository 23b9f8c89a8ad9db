"""Reading typed query parameters, failing with an error that names the parameter."""

from domain_errors import InvalidInput


def int_query_param(request, name: str, *, default: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput.for_field(name, f"Expected an integer, got '{raw}'.") from None
