"""The relay's client end inside the server, for the apps proxy: a granted
session's bytes as a stream, without a websocket of its own.

    async with open_job_stream(session_id) as stream:   # waits for the runner's end
        await stream.write(b"GET / HTTP/1.1\\r\\n…")      # held back while the job reads slowly
        data = await stream.read()                       # b"" once the session ended

The caller granted the session (``services.sessions.grant_session``) and is
its client: the session's token is not asked for again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from uuid import UUID

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from trainyard_runner.protocol import MAX_RELAY_FRAME

from backend.access.pipe import Pipe
from backend.access.services.ends import client_attach, end_detach

READY_SECONDS = 30.0  # the runner's end dials in within this long, or the stream is refused
QUEUED_CHUNKS = 16  # each way: the stream's own buffer, beyond the relay's window


class StreamClosed(ConnectionError):
    """The session could not start, or ended; ``args[0]`` says why."""


class JobStream:
    """The ``pipe.Local`` of an in-process client, and the caller's stream."""

    def __init__(self) -> None:
        self._to_job: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUED_CHUNKS)
        self._from_job: asyncio.Queue[bytes] = asyncio.Queue(QUEUED_CHUNKS)
        self.ready = asyncio.Event()
        self.end_reason = ""

    async def write(self, data: bytes) -> None:
        if self.end_reason:
            raise StreamClosed(self.end_reason)
        for start in range(0, len(data), MAX_RELAY_FRAME):
            await self._to_job.put(data[start : start + MAX_RELAY_FRAME])

    async def read(self) -> bytes:
        """The next bytes from the job; b"" once the session ended."""
        if self.end_reason and self._from_job.empty():
            return b""
        return await self._from_job.get()

    async def close(self) -> None:
        await self._to_job.put(None)

    # pipe.Local
    async def read_local(self) -> bytes | None:
        return await self._to_job.get()

    async def write_local(self, item: bytes | str) -> None:
        if isinstance(item, str):
            self.ready.set()  # the relay's only text to a client before its end: {"type": "ready"}
            return
        await self._from_job.put(item)

    async def end(self, reason: str, code: int) -> None:
        self.end_reason = reason or "the session ended"
        self.ready.set()
        with contextlib.suppress(asyncio.QueueFull):
            self._from_job.put_nowait(b"")


class _Local:
    """``JobStream`` seen from the pipe."""

    def __init__(self, stream: JobStream) -> None:
        self.stream = stream

    async def read(self) -> bytes | str | None:
        return await self.stream.read_local()

    async def write(self, item: bytes | str) -> None:
        await self.stream.write_local(item)

    async def end(self, reason: str, code: int) -> None:
        await self.stream.end(reason, code)


@contextlib.asynccontextmanager
async def open_job_stream(session_id: UUID | str) -> AsyncIterator[JobStream]:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    attached = await database_sync_to_async(client_attach, thread_sensitive=False)(
        session_id=session_id, token="", user=None, channel=channel, server_side=True
    )
    if attached.refusal_code:
        raise StreamClosed(attached.refusal)
    stream = JobStream()
    pipe = Pipe(
        session_id=attached.session_id,
        side="client",
        local=_Local(stream),
        layer=layer,
        channel=channel,
        peer=attached.peer,
        on_text=_no_text,
        peer_timeout=READY_SECONDS,
    )
    task = asyncio.ensure_future(_relay(pipe, stream))
    try:
        await asyncio.wait_for(stream.ready.wait(), READY_SECONDS + 5)
        if stream.end_reason:
            raise StreamClosed(stream.end_reason)
        yield stream
    finally:
        await stream.close()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), 5)
        task.cancel()
        await database_sync_to_async(end_detach, thread_sensitive=False)(
            session_id=attached.session_id, side="client", channel=channel
        )


async def _relay(pipe: Pipe, stream: JobStream) -> None:
    await pipe.announce()
    outcome = await pipe.run()
    if not stream.end_reason:
        await stream.end(pipe.broken_reason or f"the relay ended ({outcome})", 1000)


async def _no_text(_text: str) -> str | None:
    return None
