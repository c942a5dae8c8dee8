from __future__ import annotations

from django.urls import path

from backend.runs.consumers.follow import RunFollowConsumer, WorkspaceRunsConsumer
from backend.runs.consumers.runner import RunnerConsumer

websocket_urlpatterns = [
    path("ws/runner/", RunnerConsumer.as_asgi()),
    path("ws/v1/workspaces/<slug:workspace>/runs/", WorkspaceRunsConsumer.as_asgi()),
    path("ws/v1/workspaces/<slug:workspace>/runs/<str:run>/", RunFollowConsumer.as_asgi()),
]
