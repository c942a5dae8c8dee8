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
    except BaseException:
        # What committed before the error is published now: the caller that
        # would have published it will not.
        _held.runs = outer
        publish_runs(held)
        raise
    finally:
        _held.runs = outer


def publish_runs(run_ids: set[str], *, shown: tuple[Run, dict[str, Any]] | None = None) -> None:
    """``publish_run`` for each of ``run_ids``; ``shown`` is one run and the
    snapshot the caller read already (a submission's answer), not read again."""
    for run_id in run_ids:
        if shown is not None and str(shown[0].pk) == run_id:
            _publish(*shown)
        else:
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
    _publish(run, _snapshot(run))


def _publish(run: Run, data: dict[str, Any]) -> None:
    publish(run_group(run.pk), {"type": "run.status", "run": data})
    publish(workspace_group(run.workspace_id), {"type": "run.status", "run": data})


def run_group(run_id: object) -> str:
    return f"run.{run_id}"


def workspace_group(workspace_id: object) -> str:
    return f"workspace.{workspace_id}"
