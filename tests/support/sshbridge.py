"""Stands in for the relay in the runner's SSH tests: a unix socket whose
accepted connections are handed to ``serve_ssh`` (or ``serve_terminal``) in
the test's event loop, and a ProxyCommand for the stock ``ssh`` that joins
its stdin and stdout to that socket (what ``trainyard ssh-proxy`` does over
the relay's websocket)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncssh
from trainyard_runner.sessions.hostkey import public_line

PROXY = Path(__file__).with_name("sshproxy.py")
HOST = "trainyard-test"


@contextlib.asynccontextmanager
async def bridge(
    path: Path, handler: Callable[[socket.socket], Awaitable[None]]
) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Serve ``path`` until the block ends; yields the handlers' tasks
    (cancelled at the end, as the relay's end of a session would be)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []

    async def accept() -> None:
        while True:
            conn, _ = await loop.sock_accept(listener)
            tasks.append(loop.create_task(handler(conn)))

    acceptor = loop.create_task(accept())
    try:
        yield tasks
    finally:
        acceptor.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(acceptor, *tasks, return_exceptions=True)
        listener.close()


def client_files(tmp: Path, host_key: asyncssh.SSHKey) -> tuple[Path, Path]:
    """A client key made with ``ssh-keygen`` and a known_hosts file that
    names the runner's host key for ``HOST`` (as ``trainyard ssh-proxy``
    writes it from the grant): host-key checking is real."""
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    known = tmp / "known_hosts"
    known.write_text(f"{HOST} {public_line(host_key)}\n")
    return key, known


def ssh_options(sock: Path, key: Path, known: Path) -> list[str]:
    """Options for the stock ``ssh``, ``scp``, ``sftp`` (and rsync's ``-e``):
    no config file, no agent, this key only, strict host-key checking."""
    proxy = f"{shlex.quote(sys.executable)} {shlex.quote(str(PROXY))} {shlex.quote(str(sock))}"
    return [
        "-F", "/dev/null",
        "-o", f"ProxyCommand={proxy}",
        "-o", f"UserKnownHostsFile={known}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "BatchMode=yes",
        "-o", "IdentitiesOnly=yes",
        "-o", "IdentityAgent=none",
        "-o", "ControlMaster=no",
        "-i", str(key),
    ]  # fmt: skip


async def run(*argv: str, stdin: bytes = b"", timeout: float = 60) -> tuple[int, str, str]:
    """Run a client program; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK",)},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
