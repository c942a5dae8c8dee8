"""Publishing to the channel layer: how events cross web processes.

Group names: ``run.<run id>`` (a run's status and log lines) and
``workspace.<workspace id>`` (status changes of every run in it).
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def run_group(run_id: object) -> str:
    return f"run.{run_id}"


def workspace_group(workspace_id: object) -> str:
    return f"workspace.{workspace_id}"


def publish(group: str, message: dict[str, Any]) -> None:
    """Best effort: a follower that misses an event re-reads state on reconnect."""
    try:
        async_to_sync(get_channel_layer().group_send)(group, message)
    except Exception:  # the channel layer being down must not fail a transition
        logger.warning("could not publish %s to %s", message.get("type"), group, exc_info=True)


def send_to_channel(channel_name: str, message: dict[str, Any]) -> None:
    try:
        async_to_sync(get_channel_layer().send)(channel_name, message)
    except Exception:
        logger.warning("could not send %s to %s", message.get("type"), channel_name, exc_info=True)
