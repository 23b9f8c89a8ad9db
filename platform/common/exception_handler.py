"""The API's one error shape: ``{"error": {"code", "message", "fields"}}``.

``code`` is stable, for programs: the platform's own come from the contracts
(``tandem.contracts.ErrorCode``, or a more precise one such as a
``TrainerConflictCode``), the others are DRF's. ``message`` is for people.
``fields`` maps a dotted field path to its messages; it is empty unless the
request itself was invalid.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import DataError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from common.domain_errors import Conflict, DomainError, Forbidden, InvalidInput, NotFound
from tandem.contracts import ErrorCode

logger = logging.getLogger(__name__)

_DOMAIN_STATUS = {
    InvalidInput: status.HTTP_400_BAD_REQUEST,
    NotFound: status.HTTP_404_NOT_FOUND,
    Conflict: status.HTTP_409_CONFLICT,
    Forbidden: status.HTTP_403_FORBIDDEN,
}


def error_body(*, code: str, message: str, fields: dict[str, list[str]] | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, DomainError):
        status_code = next(
            (code for cls, code in _DOMAIN_STATUS.items() if isinstance(exc, cls)),
            status.HTTP_400_BAD_REQUEST,
        )
        body = error_body(code=exc.code, message=exc.message, fields=exc.fields)
        return Response(body, status=status_code)

    if isinstance(exc, DataError):
        # The database refused a value (out of range, a NUL byte) that no check caught
        # first. The input is at fault, not the server; the log says which check is missing.
        logger.warning("DataError reached the API's exception handler: %s", exc)
        body = error_body(
            code=ErrorCode.INVALID, message=f"A value cannot be stored: {str(exc).splitlines()[0]}"
        )
        return Response(body, status=status.HTTP_400_BAD_REQUEST)

    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # an unexpected error: let Django report a 500

    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        first_field, first_messages = next(iter(fields.items()), ("", ["Invalid input."]))
        message = f"{first_field}: {first_messages[0]}" if first_field else first_messages[0]
        response.data = error_body(code=ErrorCode.INVALID, message=message, fields=fields)
    elif isinstance(exc, exceptions.APIException):
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        response.data = error_body(code=code, message=str(exc.detail))
    return response


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as ``{"config.model.num_heads": ["..."]}``."""
    if isinstance(detail, dict):
        fields: dict[str, list[str]] = {}
        for key, value in detail.items():
            fields.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return fields
    if isinstance(detail, list) and any(isinstance(item, dict | list) for item in detail):
        fields = {}
        for index, value in enumerate(detail):
            if value:
                fields.update(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
        return fields
    messages = detail if isinstance(detail, list) else [detail]
    return {prefix or "non_field_errors": [str(message) for message in messages]}
