"""One error format for the API: {"message": ..., "extra": {...}}.

DRF's exception handler (``REST_FRAMEWORK["EXCEPTION_HANDLER"]``): domain
errors (``backend.core.errors``) keep their message and status, DRF's and
Django's own errors are reshaped, anything else is logged and becomes a 500.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from backend.core.errors import ApplicationError
from backend.core.throttling import RateLimited

logger = logging.getLogger(__name__)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ApplicationError):
        return Response({"message": exc.message, "extra": exc.extra}, status=exc.status_code)
    if isinstance(exc, RateLimited):
        headers = {"Retry-After": str(exc.refusal.retry_after)}
        return Response({"message": exc.refusal.message, "extra": exc.refusal.extra}, status=429, headers=headers)
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        message = f"The request body is larger than the {limit:,} bytes this endpoint takes."
        return Response({"message": message, "extra": {"limit_bytes": limit}}, status=413)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found.")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = exception_handler(exc, context)
    if response is None:
        logger.exception("unhandled API error", exc_info=exc)
        return Response(
            {"message": "Internal error: the server logged the details.", "extra": {}},
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    response.data = _format(exc, response.data)
    return response


def _format(exc: Exception, data: Any) -> dict[str, Any]:
    if isinstance(exc, exceptions.ValidationError):
        fields = data if isinstance(data, dict) else {"non_field_errors": data}
        first = _first_message(fields)
        return {"message": f"Invalid input: {first}", "extra": {"fields": fields}}
    detail = data.get("detail", data) if isinstance(data, dict) else data
    return {"message": str(detail), "extra": {}}


def _first_message(fields: dict[str, Any]) -> str:
    for key, value in fields.items():
        while isinstance(value, (list, dict)) and value:
            value = value[0] if isinstance(value, list) else next(iter(value.values()))
        return f"{key}: {value}" if key != "non_field_errors" else str(value)
    return "invalid request"
