"""The runner as this server serves it (``/runner/wheels/``), for machines
that boot from an image and install it at first boot (docs/RUNNER.md,
"Bootstrap").

No authentication: the files are the runner's public code and public
packages, and the installer then needs no token (the bootstrap token stays
out of every URL, log and proxy). The wheels are made on the first request
(``runner_wheels``), in a worker thread so the web process keeps serving.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.views.decorators.http import require_safe

from backend.clouds.services.runner_wheels import WheelhouseError, index_html, wheel_path


@require_safe
async def runner_wheels_index(request: HttpRequest) -> HttpResponseBase:
    try:
        page = await sync_to_async(index_html, thread_sensitive=False)()
    except WheelhouseError as e:
        return _unavailable(e)
    return HttpResponse(page, content_type="text/html; charset=utf-8")


@require_safe
async def runner_wheel(request: HttpRequest, name: str) -> HttpResponseBase:
    try:
        path = await sync_to_async(wheel_path, thread_sensitive=False)(name)
    except WheelhouseError as e:
        return _unavailable(e)
    if path is None:
        return HttpResponse(f"no wheel {name!r} here; the list is at ./\n", status=404, content_type="text/plain")
    data = await sync_to_async(path.read_bytes, thread_sensitive=False)()  # a few MB at most
    return HttpResponse(
        data,
        content_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{name}"', "X-Content-Type-Options": "nosniff"},
    )


def _unavailable(error: WheelhouseError) -> HttpResponse:
    body = f"the runner's wheels are not available: {error}\n"
    return HttpResponse(body, status=503, content_type="text/plain; charset=utf-8", headers={"Retry-After": "30"})
