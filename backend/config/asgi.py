"""ASGI entry: HTTP through Django, websockets through Channels; the apps
domain's requests through the apps proxy (backend/access/webapps/proxy.py)."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.config.settings")

from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from backend.access.webapps.proxy import apps_application, serves_apps  # noqa: E402
from backend.clouds.pulse import pulse_without_lifespan, serve_lifespan  # noqa: E402
from backend.config.body_limit import BodyLimit  # noqa: E402
from backend.config.routing import websocket_urlpatterns  # noqa: E402
from backend.core.origins import WebsocketOriginGuard  # noqa: E402
from backend.ops.connections import CountConnections, publish_forever  # noqa: E402

router = ProtocolTypeRouter(
    {
        # An oversized body is refused before Django reads it (body_limit.py).
        "http": BodyLimit(django_asgi_app),
        # Authentication happens in each consumer (token header or session),
        # so consumers can close with 4401/4403 instead of a bare 403. A socket
        # the session cookie would authenticate must come from an allowed Origin.
        # Open sockets are counted for /metrics (backend/ops/connections.py).
        "websocket": CountConnections(WebsocketOriginGuard(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
    }
)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The router, plus the lifespan: while this process serves, it writes its
    pulse (``backend.clouds.pulse``), so the reconciler can tell "a runner went
    silent" from "this server could not hear anyone", and publishes its count
    of open websockets (``backend.ops.connections``). A server that sends no
    lifespan starts them with its first request, and logs that it did."""
    if scope["type"] == "lifespan":
        await serve_lifespan(receive, send, also=[publish_forever])
        return
    pulse_without_lifespan(scope, also=[publish_forever])
    if serves_apps(scope):
        # The apps domain (TRAINYARD_APPS_URL) is jobs' web apps': the apps
        # proxy answers it, never Django, and it answers nothing else.
        await apps_application(scope, receive, send)
        return
    await router(scope, receive, send)
