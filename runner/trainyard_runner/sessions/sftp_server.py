"""The ``sftp`` subsystem of a session and legacy ``scp -t``/``-f`` (``scp
-O``): asyncssh's SFTP and SCP servers on stdin and stdout, run by ``ssh.py``
as a process of the job's user (``python -I sftp_server.py [--scp
COMMAND]``), so every file it touches is checked by the kernel as that
user's (decision 0101-sftp-as-the-job-user). Paths are the machine's, as
with OpenSSH's sftp-server; relative ones start in the job's working tree.
(OpenSSH's own ``scp -t`` cannot serve a job's user: it has no passwd entry.)

The runner sets ``TRAINYARD_SFTP_CLIENT_VERSION`` to the client's SSH
version string: asyncssh adapts to OpenSSH's reversed ``symlink`` arguments
by it."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import asyncssh
from asyncssh.scp import run_scp_server
from asyncssh.sftp import SFTPServerHandler

CLIENT_VERSION_VAR = "TRAINYARD_SFTP_CLIENT_VERSION"
HIGH_WATER = 1024 * 1024  # replies waiting for the runner to read them before requests wait too


def main() -> int:
    return asyncio.run(_serve(sys.argv[2] if sys.argv[1:2] == ["--scp"] else None))


async def _serve(scp: str | None) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=HIGH_WATER)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout.buffer)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    transport.set_write_buffer_limits(high=HIGH_WATER)
    stdio = _Stdio(reader, writer)
    server = asyncssh.SFTPServer(_NoChannel())  # type: ignore[arg-type]
    if scp is not None:
        handler = run_scp_server(server, scp, stdio, stdio, _Stderr(stdio))  # type: ignore[arg-type]
        if handler is not None:
            await handler
    else:
        await SFTPServerHandler(server, stdio, stdio, 3).run()  # type: ignore[arg-type]
    await stdio.wait_closed()
    return stdio.code


class _NoChannel:
    """What ``SFTPServer`` is given instead of its channel: the server here
    never asks it anything (no chroot, no per-user mapping)."""

    logger = asyncssh.logging.logger


class _Stdio:
    """The parts of asyncssh's channel reader and writer that the SFTP
    handler uses, on this process's stdin and stdout. A request is read
    only once the replies before it are out of the high-water mark."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.logger = asyncssh.logging.logger
        self.channel = self
        self.code = 0  # what ``exit`` was given (the SCP server's status)

    async def read(self, n: int) -> bytes:
        return await self._reader.read(n)

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def drain(self) -> None:
        await self._writer.drain()

    def exit(self, code: int) -> None:
        self.code = code
        self._writer.close()

    def abort(self) -> None:
        self.code = self.code or 1
        self._writer.close()

    async def readexactly(self, n: int) -> bytes:
        await self._writer.drain()
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise EOFError from None

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    def write_eof(self) -> None:
        self._writer.close()

    def close(self) -> None:
        self._writer.close()

    def is_closing(self) -> bool:
        return self._writer.is_closing()

    async def wait_closed(self) -> None:
        """Until everything written is out (the pipe's transport flushes after ``close``)."""
        while self._writer.transport.get_write_buffer_size():
            await asyncio.sleep(0.01)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "client_version":
            return os.environ.get(CLIENT_VERSION_VAR, "")
        return default


class _Stderr:
    """The SCP server's error output: this process's stderr."""

    def __init__(self, stdio: _Stdio) -> None:
        self.channel = stdio

    def write(self, data: bytes) -> None:
        sys.stderr.buffer.write(data)
        sys.stderr.buffer.flush()


if __name__ == "__main__":
    sys.exit(main())
