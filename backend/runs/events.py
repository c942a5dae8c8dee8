"""Publishing to the channel layer: how events cross web processes.

Group names: ``run.<run id>`` (a run's status and log lines) and
``workspace.<workspace id>`` (status changes of every run in it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backend.core.channels import publish, send_to_channel
from backend.runs.models import Run

__all__ = ["publish", "publish_run", "run_group", "send_to_channel", "snapshot_with", "workspace_group"]

# How a run looks on the wire: the API's shape, plugged in by RunsConfig.ready
# (the services that publish never import the API layer).
_snapshot: Callable[[Run], dict[str, Any]] | None = None


def snapshot_with(snapshot: Callable[[Run], dict[str, Any]]) -> None:
    global _snapshot
    _snapshot = snapshot


def publish_run(run_id: str) -> None:
    """The run's current state to its followers and its workspace's."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or _snapshot is None:
        return
    data = _snapshot(run)
    publish(run_group(run.pk), {"type": "run.status", "run": data})
    publish(workspace_group(run.workspace_id), {"type": "run.status", "run": data})


def run_group(run_id: object) -> str:
    return f"run.{run_id}"


def workspace_group(workspace_id: object) -> str:
    return f"workspace.{workspace_id}"
