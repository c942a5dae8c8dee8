"""Text no client means and Postgres may not store: refused with a 400 before any view.

A NUL reaching a query makes Postgres raise (a 500), and a control character
in a URL or query parameter is never part of a name, a tag or a filter. So
``RefuseControlCharacters`` (a middleware) answers 400 for a path or query
that holds one, and ``JSONParser`` (the API's parser) for a JSON body with
a NUL in any key or string (other control characters are text there: logs,
workflow files).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import parsers
from rest_framework.exceptions import ParseError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RefuseControlCharacters:
    """Django middleware: 400 in the one error format for a control character in the path or query."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = url_problem(request)
        if problem is not None:
            message, extra = problem
            return JsonResponse({"message": message, "extra": extra}, status=400)
        return self.get_response(request)


def url_problem(request: HttpRequest) -> tuple[str, dict[str, Any]] | None:
    """(message, extra) for the first control character in the path or a query parameter, else None."""
    found = _CONTROL.search(request.path)
    if found:
        return f"The URL path contains a control character ({_code(found)}).", {}
    for name, values in request.GET.lists():
        for text in (name, *values):
            found = _CONTROL.search(text)
            if found:
                return (
                    f"The query parameter {name!r} contains a control character ({_code(found)}).",
                    {"parameter": name},
                )
    return None


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser that refuses a NUL in any key or string, naming where."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        where = _nul_at(data, "")
        if where is not None:
            raise ParseError(f"The JSON body contains a NUL character (U+0000) at {where or 'the top level'}.")
        return data


def _nul_at(value: Any, where: str) -> str | None:
    """The dotted path of the first string or key holding a NUL, else None."""
    if isinstance(value, str):
        return where if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            if "\x00" in str(key):
                return inner.replace("\x00", "\\0")
            found = _nul_at(item, inner)
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _nul_at(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def _code(found: re.Match[str]) -> str:
    return f"U+{ord(found.group()):04X}"
