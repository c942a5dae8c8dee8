"""The runner and the CLI as this server serves them: ``/runner/wheels/``
for machines that boot from an image and install it at first boot
(docs/RUNNER.md, "Bootstrap") and for self-hosted machines, ``/cli/wheels/``
for users (docs/CLI.md, "Installing"). Each folder is a find-links page and a
PEP 503 index (``<folder>/<project>/``), so both ``pip install --find-links``
and ``pip install --extra-index-url`` resolve from it.

No authentication: the files are public code and public packages, and the
installer then needs no token (the bootstrap token stays out of every URL,
log and proxy). The runner's wheels are made on the first request
(``runner_wheels``), in a worker thread so the web process keeps serving.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.views.decorators.http import require_safe

from backend.clouds.services import cli_wheels
from backend.clouds.services.runner_wheels import WheelhouseError, index_html, project_html, wheel_path


@require_safe
async def runner_wheels_index(request: HttpRequest) -> HttpResponseBase:
    try:
        page = await sync_to_async(index_html, thread_sensitive=False)()
    except WheelhouseError as e:
        return _unavailable(e)
    return HttpResponse(page, content_type="text/html; charset=utf-8")


@require_safe
async def runner_wheels_project(request: HttpRequest, project: str) -> HttpResponseBase:
    try:
        page = await sync_to_async(project_html, thread_sensitive=False)(project)
    except WheelhouseError as e:
        return _unavailable(e)
    return _project_page(page, project)


@require_safe
async def runner_wheel(request: HttpRequest, name: str) -> HttpResponseBase:
    try:
        path = await sync_to_async(wheel_path, thread_sensitive=False)(name)
    except WheelhouseError as e:
        return _unavailable(e)
    if path is None:
        return HttpResponse(f"no wheel {name!r} here; the list is at ./\n", status=404, content_type="text/plain")
    data = await sync_to_async(path.read_bytes, thread_sensitive=False)()  # a few MB at most
    return _wheel(data, name)


@require_safe
async def cli_wheels_index(request: HttpRequest) -> HttpResponseBase:
    try:
        house = await sync_to_async(cli_wheels.wheelhouse, thread_sensitive=False)()
    except cli_wheels.CliWheelsError as e:
        return _unavailable(e, "the CLI's")
    return HttpResponse(house.index_html(), content_type="text/html; charset=utf-8")


@require_safe
async def cli_wheels_project(request: HttpRequest, project: str) -> HttpResponseBase:
    try:
        house = await sync_to_async(cli_wheels.wheelhouse, thread_sensitive=False)()
    except cli_wheels.CliWheelsError as e:
        return _unavailable(e, "the CLI's")
    return _project_page(house.project_html(project), project)


@require_safe
async def cli_wheel(request: HttpRequest, name: str) -> HttpResponseBase:
    try:
        house = await sync_to_async(cli_wheels.wheelhouse, thread_sensitive=False)()
    except cli_wheels.CliWheelsError as e:
        return _unavailable(e, "the CLI's")
    data = house.wheel(name)
    if data is None:
        return HttpResponse(f"no wheel {name!r} here; the list is at ./\n", status=404, content_type="text/plain")
    return _wheel(data, name)


def _project_page(page: bytes | None, project: str) -> HttpResponse:
    if page is None:  # pip then looks in the other indexes it was given
        return HttpResponse(f"no project {project!r} here\n", status=404, content_type="text/plain")
    return HttpResponse(page, content_type="text/html; charset=utf-8")


def _wheel(data: bytes, name: str) -> HttpResponse:
    return HttpResponse(
        data,
        content_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{name}"', "X-Content-Type-Options": "nosniff"},
    )


def _unavailable(error: Exception, whose: str = "the runner's") -> HttpResponse:
    body = f"{whose} wheels are not available: {error}\n"
    return HttpResponse(body, status=503, content_type="text/plain; charset=utf-8", headers={"Retry-After": "30"})
