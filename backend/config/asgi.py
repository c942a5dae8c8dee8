"""ASGI entry: HTTP through Django, websockets through Channels."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.config.settings")

from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from backend.clouds.pulse import serve_lifespan  # noqa: E402
from backend.config.routing import websocket_urlpatterns  # noqa: E402

router = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Authentication happens in each consumer (token header or session),
        # so consumers can close with 4401/4403 instead of a bare 403.
        "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
    }
)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The router, plus the lifespan: while this process serves, it writes its
    pulse (``backend.clouds.pulse``), so the reconciler can tell "a runner went
    silent" from "this server could not hear anyone"."""
    if scope["type"] == "lifespan":
        await serve_lifespan(receive, send)
        return
    await router(scope, receive, send)
