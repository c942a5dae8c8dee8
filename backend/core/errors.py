"""Domain errors: a rule was broken, and the message says so to the user.

Services and selectors raise these; they know nothing of HTTP frameworks.
The API turns them into the one error format (``backend.core.api_errors``).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any


class ApplicationError(Exception):
    """A rule of the domain was broken; the message is for the user.

    ``status_code`` is the HTTP status the API answers with (400 unless a
    subclass or the caller says otherwise).
    """

    status_code: int = HTTPStatus.BAD_REQUEST

    def __init__(self, message: str, *, extra: dict[str, Any] | None = None, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra or {}
        if status_code is not None:
            self.status_code = status_code


class NotFound(ApplicationError):
    status_code = HTTPStatus.NOT_FOUND
