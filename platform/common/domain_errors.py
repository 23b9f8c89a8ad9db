"""Errors the platform's services raise, independent of HTTP.

The API's exception handler (common/exception_handler.py) maps each class to a
status code; pages map them to messages or 404s. Each error names the object or
the fields it is about, so a caller can act on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import pydantic

from tandem.contracts import ErrorCode

RecordT = TypeVar("RecordT", bound=pydantic.BaseModel)


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


def records_of(raw, *, field: str, record: type[RecordT], noun: str, at_most: int,
               check: Callable[[RecordT, str], None] | None = None) -> list[RecordT]:
    """``raw`` (a request's ``field``) validated as a list of at most ``at_most`` ``record``\\s.

    Errors name the field, or the item and its field (``events.3.loss``); ``check(item, prefix)``
    may refuse an item that validated, in turn with the others.
    """
    if not isinstance(raw, list):
        raise InvalidInput.for_field(field, f"Expected a list of {record.__name__} objects.")
    if len(raw) > at_most:
        raise InvalidInput.for_field(field, f"At most {at_most} {noun} per post.")
    records = []
    for index, item in enumerate(raw):
        try:
            records.append(record.model_validate(item))
        except pydantic.ValidationError as error:
            raise InvalidInput.from_pydantic(error, prefix=f"{field}.{index}") from None
        if check is not None:
            check(records[-1], f"{field}.{index}")
    return records
