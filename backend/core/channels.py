"""Sending to the channel layer, best effort: how events cross processes."""

from __future__ import annotations

import json
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils.crypto import constant_time_compare, salted_hmac

logger = logging.getLogger(__name__)

_SALT = "trainyard.channel-message"


def signed(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with ``sig``: an HMAC of its content under the server's
    key. Whoever can write to Redis (the channel layer) cannot make one."""
    body = {k: v for k, v in message.items() if k != "sig"}
    return {**body, "sig": salted_hmac(_SALT, json.dumps(body, sort_keys=True)).hexdigest()}


def verified(message: dict[str, Any]) -> bool:
    """Whether ``message`` carries the server's signature of its content."""
    sig = message.get("sig")
    return isinstance(sig, str) and constant_time_compare(sig, signed(message)["sig"])


def publish(group: str, message: dict[str, Any]) -> None:
    """A follower that misses an event re-reads state on reconnect."""
    try:
        async_to_sync(get_channel_layer().group_send)(group, message)
    except Exception:  # the channel layer being down must not fail a transition
        logger.warning("could not publish %s to %s", message.get("type"), group, exc_info=True)


def send_to_channel(channel_name: str, message: dict[str, Any]) -> None:
    """``message`` to one consumer, signed (``signed``): a runner's consumer
    forwards or acts on nothing the server did not sign."""
    try:
        async_to_sync(get_channel_layer().send)(channel_name, signed(message))
    except Exception:
        logger.warning("could not send %s to %s", message.get("type"), channel_name, exc_info=True)
