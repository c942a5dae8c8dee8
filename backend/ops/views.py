"""/healthz, /readyz and /metrics (docs/DEPLOY.md, "Health checks" and "Metrics").

Plain Django views, reached through ``middleware.OperationsEndpoints`` before
anything that would refuse or redirect a probe."""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST

from backend.ops import metrics
from backend.ops.health import readiness

logger = logging.getLogger(__name__)

METRICS_OFF = (
    "Metrics are off. Set TRAINYARD_METRICS_TOKEN on the server to a long random value and scrape "
    "/metrics with the header 'Authorization: Bearer <token>' (docs/DEPLOY.md, \"Metrics\").\n"
)


def healthz(request: HttpRequest) -> HttpResponse:
    """The process is up and serving; touches nothing else."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> HttpResponse:
    checks = readiness()
    failed = [c for c in checks if not c.ok]
    body = {
        "status": "unready" if failed else "ready",
        "checks": {c.name: {"ok": c.ok, **({"error": c.error} if c.error else {})} for c in checks},
    }
    if failed:
        body["message"] = "not ready: " + "; ".join(f"{c.name}: {c.error}" for c in failed)
    return JsonResponse(body, status=503 if failed else 200)


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if not token:
        return HttpResponse(METRICS_OFF, status=404, content_type="text/plain; charset=utf-8")
    sent = request.headers.get("Authorization", "")
    scheme, _, credential = sent.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(credential.strip().encode(), token.encode()):
        response = HttpResponse(
            "A valid metrics token is required: 'Authorization: Bearer <TRAINYARD_METRICS_TOKEN>'.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    try:
        text = metrics.render()
    except Exception as exc:  # the database or Redis cannot be read: no half scrape
        logger.warning("metrics: scrape failed", exc_info=True)
        return HttpResponse(f"Metrics unavailable: {exc}\n", status=503, content_type="text/plain; charset=utf-8")
    return HttpResponse(text, content_type=CONTENT_TYPE_LATEST)
