"""Sending to the channel layer, best effort: how events cross processes."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def publish(group: str, message: dict[str, Any]) -> None:
    """A follower that misses an event re-reads state on reconnect."""
    try:
        async_to_sync(get_channel_layer().group_send)(group, message)
    except Exception:  # the channel layer being down must not fail a transition
        logger.warning("could not publish %s to %s", message.get("type"), group, exc_info=True)


def send_to_channel(channel_name: str, message: dict[str, Any]) -> None:
    try:
        async_to_sync(get_channel_layer().send)(channel_name, message)
    except Exception:
        logger.warning("could not send %s to %s", message.get("type"), channel_name, exc_info=True)
