"""Errors the platform's services raise, independent of HTTP.

The API's exception handler (config/exception_handler.py) maps each class to a
status code; pages map them to messages or 404s. Each error names the object or
the fields it is about, so a caller can act on it.
"""

from __future__ import annotations

from collections.abc import Mapping

import pydantic

from tandem.contracts import ErrorCode


class DomainError(Exception):
    """Base of the platform's own errors; ``code`` is stable, ``message`` is for people.

    Each class has its code (tandem.contracts.ErrorCode); an error another process
    must tell apart from its class's others carries a code of its own, from a
    vocabulary in the contracts (a TrainerConflictCode, say).
    """

    code: str = "error"

    def __init__(self, message: str, *, fields: Mapping[str, list[str]] | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.message = message
        self.fields = dict(fields or {})
        if code is not None:
            self.code = code


class InvalidInput(DomainError):
    """The request names something that does not fit; ``fields`` says which and why."""

    code = ErrorCode.INVALID

    @classmethod
    def for_field(cls, field: str, message: str) -> InvalidInput:
        return cls(f"{field}: {message}", fields={field: [message]})

    @classmethod
    def from_pydantic(cls, error: pydantic.ValidationError, *, prefix: str = "") -> InvalidInput:
        """Name each failing field by its dotted path, e.g. ``config.model.num_heads``."""
        fields: dict[str, list[str]] = {}
        for detail in error.errors(include_url=False):
            path = ".".join(str(part) for part in (prefix, *detail["loc"]) if part != "")
            fields.setdefault(path or "non_field_errors", []).append(detail["msg"])
        first_field, first_messages = next(iter(fields.items()))
        return cls(f"{first_field}: {first_messages[0]}", fields=fields)


class NotFound(DomainError):
    """The object does not exist, or the caller may not know that it does."""

    code = ErrorCode.NOT_FOUND


class Conflict(DomainError):
    """The request is valid but clashes with the object's current state."""

    code = ErrorCode.CONFLICT


class Forbidden(DomainError):
    """The caller may see the object but not change it."""

    code = ErrorCode.PERMISSION_DENIED
