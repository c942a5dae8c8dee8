"""Answers /healthz, /readyz and /metrics first in the middleware chain.

A load balancer or orchestrator probes a process by its own address, over
plain HTTP, without cookies: the host check (ALLOWED_HOSTS), the HTTPS
redirect, sessions, CSRF, authentication and rate limits would refuse or
redirect it, or make it depend on the database it is checking. These
paths are served before all of that, with their own access rule (the
metrics token)."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed

from backend.ops.views import healthz, metrics_view, readyz

ENDPOINTS: dict[str, Callable[[HttpRequest], HttpResponse]] = {
    "/healthz": healthz,
    "/readyz": readyz,
    "/metrics": metrics_view,
}


class OperationsEndpoints:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        view = ENDPOINTS.get(request.path_info.rstrip("/") or "/")
        if view is None:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        response = view(request)
        response["Cache-Control"] = "no-store"
        return response
