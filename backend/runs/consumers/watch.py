"""What a browser or CLI websocket re-checks while it is open.

A follower may stay connected for days. Every ``interval()`` seconds it
1. re-checks what let it in: the API token (revoked, expired) or the session
   (signed out), the account (deactivated) and the membership of the
   workspace (removed); once one is gone it leaves its groups and is closed
   with 4401 (credentials) or 4403 (membership) and the reason;
2. calls the consumer's ``on_tick`` (a run's follower catches up from
   storage what lost events did not bring).

The groups' memberships are the process's relays', renewed by them (fanout.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from backend.accounts.models import User
from backend.accounts.selectors import AccessLost, access_lost

logger = logging.getLogger(__name__)

CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403


@dataclass(frozen=True)
class Credentials:
    """What a socket was let in with: a token, else the session's key."""

    user: User
    token: str | None
    session_key: str | None
    workspace_slug: str


def interval() -> float:
    """The re-check interval, and at most a quarter of the group expiry."""
    return min(settings.TRAINYARD["WS_RECHECK_SECONDS"], settings.CHANNEL_GROUP_EXPIRY_SECONDS / 4)


async def watch(
    consumer: AsyncJsonWebsocketConsumer,
    credentials: Credentials,
    *,
    leave: Callable[[], Awaitable[None]],
    on_tick: Callable[[], Awaitable[None]],
) -> None:
    """Runs until the socket is closed (the consumer cancels it on disconnect)."""
    every = interval()
    while True:
        await asyncio.sleep(every)
        try:
            lost = await database_sync_to_async(access_lost)(
                user=credentials.user,
                token=credentials.token,
                session_key=credentials.session_key,
                workspace_slug=credentials.workspace_slug,
            )
            if lost is not None:
                # Leave the groups first: nothing more is sent once the close is on its way.
                await leave()
                code = CLOSE_FORBIDDEN if lost is AccessLost.NOT_A_MEMBER else CLOSE_UNAUTHORIZED
                await consumer.close(code=code, reason=lost.value)
                return
            await on_tick()
        except Exception:  # the database or Redis being down must not end the follow
            logger.warning("could not re-check a websocket's access; trying again", exc_info=True)
