"""Work of one connection done in order by a task of its own.

A runner's connection hands some of its work to such a task so that the
frames behind it on the socket do not wait for it: its progress states
(``consumers/runner.py``) and the publishing of its stored log batches
(``logingest.LogIngest``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class InOrder(Generic[T]):
    """Items handled one at a time, in the order they were put, by a task
    started at the first ``put``: whoever puts an item goes on at once. An
    item whose handling raises is logged (``failed(item)`` says what failed)
    and the next one is handled. ``close`` lets the items put so far be
    handled, then ends the task."""

    def __init__(self, handle: Callable[[T], Awaitable[None]], failed: Callable[[T], str]) -> None:
        self._handle = handle
        self._failed = failed
        self._queue: asyncio.Queue[T | None] | None = None
        self._task: asyncio.Task[None] | None = None

    def put(self, item: T) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.create_task(self._run(self._queue))
        self._queue.put_nowait(item)

    def waiting(self) -> int:
        """Items put and not taken yet (the one being handled is not counted)."""
        return self._queue.qsize() if self._queue is not None else 0

    async def join(self) -> None:
        """Until every item put so far is handled."""
        if self._queue is not None:
            await self._queue.join()

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put_nowait(None)

    async def _run(self, queue: asyncio.Queue[T | None]) -> None:
        while (item := await queue.get()) is not None:
            try:
                await self._handle(item)
            except Exception:
                logger.exception("%s", self._failed(item))
            finally:
                queue.task_done()
        queue.task_done()
