"""DRF's throttle interface over the Redis counters of ``backend.core.ratelimit``.

A view opts in per method: ``throttle_scopes = {"POST": "run"}``, or by
what the request asks with ``throttle_scope_of(request)``. Each hit
counts once per user (the signed-in user, or what ``throttle_user(request)``
on the view names, e.g. the username a login tries) and once per client
address (``REMOTE_ADDR``: behind a proxy, the ASGI server sets it from
``X-Forwarded-For`` for trusted proxies only, uvicorn's
``--forwarded-allow-ips``). Over either limit: 429 with ``Retry-After``.
"""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from backend.core.ratelimit import Refusal, client_ip, rate_hit


class RateLimited(exceptions.Throttled):
    """Over a rate limit; the API answers 429 with ``Retry-After`` (backend.core.api_errors)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(wait=refusal.retry_after, detail=refusal.message)
        self.refusal = refusal


class ScopedRedisThrottle(BaseThrottle):
    def allow_request(self, request: Request, view: Any) -> bool:
        scope = _scope(request, view)
        if scope is None:
            return True
        refusal = throttle_hit(scope=scope, user=_user_identity(request, view), ip=client_ip(request))
        if refusal is not None:
            raise RateLimited(refusal)
        return True


def throttle_hit(*, scope: str, user: str, ip: str) -> Refusal | None:
    """One hit per user and per address (both are counted); the first refusal."""
    by_user = rate_hit(scope=scope, kind="user", identity=user)
    by_ip = rate_hit(scope=scope, kind="ip", identity=ip)
    return by_user or by_ip


def refusal_response(refusal: Refusal) -> JsonResponse:
    """The 429 of a plain Django view (the API's own come from ``RateLimited``)."""
    body = {"message": refusal.message, "extra": refusal.extra}
    return JsonResponse(body, status=429, headers={"Retry-After": str(refusal.retry_after)})


def _scope(request: Request, view: Any) -> str | None:
    """The view's ``throttle_scope_of(request)`` when it chooses by more
    than the method (a log search, not a page), else its ``throttle_scopes``."""
    chosen = getattr(view, "throttle_scope_of", None)
    if chosen is not None:
        return chosen(request)
    return getattr(view, "throttle_scopes", {}).get(request.method)


def _user_identity(request: Request, view: Any) -> str:
    named = getattr(view, "throttle_user", None)
    if named is not None:
        return str(named(request))
    user = getattr(request, "user", None)
    return f"user:{user.pk}" if user is not None and user.is_authenticated else ""
