"""Counts this web process's open websockets and publishes the counts to
Redis (``backend.core.counters``), so ``/metrics`` on any process sums all.

``CountConnections`` wraps the websocket router: a socket counts from the
accept until its consumer ends. ``publish_forever`` runs for the process's
lifetime (the ASGI lifespan) and writes the counts on every change and at
least every ``CONNECTIONS_REFRESH_SECONDS``; the key expires if the process
dies, so its sockets drop out of the sum."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from asgiref.sync import sync_to_async

from backend.core import counters

logger = logging.getLogger(__name__)

RUNNER_PATH = "/ws/runner/"

_changed: asyncio.Event | None = None


class CountConnections:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = "runner" if scope.get("path", "").startswith(RUNNER_PATH) else "follower"
        accepted = False

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal accepted
            if message["type"] == "websocket.accept" and not accepted:
                accepted = True
                _changed_by(kind, +1)
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if accepted:
                _changed_by(kind, -1)


async def publish_forever() -> None:
    global _changed
    _changed = asyncio.Event()
    while True:
        _changed.clear()
        try:
            await sync_to_async(counters.connections_publish, thread_sensitive=False)()
        except Exception:  # never end the loop: the next change or tick tries again
            logger.warning("could not publish this process's websocket count", exc_info=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_changed.wait(), timeout=counters.CONNECTIONS_REFRESH_SECONDS)
        await asyncio.sleep(0.2)  # a burst of connects is one write


def _changed_by(kind: str, delta: int) -> None:
    if delta > 0:
        counters.connection_opened(kind)
    else:
        counters.connection_closed(kind)
    if _changed is not None:
        _changed.set()
