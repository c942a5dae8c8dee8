"""GitHub sign-in views around social-auth's (``social:begin`` is POST-only, with CSRF)."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from social_django import views as social_views

from backend.core.ratelimit import client_ip
from backend.core.throttling import refusal_response, throttle_hit


def github_begin(request: HttpRequest, backend: str) -> HttpResponse:
    """Social-auth's start of a sign-in (POST-only, with CSRF), counted per
    address under the ``login`` rate limit (nobody is known yet: no per-user count)."""
    if request.method == "POST":
        refusal = throttle_hit(scope="login", user="", ip=client_ip(request))
        if refusal is not None:
            return refusal_response(refusal)
    return social_views.auth(request, backend)


@never_cache
@require_GET
def github_complete(request: HttpRequest, backend: str) -> HttpResponse:
    """GitHub's callback. Whoever is signed in here is ignored: the callback signs the GitHub user in.

    Social-auth would otherwise attach the GitHub identity to the session's
    user (say, the local admin) and not switch sessions; Trainyard links
    accounts by GitHub id only.
    """
    request.user = AnonymousUser()
    return social_views.complete(request, backend)
