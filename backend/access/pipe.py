"""One end of a session's relay: the bytes of a local socket (the client's
websocket, the runner's, or the apps proxy's in-process stream) to the peer
end, wherever it runs, and back.

Between the ends, events go through ``transport`` (a Redis list per
receiving end, popped in batches): the peer's announcement, data, acks and
text, in the order sent. The channel layer carries only what the server
says to an end (``relay.end``, a terminal's client gone) and an end's own
``relay.stop``.

Five tasks, so that no wait blocks another:

1. ``_uplink`` reads the local socket and posts each binary frame for the
   peer as a signed data event (``signing``). Before each read it waits for
   credit: at most ``WINDOW_BYTES`` (and ``WINDOW_FRAMES``) sent and not yet
   acknowledged. While it waits nothing reads the socket, the ASGI server
   stops reading its TCP connection, and the sender is held back.
2. ``_sender`` pushes what was posted, in order: all of it at once, so one
   round trip carries every frame read while the last one was on its way.
3. ``_events`` pops this end's list: data events (checked: signed, from the
   peer, in sequence) go to the write queue, acks return credit, a new peer
   resets the window; anything not signed breaks the session.
4. ``_downlink`` receives this end's channel: an end event ends the session
   here once the peer's events sent before it are written.
5. ``_writer`` writes the queue to the local socket and acknowledges what it
   wrote, in batches (every ``ACK_BYTES`` or ``ACK_FRAMES``). The queue never
   holds more than the peer's window, and the window is never held by
   unacknowledged bytes alone (the batches are a fraction of it).

The client's end also counts the bytes each way and writes them to the
session every ``COUNT_SECONDS`` and at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from channels.db import database_sync_to_async
from trainyard_runner.protocol import MAX_RELAY_FRAME

from backend.access import transport
from backend.access.services.ends import session_traffic
from backend.access.signing import (
    DOWN,
    UP,
    WAKE,
    decoded,
    direction_key,
    encoded_control,
    encoded_data,
    signed,
    verified,
)

logger = logging.getLogger(__name__)

WINDOW_BYTES = 2 << 20
WINDOW_FRAMES = 256  # events on their way to one end at most (acks return every ACK_FRAMES)
ACK_BYTES = 256 << 10
ACK_FRAMES = 32
COUNT_SECONDS = 10.0
STOP_SECONDS = 2.0
# What reaches a finished end's channel afterwards (an end the server said
# late) is dropped from the layer's buffer this long after.
FORGET_SECONDS = 30.0

# How a pipe ended.
CLOSED = "closed"  # the local socket closed
ENDED = "ended"  # the session ended (an end event), told to the local socket
BROKEN = "broken"  # a bad event from the peer, or a frame over the bound
NO_PEER = "no peer"  # the peer end never came


class Local(Protocol):
    """The socket this end serves: frames in (bytes: stream bytes, str:
    control JSON; None once closed), frames out, and its end."""

    async def read(self) -> bytes | str | None: ...
    async def write(self, item: bytes | str) -> None: ...
    async def end(self, reason: str, code: int) -> None: ...


@dataclass(frozen=True)
class _End:
    reason: str
    code: int


class _Break:
    """Where the peer's events stop being trusted: what it sent before is
    written to the local socket, then the session breaks."""


class Pipe:
    """``side`` is "client" or "runner"; ``on_text`` handles a control frame
    from the local socket and returns what to forward to the peer (or None);
    ``peer_timeout`` bounds the wait for the peer end."""

    def __init__(
        self,
        *,
        session_id: str,
        side: str,
        local: Local,
        layer: Any,
        channel: str,
        peer: str,
        on_text: Callable[[str], Awaitable[str | None]],
        peer_timeout: float,
    ) -> None:
        self.session_id = session_id
        self.side = side
        self.local = local
        self.layer = layer
        self.channel = channel
        self.peer = ""
        self.on_text = on_text
        self.peer_timeout = peer_timeout
        self.broken_reason = ""
        self._out_key = direction_key(session_id, UP if side == "client" else DOWN)
        self._in_key = direction_key(session_id, DOWN if side == "client" else UP)
        self._out_seq = self._in_seq = 0
        self._inflight_bytes = self._inflight_frames = 0
        self._unacked_bytes = self._unacked_frames = 0
        self._credit = asyncio.Event()
        self._has_peer = asyncio.Event()
        self._queue: asyncio.Queue[bytes | str | _End | _Break] = asyncio.Queue()
        self._ending: _End | None = None  # said by the server; queued after what the peer sent before
        self._outbox: list[tuple[str, bytes]] = []  # (peer, event) posted and not yet pushed
        self._posted = asyncio.Event()
        self._pushing = asyncio.Lock()
        self._stopping = False
        self.bytes_up = self.bytes_down = 0  # counted by the client's end
        self._counted = (0, 0)
        if peer:
            self._peer_is(peer)

    async def run(self) -> str:
        """Relay until one side ends; returns how (``CLOSED``, ``ENDED``, ``BROKEN``, ``NO_PEER``)."""
        jobs = [self._uplink(), self._sender(), self._writer(), self._wait_for_peer()]
        if self.side == "client":
            jobs.append(self._count_forever())
        receivers = {asyncio.ensure_future(self._downlink()), asyncio.ensure_future(self._events())}
        tasks = {*receivers, *(asyncio.ensure_future(job) for job in jobs)}
        try:
            while True:
                done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    outcome = task.result()
                    if outcome is not None:
                        return str(outcome)
        finally:
            await self._stop(receivers, tasks - receivers)
            with contextlib.suppress(Exception):
                await transport.discard(self.channel)
            asyncio.get_running_loop().call_later(FORGET_SECONDS, _forget, self.layer, self.channel)
            if self.side == "client":
                await self._count()

    async def _stop(self, receivers: set[asyncio.Task[str | None]], others: set[asyncio.Task[Any]]) -> None:
        """The other tasks are cancelled; the receivers are asked to return
        (a ``relay.stop`` to this end's own channel, a ``WAKE`` to its own
        list) rather than cancelled in the middle of a receive: the channel
        layer's, shared by every consumer of the process, can be left stuck,
        and a blocking pop cancelled can take long to let go of its
        connection."""
        for task in others:
            task.cancel()
        self._stopping = True
        with contextlib.suppress(Exception):
            await self.layer.send(self.channel, signed({"type": "relay.stop", "from": self.channel}))
        with contextlib.suppress(Exception):
            await transport.push(self.channel, WAKE)
        pending = {task for task in receivers if not task.done()}
        if pending:
            await asyncio.wait(pending, timeout=STOP_SECONDS)
        for task in receivers:
            task.cancel()
        await asyncio.wait({*receivers, *others}, timeout=STOP_SECONDS)

    async def announce(self) -> None:
        """Tell the peer (already attached) that this end is here (before anything else this end sends)."""
        if self.peer:
            self._post_control({"type": "relay.peer", "channel": self.channel})

    # ------------------------------------------------------------ tasks

    async def _uplink(self) -> str:
        while True:
            await self._room()
            item = await self.local.read()
            if item is None:
                await self._flush()  # the socket's last bytes still go
                return CLOSED
            if isinstance(item, str):
                await self._flush()  # what it sent before (the runner's end follows its last bytes)
                forward = await self.on_text(item)
                if forward is not None:
                    self._post_control({"type": "relay.text", "text": forward})
                continue
            if len(item) > MAX_RELAY_FRAME:
                self.broken_reason = f"a frame over {MAX_RELAY_FRAME} bytes"
                return BROKEN
            if item:
                self._post_data(item)

    async def _sender(self) -> None:
        while True:
            await self._posted.wait()
            self._posted.clear()
            await self._flush()

    async def _events(self) -> str | None:
        while True:
            for item in await transport.pop(self.channel):
                event = decoded(self._in_key, item)
                if event is None or event.get("session", self.session_id) != self.session_id:
                    logger.warning("security: session %s: an event not signed for it; closing", self.session_id)
                    self._break("the relay received an event the server did not sign")
                    return None
                kind = event["type"]
                if kind == "relay.data":
                    if event["from"] != self.peer:
                        continue  # a former peer's (a terminal's client before it reconnected)
                    if event["seq"] != self._in_seq + 1:
                        logger.warning("security: session %s: an out-of-order data event; closing", self.session_id)
                        self._break("the relay received an out-of-order data event")
                        return None
                    self._in_seq += 1
                    self._queue.put_nowait(event["data"])
                elif kind == "relay.wake":
                    if self._stopping:
                        return None
                    if self._ending is not None:
                        self._queue.put_nowait(self._ending)
                elif kind == "relay.peer" and event.get("from") == event.get("channel"):
                    self._peer_is(str(event["channel"]))
                elif event.get("from") != self.peer:
                    continue
                elif kind == "relay.ack":
                    self._inflight_bytes = max(0, self._inflight_bytes - int(event["bytes"]))
                    self._inflight_frames = max(0, self._inflight_frames - int(event["frames"]))
                    self._credit.set()
                elif kind == "relay.text":
                    self._queue.put_nowait(str(event["text"]))

    def _break(self, reason: str) -> None:
        """Read no more of the peer; the writer breaks the session after what came before."""
        self.broken_reason = reason
        self._queue.put_nowait(_Break())

    async def _downlink(self) -> str | None:
        while True:
            event = await self.layer.receive(self.channel)
            kind = event.get("type")
            if not verified(event):
                logger.warning("security: session %s: an unsigned %r event; dropped", self.session_id, str(kind)[:40])
            elif kind == "relay.stop" and event.get("from") == self.channel:
                return None
            elif kind == "relay.end":
                await self._end_after_peer(_End(str(event.get("reason", ""))[:500], int(event.get("code", 1000))))
            elif kind == "relay.peer" and event.get("gone") == self.peer:
                self._peer_is(str(event["channel"]))  # a terminal's client left (no other came since)

    async def _writer(self) -> str:
        while True:
            item = await self._queue.get()
            if isinstance(item, _Break):
                return BROKEN
            if isinstance(item, _End):
                await self.local.end(item.reason, item.code)
                return ENDED
            await self.local.write(item)
            if isinstance(item, bytes):
                self.bytes_down += len(item) if self.side == "client" else 0
                self._unacked_bytes += len(item)
                self._unacked_frames += 1
                if self._unacked_bytes >= ACK_BYTES or self._unacked_frames >= ACK_FRAMES:
                    self._ack()

    async def _wait_for_peer(self) -> str | None:
        try:
            await asyncio.wait_for(self._has_peer.wait(), self.peer_timeout)
        except TimeoutError:
            return NO_PEER
        return None

    async def _count_forever(self) -> None:
        while True:
            await asyncio.sleep(COUNT_SECONDS)
            await self._count()

    # ------------------------------------------------------------ helpers

    async def _end_after_peer(self, end: _End) -> None:
        """The end goes to the socket after the events the peer sent before
        it (in this end's list, ahead of the ``WAKE`` put behind them)."""
        self._ending = end
        try:
            await transport.push(self.channel, WAKE)
        except Exception:
            logger.warning("session %s: could not queue its end behind its data", self.session_id, exc_info=True)
            self._queue.put_nowait(end)

    def _peer_is(self, channel: str) -> None:
        """A new peer: a fresh window and fresh sequence numbers both ways.
        "" (a terminal's client left): nothing is read until the next one."""
        self.peer = channel
        self._out_seq = self._in_seq = 0
        self._inflight_bytes = self._inflight_frames = 0
        self._credit.set()
        if not channel:
            return
        if self.side == "client" and not self._has_peer.is_set():
            self._queue.put_nowait(json.dumps({"type": "ready"}))
        self._has_peer.set()

    async def _room(self) -> None:
        while not self.peer or self._inflight_bytes >= WINDOW_BYTES or self._inflight_frames >= WINDOW_FRAMES:
            self._credit.clear()
            await self._credit.wait()

    def _post_data(self, data: bytes) -> None:
        self._out_seq += 1
        self._inflight_bytes += len(data)
        self._inflight_frames += 1
        self.bytes_up += len(data) if self.side == "client" else 0
        self._post(encoded_data(self._out_key, sender=self.channel, seq=self._out_seq, data=data))

    def _ack(self) -> None:
        done, self._unacked_bytes, self._unacked_frames = (self._unacked_bytes, self._unacked_frames), 0, 0
        if self.peer:
            self._post_control({"type": "relay.ack", "bytes": done[0], "frames": done[1]})

    def _post_control(self, event: dict[str, Any]) -> None:
        self._post(encoded_control({**event, "from": self.channel, "session": self.session_id}))

    async def _flush(self) -> None:
        """Pushes what was posted, in order (after a push under way)."""
        async with self._pushing:
            outbox, self._outbox = self._outbox, []
            while outbox:
                peer = outbox[0][0]
                same = next((i for i, (p, _) in enumerate(outbox) if p != peer), len(outbox))
                if peer:
                    await transport.push(peer, *(event for _, event in outbox[:same]))
                outbox = outbox[same:]

    def _post(self, event: bytes) -> None:
        """``event`` for the current peer, behind what was posted before (``_sender`` pushes it)."""
        self._outbox.append((self.peer, event))
        self._posted.set()

    async def _count(self) -> None:
        up, down = self.bytes_up - self._counted[0], self.bytes_down - self._counted[1]
        if not up and not down:
            return
        try:
            await database_sync_to_async(session_traffic, thread_sensitive=False)(
                session_id=self.session_id, up=up, down=down
            )
        except Exception:  # counted at the next flush
            logger.warning("session %s: could not count its bytes", self.session_id, exc_info=True)
            return
        self._counted = (self._counted[0] + up, self._counted[1] + down)


def _forget(layer: Any, channel: str) -> None:
    """Drop what the layer buffered for a channel nobody receives any more
    (channels_redis keeps a queue per channel name in ``receive_buffer``,
    and a late data frame would stay there for the life of the process)."""
    buffers = getattr(layer, "receive_buffer", None)
    if isinstance(buffers, dict):
        buffers.pop(channel, None)
