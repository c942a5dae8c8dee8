"""The Content-Security-Policy header (docs/decisions/0041-https-and-csp.md).

The dashboard (frontend/dist) loads only its own hashed files: no inline
script or ``<style>`` element, no other origin but the avatars' images (style
attributes are allowed: the terminal's renderer sets them). So every response
gets a policy that allows scripts, styles, fonts and connections (websockets
included: ``'self'`` covers ws/wss of this host) from this origin only, and
cannot be framed. Django's admin, the API docs and the help page carry
inline styles: theirs allows inline styles, never inline scripts. A response
that already has a policy (storage downloads send ``sandbox``) keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"
# Pages rendered by Django or drf-spectacular templates, not by the dashboard.
_INLINE_STYLE_PREFIXES = ("/admin/", "/api/v1/docs/")


def policy(*, inline_styles: bool = False) -> str:
    """The policy; ``form-action`` also allows GitHub, where the sign-in form redirects."""
    github = urlsplit(settings.GITHUB_URL)
    styles = "'self' 'unsafe-inline'" if inline_styles else "'self'"
    directives = {
        "default-src": "'self'",
        "script-src": "'self'",
        "style-src": styles,
        # Style attributes, not <style> elements: the run page's terminal (xterm.js)
        # colours its cells with them. An attribute holds no selector, so it cannot
        # read the page the way an injected stylesheet can (decision 0103-browser-terminal).
        "style-src-attr": "'unsafe-inline'",
        # Avatars come from GitHub (or GitHub Enterprise): images only, any https host;
        # artifact previews are blob: URLs of bytes the app fetched.
        "img-src": "'self' data: blob: https:",
        "font-src": "'self' data:",
        "connect-src": "'self'",
        "object-src": "'none'",
        "base-uri": "'self'",
        "form-action": f"'self' {github.scheme}://{github.netloc}",
        "frame-ancestors": "'none'",
    }
    return "; ".join(f"{name} {value}" for name, value in directives.items())


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.strict = policy()
        self.relaxed = policy(inline_styles=True)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if HEADER in response:
            return response
        if settings.DEBUG and response.status_code >= 400:
            return response  # Django's debug error pages are inline-styled and scripted
        relaxed = request.path.startswith(_INLINE_STYLE_PREFIXES)
        response[HEADER] = self.relaxed if relaxed else self.strict
        return response


def with_inline_styles(response: HttpResponse) -> HttpResponse:
    """The policy for a page of this server's own templates with a ``<style>``."""
    response[HEADER] = policy(inline_styles=True)
    return response
