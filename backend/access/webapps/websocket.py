"""A browser's websocket passed through to the app over a byte stream: the
ASGI websocket events on one side, frames written and read with wsproto on
the other (the proxy is the app's websocket client).

Each message is bounded (``MAX_MESSAGE_BYTES``, as the browser's side of the
server); pings are answered here; a close from either side closes the other
with its code. A websocket holds its own stream for its whole life: it is
never pooled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

from backend.access.webapps.stream import ByteStream, wait_first

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
HANDSHAKE_TIMEOUT_SECONDS = 60.0
# What wsproto writes itself in the handshake.
HANDSHAKE_HEADERS = frozenset(
    {b"host", b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions", b"sec-websocket-protocol"}
)
CLOSE_APP_GONE = 1011  # the app's end went away without a close frame
CLOSE_TOO_BIG = 1009


class Refused(Exception):
    """The app did not accept the websocket (``status``: its HTTP answer, 0 for none)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


async def bridge(stream: ByteStream, *, scope: Message, receive: Receive, send: Send, headers: Headers) -> None:
    """Opens the app's websocket with the browser's path, subprotocols and
    ``headers`` (filtered by the caller), accepts the browser's with the
    app's subprotocol, then relays messages both ways until one side closes.
    Raises ``Refused`` before accepting the browser's socket."""
    ws = WSConnection(ConnectionType.CLIENT)
    host = next((v for k, v in scope["headers"] if k.lower() == b"host"), b"").decode("latin-1")
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    request = Request(
        host=host,
        target=target.decode("latin-1"),
        subprotocols=list(scope.get("subprotocols", [])),
        extra_headers=[(k, v) for k, v in headers if k not in HANDSHAKE_HEADERS],
    )
    await stream.write(ws.send(request))
    accepted = await _handshake(ws, stream)
    await send({"type": "websocket.accept", "subprotocol": accepted.subprotocol})
    await wait_first(_browser_to_app(ws, stream, receive), _app_to_browser(ws, stream, send))


async def _handshake(ws: WSConnection, stream: ByteStream) -> AcceptConnection:
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_SECONDS):
            while True:
                data = await stream.read()
                ws.receive_data(data or None)
                for event in ws.events():
                    if isinstance(event, AcceptConnection):
                        return event
                    if isinstance(event, RejectConnection):
                        raise Refused(event.status_code, f"the app answered {event.status_code}")
                if not data:
                    raise Refused(0, "the app closed the connection without answering")
    except TimeoutError as error:
        raise Refused(0, f"the app did not answer within {HANDSHAKE_TIMEOUT_SECONDS:.0f} s") from error


async def _browser_to_app(ws: WSConnection, stream: ByteStream, receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            await stream.write(ws.send(CloseConnection(code=message.get("code", 1000))))
            return
        if message.get("text") is not None:
            await stream.write(ws.send(TextMessage(data=message["text"])))
        elif message.get("bytes") is not None:
            await stream.write(ws.send(BytesMessage(data=message["bytes"])))


async def _app_to_browser(ws: WSConnection, stream: ByteStream, send: Send) -> None:
    """1. Feeds what the stream brings to wsproto; 2. joins fragments of a
    message (bounded) and sends it whole; 3. answers pings; 4. passes a close on."""
    parts: list[str | bytes] = []
    size = 0
    while True:
        data = await stream.read()
        ws.receive_data(data or None)
        for event in ws.events():
            if isinstance(event, (TextMessage, BytesMessage)):
                parts.append(bytes(event.data) if isinstance(event, BytesMessage) else event.data)
                size += len(event.data)
                if size > MAX_MESSAGE_BYTES:
                    await send({"type": "websocket.close", "code": CLOSE_TOO_BIG, "reason": "message too big"})
                    return
                if event.message_finished:
                    await send(_whole(parts))
                    parts, size = [], 0
            elif isinstance(event, Ping):
                await stream.write(ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                await _close_both(ws, stream, send, event)
                return
        if not data:
            await send({"type": "websocket.close", "code": CLOSE_APP_GONE, "reason": "the app's connection ended"})
            return


def _whole(parts: list[str | bytes]) -> Message:
    if isinstance(parts[0], str):
        return {"type": "websocket.send", "text": "".join(str(p) for p in parts)}
    return {"type": "websocket.send", "bytes": b"".join(p for p in parts if isinstance(p, bytes))}


async def _close_both(ws: WSConnection, stream: ByteStream, send: Send, event: CloseConnection) -> None:
    with contextlib.suppress(Exception):  # the app's end may be gone already; the browser is told either way
        await stream.write(ws.send(event.response()))
    code = event.code if 1000 <= event.code < 5000 and event.code not in {1005, 1006, 1015} else 1000
    await send({"type": "websocket.close", "code": code, "reason": event.reason or ""})
