"""A terminal into a running job (the browser's Terminal tab): a shell on a
terminal of its own, as the job's user in the job's tree and environment,
with the raw bytes of the socket the relay hands over going both ways.
No SSH: the relay already authenticated the user and carries resizes as
control messages (``resizes``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket

from . import launch
from .context import SessionContext

TERM = "xterm-256color"  # what xterm.js emulates
PTY_DRAIN = 0.5  # after the shell exits, how long its last output may take


async def serve_terminal(sock: socket.socket, ctx: SessionContext, resizes: asyncio.Queue[tuple[int, int]]) -> None:
    """Serve one terminal on ``sock`` until the shell exits (then the socket
    is closed) or the socket closes, or the task is cancelled (then the
    shell's process group gets SIGHUP, as on a hang-up). ``resizes``: (cols,
    rows), applied in order."""
    loop = asyncio.get_running_loop()
    child = await launch.start(ctx, launch.SHELL, term=TERM)
    peer = _Peer()
    try:
        # The terminal's input first: the socket's first bytes have somewhere to go.
        peer.input = await launch.write_input(child, peer.pause_reading, peer.resume_reading)
        transport, _ = await loop.create_connection(lambda: peer, sock=sock)
        outputs = await launch.read_outputs(child, lambda _, data: transport.write(data))
        peer.output = outputs[0]
        resizer = loop.create_task(_apply(resizes, child))
        shell = loop.create_task(child.proc.wait())
        try:
            await asyncio.wait({shell, loop.create_task(peer.closed.wait())}, return_when=asyncio.FIRST_COMPLETED)
            if shell.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(outputs[0].done.wait(), PTY_DRAIN)
        finally:
            resizer.cancel()
            transport.close()
    finally:
        child.signal(signal.SIGHUP)
        child.close()


async def _apply(resizes: asyncio.Queue[tuple[int, int]], child: launch.Child) -> None:
    while True:
        cols, rows = await resizes.get()
        child.resize(cols, rows)


class _Peer(asyncio.Protocol):
    """The relay's end: its bytes go to the terminal; while it cannot take
    more, the terminal's output is not read."""

    def __init__(self) -> None:
        self.input: asyncio.WriteTransport | None = None
        self.output: launch.Output | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def pause_reading(self) -> None:
        """The terminal's input is full: stop reading the socket."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.input is not None and not self.input.is_closing():
            self.input.write(data)

    def eof_received(self) -> bool:
        self.closed.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def pause_writing(self) -> None:
        if self.output is not None and self.output.transport is not None:
            self.output.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.output is not None and self.output.transport is not None and not self.output.transport.is_closing():
            self.output.transport.resume_reading()
