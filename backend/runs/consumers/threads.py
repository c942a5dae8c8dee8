"""Where the consumers' database work runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from channels.db import database_sync_to_async

T = TypeVar("T")


def off_shared_thread(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """``fn`` (database work) run in a thread of the default pool, with a
    connection of its own from the web process's pool, not in the process's
    one shared thread, where Django runs every request's view and where
    whatever else uses ``database_sync_to_async`` queues. A follower's
    connect, backlog and catch-up, and a runner's acceptance, states and
    heartbeats (and the log frames behind them on its socket) wait for none
    of it: the warm start's first line waited ~100 ms behind a submission's
    request."""
    return database_sync_to_async(fn, thread_sensitive=False)
