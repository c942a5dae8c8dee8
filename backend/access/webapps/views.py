"""The dashboard's side of opening an app: ``GET /open/<workspace>/<run>/<job>/<port>/``.

A link on the job's page (a top-level navigation, so the session cookie
comes along). For a signed-in member or admin it grants a session into the
port and redirects to the app's origin with a one-time code
(``passes.app_open``); anyone else gets a page that says why not: signed
out (to the sign-in page), another workspace's run (404), a viewer (403), a
job that does not run or a port it does not serve (409/404).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from backend.access.services.sessions import AccessRefused
from backend.access.webapps import pages
from backend.access.webapps.passes import app_open
from backend.accounts.models import User
from backend.accounts.selectors import membership_get
from backend.core.ratelimit import client_ip
from backend.runs.selectors import run_get

MAX_PATH = 2000


@never_cache
@require_GET
def open_app(request: HttpRequest, workspace: str, run: str, job: str, port: int) -> HttpResponse:
    if settings.APPS is None:
        return _page(404, "Apps are not served here", "Jobs' web apps need TRAINYARD_APPS_URL (docs/DEPLOY.md).")
    user = request.user
    if not isinstance(user, User) or not user.is_authenticated or request.session.session_key is None:
        return HttpResponseRedirect(settings.LOGIN_URL)
    membership = membership_get(user=user, workspace_slug=workspace)
    found = run_get(workspace=membership.workspace, ref=run) if membership is not None else None
    named = found.jobs.filter(name=job).first() if found is not None else None
    if membership is None or found is None or named is None:
        return _page(404, "Not found", f"There is no job {job} of run {run} in workspace {workspace}.")
    try:
        url = app_open(
            apps=settings.APPS,
            workspace=membership.workspace,
            user=user,
            run=found,
            job=named,
            port=port,
            session_key=request.session.session_key,
            session_expires_at=request.session.get_expiry_date().timestamp(),
            client_address=client_ip(request),
            path=_landing(request.GET.get("path", "/")),
        )
    except AccessRefused as refused:
        return _page(refused.status_code, "Cannot open this app", refused.message)
    return HttpResponseRedirect(url)


def _landing(path: str) -> str:
    """Where in the app to land: a path of its own origin, else its root."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path or len(path) > MAX_PATH:
        return "/"
    return path


def _page(status: int, title: str, text: str) -> HttpResponse:
    return HttpResponse(pages.html(pages.Page(title, text)), status=status, content_type="text/html; charset=utf-8")
