"""Publishing to the channel layer: how events cross web processes.

Group names: ``run.<run id>`` (a run's status and log lines) and
``workspace.<workspace id>`` (status changes of every run in it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from backend.core.channels import publish, send_to_channel
from backend.runs.models import Run

__all__ = [
    "publish",
    "publish_run",
    "publish_runs",
    "publishing_held",
    "run_group",
    "send_to_channel",
    "snapshot_with",
    "workspace_group",
]

# How a run looks on the wire: the API's shape, plugged in by RunsConfig.ready
# (the services that publish never import the API layer).
_snapshot: Callable[[Run], dict[str, Any]] | None = None


def snapshot_with(snapshot: Callable[[Run], dict[str, Any]]) -> None:
    global _snapshot
    _snapshot = snapshot


# Per thread: the runs whose publishing is held back (``publishing_held``).
_held = threading.local()


@contextmanager
def publishing_held() -> Iterator[set[str]]:
    """Inside, ``publish_run`` only notes the run (in the set it yields); the
    caller publishes them with ``publish_runs`` once it has done what must
    not wait for a run's snapshot (the runner's confirmation)."""
    outer = getattr(_held, "runs", None)
    held: set[str] = set()
    _held.runs = held
    try:
        yield held
    finally:
        _held.runs = outer


def publish_runs(run_ids: set[str]) -> None:
    for run_id in run_ids:
        publish_run(run_id)


def publish_run(run_id: str) -> None:
    """The run's current state to its followers and its workspace's."""
    held = getattr(_held, "runs", None)
    if held is not None:
        held.add(str(run_id))
        return
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
