"""Which pages may open a websocket that the session cookie authenticates.

A browser sends the site's cookies with a websocket opened by any page, and
the same-origin policy does not apply to websockets: without this check a
page on another origin of the same site (another port, a sibling host) could
follow a signed-in user's runs. Such sockets must come from an allowed
``Origin``; sockets that carry an ``Authorization`` header (the CLI, runners:
no browser can set that header) need none.

Allowed: the origin of the request's own ``Host`` (same origin), the origin of
``TRAINYARD_PUBLIC_URL``, ``CSRF_TRUSTED_ORIGINS`` (``https://*.example.com``
patterns too) and the hosts of ``ALLOWED_HOSTS`` except ``*``. Never an
origin on the apps domain (TRAINYARD_APPS_URL): a job's page is untrusted.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import validate_host
from django.utils.http import is_same_domain

logger = logging.getLogger(__name__)

ASGIApp = Any


def scope_ip(scope: dict[str, Any]) -> str:
    """The client's address (the ASGI server resolved trusted proxies' X-Forwarded-For)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


def websocket_origin_allowed(*, origin: str, host: str) -> bool:
    """``origin`` is the Origin header (``scheme://host[:port]``), ``host`` the Host header."""
    parts = urlsplit(origin)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        return False
    if settings.APPS is not None and settings.APPS.covers(parts.netloc):
        return False  # a job's web app is never trusted by the dashboard
    if parts.netloc == host or origin == _origin(settings.PUBLIC_URL):
        return True
    if any(_trusted(origin, parts.netloc, pattern) for pattern in settings.CSRF_TRUSTED_ORIGINS):
        return True
    return validate_host(parts.hostname, [h for h in settings.ALLOWED_HOSTS if h != "*"])


class WebsocketOriginGuard:
    """ASGI middleware for the websocket router: refuses the handshake (HTTP
    403) of a socket that brings cookies and no ``Authorization`` header, and
    whose ``Origin`` is missing or not allowed. Without cookies a socket is
    anonymous anyway (the consumer closes it 4401)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers", []))
        if scope["type"] != "websocket" or b"authorization" in headers or b"cookie" not in headers:
            await self.app(scope, receive, send)
            return
        origin = headers.get(b"origin", b"").decode("latin-1")
        host = headers.get(b"host", b"").decode("latin-1")
        if websocket_origin_allowed(origin=origin, host=host):
            await self.app(scope, receive, send)
            return
        logger.warning("refused a websocket to %s from origin %r", scope.get("path"), origin or None)
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008})


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _trusted(origin: str, netloc: str, pattern: str) -> bool:
    """CsrfViewMiddleware's matching: exact, or ``scheme://*.domain`` for its subdomains."""
    if "*" not in pattern:
        return origin == pattern
    scheme, _, domain = pattern.partition("://*")
    return origin.startswith(f"{scheme}://") and is_same_domain(netloc, domain)
