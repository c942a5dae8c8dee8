"""Where the consumers' database work runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from channels.db import database_sync_to_async

T = TypeVar("T")


def off_shared_thread(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """``fn`` (database work) run in a thread of the default pool, with a
    connection of its own from the web process's pool, not in the process's
    one shared thread. Consumers run outside asgiref's
    ``ThreadSensitiveContext`` (Django gives each HTTP request one of its
    own, so a view has a thread of its own), so every consumer's
    thread-sensitive ``database_sync_to_async`` call in the process queues
    on that one thread. A follower's connect, backlog and catch-up, and a
    runner's acceptance, states and heartbeats (and the log frames behind
    them on its socket) wait for none of the others."""
    return database_sync_to_async(fn, thread_sensitive=False)
