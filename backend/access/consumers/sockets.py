"""A websocket served as a plain ASGI app, for the relay's ends (``pipe.Local``)."""

from __future__ import annotations

import json
from typing import Any

from trainyard_runner.protocol import RELAY_KEY_HEADER

ASGIReceive = Any
ASGISend = Any


class AsgiSocket:
    """The socket of one ASGI websocket connection."""

    def __init__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        self.scope = scope
        self._receive = receive
        self._send = send
        self.closed = False

    async def connected(self) -> bool:
        """Waits for the client's ``websocket.connect`` (False: it left first)."""
        message = await self._receive()
        return bool(message["type"] == "websocket.connect")

    async def accept(self) -> None:
        await self._send({"type": "websocket.accept"})

    async def read(self) -> bytes | str | None:
        if self.closed:
            return None
        message = await self._receive()
        if message["type"] == "websocket.disconnect":
            self.closed = True
            return None
        if message.get("bytes") is not None:
            return bytes(message["bytes"])
        return str(message.get("text") or "")

    async def write(self, item: bytes | str) -> None:
        if self.closed:
            return
        key = "bytes" if isinstance(item, bytes) else "text"
        try:
            await self._send({"type": "websocket.send", key: item})
        except OSError:  # the client is gone (uvicorn's ClientDisconnected)
            self.closed = True

    async def end(self, reason: str, code: int) -> None:
        """``{"type": "end", "reason"}``, then the close."""
        if self.closed:
            return
        await self.write(json.dumps({"type": "end", "reason": reason}))
        await self.close(code, reason)

    async def close(self, code: int, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        await self._send(
            {"type": "websocket.close", "code": code, "reason": reason.encode()[:120].decode(errors="ignore")}
        )

    def header(self, name: bytes) -> str:
        for key, value in self.scope.get("headers", []):
            if key == name:
                return str(value.decode("latin-1"))
        return ""

    def relay_key(self) -> str:
        return self.header(RELAY_KEY_HEADER.lower().encode())
