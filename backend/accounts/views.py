"""GitHub sign-in views around social-auth's (``social:begin`` is POST-only, with CSRF)."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from social_django import views as social_views


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
