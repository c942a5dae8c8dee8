"""A fault-injecting TCP proxy for tests: put it between a client (a runner)
and a server and switch faults on and off while bytes flow.

``FaultProxy(upstream_port).start()`` listens on a free port of 127.0.0.1
(``url``) and forwards every connection to ``127.0.0.1:upstream_port``, on
its own asyncio loop in a daemon thread. The test thread switches modes:

- ``passthrough()``: forward everything (the start mode);
- ``blackhole()``: forward nothing either way and read nothing (so TCP
  backpressure builds, as on a dead link); new connections are accepted but
  not connected upstream. Everything held flows again after ``passthrough()``;
- ``drop()``: read and discard every byte; connections stay open;
- ``slow(bytes_per_second)``: forward each direction at most that fast;
- ``reset()``: reset (RST) every open connection now; ``reset_every(s)``
  does so every ``s`` seconds until the mode changes.

No mocks: real sockets, real bytes; ``connections`` and ``resets`` count
what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any

CHUNK = 65536


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self._upstream = (upstream_host, upstream_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._flowing: asyncio.Event | None = None
        self._mode = "pass"
        self._rate = 0  # bytes per second per direction in "slow" mode
        self._resetter: asyncio.Task[None] | None = None
        self.port = 0
        self.connections = 0
        self.resets = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def close(self) -> None:
        async def stop() -> None:
            self._stop_resetter()
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                link.abort()

        self._call(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # ------------------------------------------------------------ modes

    def passthrough(self) -> None:
        self._set("pass")

    def blackhole(self) -> None:
        self._set("blackhole")

    def drop(self) -> None:
        self._set("drop")

    def slow(self, bytes_per_second: int) -> None:
        self._rate = max(1, bytes_per_second)
        self._set("slow")

    def reset(self) -> None:
        self._call(self._reset_all())

    def reset_every(self, seconds: float) -> None:
        self._set("pass")

        async def every() -> None:
            while True:
                await asyncio.sleep(seconds)
                await self._reset_all()

        async def begin() -> None:
            self._resetter = asyncio.ensure_future(every())

        self._call(begin())

    # ------------------------------------------------------------ internals

    def _set(self, mode: str) -> None:
        async def apply() -> None:
            self._stop_resetter()
            self._mode = mode
            assert self._flowing is not None
            if mode == "blackhole":
                self._flowing.clear()
            else:
                self._flowing.set()

        self._call(apply())

    def _stop_resetter(self) -> None:
        if self._resetter is not None:
            self._resetter.cancel()
            self._resetter = None

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            await self._wait_flowing()
            try:
                up_reader, up_writer = await asyncio.open_connection(*self._upstream)
            except OSError:
                return
            link.upstream = up_writer
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            self._links.discard(link)
            link.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: read, hold while blackholed, drop or pace, write."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await self._wait_flowing()
                size = max(1, self._rate // 10) if self._mode == "slow" else CHUNK
                data = await reader.read(size)
                if not data:
                    break
                await self._wait_flowing()  # read just before a blackhole: held, not lost
                if self._mode == "drop":
                    continue
                if self._mode == "slow":
                    await asyncio.sleep(len(data) / self._rate)
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()

    async def _wait_flowing(self) -> None:
        assert self._flowing is not None
        await self._flowing.wait()

    async def _reset_all(self) -> None:
        for link in list(self._links):
            link.abort()
            self.resets += 1


class _Link:
    """Both sockets of one proxied connection."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None

    def abort(self) -> None:
        """Close both sides with a reset (SO_LINGER 0), not a FIN."""
        for writer in (self.client, self.upstream):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            with contextlib.suppress(OSError):
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.close()
