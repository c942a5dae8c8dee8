"""Publishing to the channel layer: how events cross web processes.

Group names: ``run.<run id>`` (a run's status and log lines) and
``workspace.<workspace id>`` (status changes of every run in it).
"""

from __future__ import annotations

from backend.core.channels import publish, send_to_channel

__all__ = ["publish", "run_group", "send_to_channel", "workspace_group"]


def run_group(run_id: object) -> str:
    return f"run.{run_id}"


def workspace_group(workspace_id: object) -> str:
    return f"workspace.{workspace_id}"
