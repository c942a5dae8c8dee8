"""How one end of a relay reaches the other, wherever it runs: a Redis list
per receiving end (keyed by that end's channel name, fresh for each
connection), which the receiver pops in batches with one blocking
``BLMPOP`` on a connection of its own.

A push is one round trip for any number of events (one ``RPUSH``, with
``PEXPIRE``, pipelined); a pop takes everything queued, up to ``BATCH``
events, in one. The channel layer costs about eight round trips per
message, and its receive serves one message at a time for the whole
process: bulk bytes through it crawl (docs/decisions/0097-relay-transport.md).

What is in a list is bounded by the sender's credit window (``pipe``); a
list nobody pops (its end died) expires after ``EXPIRY_MS``.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from django.conf import settings
from redis.asyncio import Redis

BATCH = 64  # events a pop takes at most
POP_SECONDS = 10  # a blocking pop returns empty after this long
EXPIRY_MS = 60_000
# Redis connections of one process: one per end blocked in its pop, and the
# pushes under way (redis-py's default, 100, would cap a process's sessions).
MAX_CONNECTIONS = 4096

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Redis] = weakref.WeakKeyDictionary()


def _redis() -> Redis:
    """This event loop's client (its pool grows by one connection per blocked pop)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=POP_SECONDS + 20,
            socket_connect_timeout=5,
            max_connections=MAX_CONNECTIONS,
        )
        _clients[loop] = client
    return client


def _key(channel: str) -> str:
    """Under the channel layer's prefix (one per deployment, and per test run)."""
    layer: dict[str, Any] = settings.CHANNEL_LAYERS["default"]
    return f"{layer['CONFIG']['prefix']}:relay:{channel}"


async def push(channel: str, *events: bytes) -> None:
    """``events``, in order, to the end listening on ``channel``."""
    key = _key(channel)
    async with _redis().pipeline(transaction=False) as pipeline:
        pipeline.rpush(key, *events)
        pipeline.pexpire(key, EXPIRY_MS)
        await pipeline.execute()


async def pop(channel: str) -> list[bytes]:
    """The events queued for ``channel``, oldest first; waits for one (at most ``POP_SECONDS``: then [])."""
    answer: Any = await _redis().blmpop(POP_SECONDS, 1, _key(channel), direction="LEFT", count=BATCH)
    return list(answer[1]) if answer else []  # [key, [event, …]]


async def discard(channel: str) -> None:
    """What nobody will read any more (its end left)."""
    await _redis().delete(_key(channel))
