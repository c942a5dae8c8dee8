"""The byte stream the proxy speaks HTTP over, and a pool of idle ones.

A stream is what ``backend.access.relay.open_job_stream`` yields (a tunnel to
127.0.0.1:<port> inside the job) or, in tests, a TCP connection: ``write``
(backpressured) and ``read`` (``b""`` at EOF). Opening a relay stream costs a
round trip to the runner, so the proxy keeps a finished HTTP/1.1 connection
open for the next request of the same app and user (``StreamPool``); a
connection idle for ``idle_seconds`` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Hashable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import Protocol


class ByteStream(Protocol):
    async def write(self, data: bytes) -> None: ...

    async def read(self) -> bytes: ...


StreamOpener = Callable[[], AbstractAsyncContextManager[ByteStream]]


@dataclass(eq=False)
class Upstream:
    """One open stream and what closes it. ``reused``: it carried a request
    before, so an EOF before any answer may just mean it idled out."""

    stream: ByteStream
    exits: AsyncExitStack
    reused: bool = False
    idle_since: float = field(default_factory=time.monotonic)

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # a stream already gone has nothing left to close
            await self.exits.aclose()


async def upstream_open(opener: StreamOpener) -> Upstream:
    exits = AsyncExitStack()
    try:
        stream = await exits.enter_async_context(opener())
    except BaseException:
        await exits.aclose()
        raise
    return Upstream(stream=stream, exits=exits)


class StreamPool:
    """Idle upstreams by key (an app and a user), at most ``per_key`` each,
    closed after ``idle_seconds``. Lives in one event loop (one web process)."""

    def __init__(self, *, idle_seconds: float = 30.0, per_key: int = 8) -> None:
        self.idle_seconds = idle_seconds
        self.per_key = per_key
        self._idle: dict[Hashable, list[Upstream]] = {}
        self._reaper: asyncio.Task[None] | None = None

    async def take(self, key: Hashable, opener: StreamOpener) -> Upstream:
        """An idle upstream of ``key`` (``reused`` set), else a new one."""
        now = time.monotonic()
        idle = self._idle.get(key, [])
        while idle:
            upstream = idle.pop()
            if now - upstream.idle_since < self.idle_seconds:
                upstream.reused = True
                return upstream
            await upstream.close()
        return await upstream_open(opener)

    async def give_back(self, key: Hashable, upstream: Upstream) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.per_key:
            await upstream.close()
            return
        upstream.idle_since = time.monotonic()
        idle.append(upstream)
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap())

    async def close_all(self) -> None:
        for key in list(self._idle):
            for upstream in self._idle.pop(key):
                await upstream.close()

    def idle_count(self, key: Hashable) -> int:
        return len(self._idle.get(key, []))

    async def _reap(self) -> None:
        while self._idle:
            await asyncio.sleep(self.idle_seconds / 2)
            await self._close_expired(time.monotonic())

    async def _close_expired(self, now: float) -> None:
        for key in list(self._idle):
            idle = self._idle[key]
            expired = [u for u in idle if now - u.idle_since >= self.idle_seconds]
            self._idle[key] = [u for u in idle if u not in expired]
            if not self._idle[key]:
                del self._idle[key]
            for upstream in expired:
                await upstream.close()


async def wait_first(*awaitables: Awaitable[object]) -> None:
    """Runs the awaitables until the first ends; cancels the rest; re-raises its error."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()
