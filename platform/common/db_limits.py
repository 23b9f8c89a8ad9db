"""What PostgreSQL cannot store, checked at the API's edge so that it is a 400 naming
the field rather than a DataError (a 500) deep in a service.

The cross-process contracts (tandem.contracts) allow any int and any string; the
columns they land in do not: integer columns hold 32 bits, and text and jsonb hold
no NUL character.
"""

from __future__ import annotations

from typing import Any

from common.domain_errors import InvalidInput

# Django's IntegerField and PositiveIntegerField are PostgreSQL `integer`.
DB_INT_MIN = -(2**31)
DB_INT_MAX = 2**31 - 1


def require_db_int(value: int, field: str, *, minimum: int = DB_INT_MIN) -> None:
    if not minimum <= value <= DB_INT_MAX:
        raise InvalidInput.for_field(field, f"Must be between {minimum} and {DB_INT_MAX}.")


def nul_path(value: Any, path: str) -> str | None:
    """The dotted path of the first NUL character in ``value`` (keys included), or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            if "\x00" in str(key):
                return child
            found = nul_path(item, child)
            if found is not None:
                return found
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = nul_path(item, f"{path}.{index}" if path else str(index))
            if found is not None:
                return found
    return None


def require_no_nul(value: Any, field: str) -> None:
    found = nul_path(value, field)
    if found is not None:
        raise InvalidInput.for_field(found, "NUL characters (\\u0000) cannot be stored.")
