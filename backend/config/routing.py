from __future__ import annotations

from django.urls import path

from backend.access.consumers.ends import client_end, runner_end
from backend.runs.consumers.follow import RunFollowConsumer, WorkspaceRunsConsumer
from backend.runs.consumers.runner import RunnerConsumer

websocket_urlpatterns = [
    path("ws/runner/", RunnerConsumer.as_asgi()),
    path("ws/runner/relay/<uuid:session>/", runner_end),
    path("ws/v1/relay/<uuid:session>/", client_end),
    path("ws/v1/workspaces/<slug:workspace>/runs/", WorkspaceRunsConsumer.as_asgi()),
    path("ws/v1/workspaces/<slug:workspace>/runs/<str:run>/", RunFollowConsumer.as_asgi()),
]
