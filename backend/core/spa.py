"""The web dashboard: one HTML page for every client-side route.

The single-page app is built into ``frontend/dist`` (``npm run build``): an
``index.html`` and hashed files under ``app-assets/``, which WhiteNoise serves
at ``/app-assets/`` (``WHITENOISE_ROOT``). Every other path that is not the
API, a websocket, the admin, storage, sign-in or static files gets
``index.html``, so that a reload or a shared link of ``/w/<ws>/runs/<run>``
works. ``ensure_csrf_cookie`` sets the ``csrftoken`` cookie the app sends back
in ``X-CSRFToken`` and in the GitHub sign-in form.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import re_path
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import ensure_csrf_cookie

from backend.core.views import home

DIST_DIR = Path(settings.BASE_DIR) / "frontend" / "dist"

# Paths the app never owns. `storage` also covers `storage-archive/`.
_SERVER_PREFIXES = ("api/", "ws/", "admin/", "storage", "auth/", "static/", "app-assets/")
_CLIENT_ROUTE = r"^(?!(?:" + "|".join(re.escape(p) for p in _SERVER_PREFIXES) + r")).*$"


@never_cache
@ensure_csrf_cookie
def index(request: HttpRequest) -> HttpResponse:
    """The built app's index.html; the old help page while it is not built."""
    page = DIST_DIR / "index.html"
    if not page.is_file():
        return home(request)
    return HttpResponse(page.read_bytes(), content_type="text/html; charset=utf-8")


# Last in urlpatterns: `/` and every client-side route.
urlpattern = re_path(_CLIENT_ROUTE, index, name="home")
