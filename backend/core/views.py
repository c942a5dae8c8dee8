"""The home page until the dashboard lands: says so, and how to get going."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from backend.core.csp import with_inline_styles


def home(request: HttpRequest) -> HttpResponse:
    return with_inline_styles(render(request, "home.html", {"user": request.user}))
