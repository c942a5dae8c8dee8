"""Processes of a session: started as the job's user, in the job's working
tree and environment (``SessionContext``), on a terminal or on pipes, each
the leader of its own process group; and the glue that copies bytes
between them and the session's channel with bounded buffers.

Every byte path is flow-controlled: a reader is paused while the transport
it writes to is above its high-water mark, so a client that stops reading
(or a process that stops reading its input) stops the other side instead of
growing a buffer."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import struct
import sys
import termios
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .context import SessionContext

LAUNCHER = Path(__file__).with_name("_launch.py")
# An interactive shell, not a login one: a login shell's /etc/profile resets
# PATH, and the job's Python environment with it (decision 0100-ssh-sessions).
SHELL = ["bash", "--rcfile", str(Path(__file__).with_name("bashrc")), "-i"]


@dataclass
class Child:
    """A started process and the runner's ends of its input and output:
    on a terminal, ``master`` and two duplicates of it (``stdin``, the only
    one of ``outputs``); on pipes, ``stdin`` and ``outputs`` (stdout, stderr)."""

    proc: asyncio.subprocess.Process
    master: int | None = None
    stdin: int | None = None
    outputs: list[int] = field(default_factory=list)

    def signal(self, sig: int) -> None:
        """``sig`` to the process's whole group, if it is still there."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def resize(self, cols: int, rows: int) -> None:
        """The terminal's size (the kernel sends SIGWINCH to its foreground group)."""
        if self.master is not None:
            set_size(self.master, cols, rows)

    def close(self) -> None:
        """Close the terminal's own end (its input and output ends belong to their transports)."""
        master, self.master = self.master, None
        if master is not None:
            os.close(master)


async def start(
    ctx: SessionContext, argv: list[str], *, term: str | None = None, size: tuple[int, int] = (80, 24)
) -> Child:
    """Start ``argv`` for a session: on a new terminal of ``size`` (cols,
    rows) with ``TERM=term`` when ``term`` is given, else on pipes."""
    env = dict(ctx.env)
    uid = "" if ctx.uid is None else str(ctx.uid)
    launcher = [sys.executable, "-I", "-S", str(LAUNCHER), uid, "1" if term else "0", str(ctx.cwd), *argv]
    if term:
        env["TERM"] = term
        master, slave = os.openpty()
        set_size(master, *size)
        if ctx.uid is not None:  # the job's user owns its terminal (as login does)
            os.fchown(slave, ctx.uid, ctx.gid if ctx.gid is not None else ctx.uid)
        try:
            proc = await asyncio.create_subprocess_exec(
                *launcher, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return Child(proc, master=master, stdin=os.dup(master), outputs=[os.dup(master)])
    ends = [os.pipe() for _ in range(3)]
    theirs, ours = [ends[0][0], ends[1][1], ends[2][1]], [ends[0][1], ends[1][0], ends[2][0]]
    try:
        proc = await asyncio.create_subprocess_exec(
            *launcher, stdin=theirs[0], stdout=theirs[1], stderr=theirs[2], env=env, start_new_session=True
        )
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return Child(proc, stdin=ours[0], outputs=ours[1:])


def set_size(fd: int, cols: int, rows: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Output(asyncio.Protocol):
    """Reads one output of a process and hands each chunk to ``deliver``;
    ``done`` is set at its end (EOF, or EIO: a terminal nobody holds)."""

    def __init__(self, deliver: Callable[[bytes], None]) -> None:
        self._deliver = deliver
        self.done = asyncio.Event()
        self.transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._deliver(data)

    def eof_received(self) -> bool:
        self.done.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.done.set()


class Input(asyncio.BaseProtocol):
    """The writing end of a process's input; ``pause``/``resume`` are
    called when its buffer passes the high-water mark and drains again."""

    def __init__(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self._pause = pause
        self._resume = resume

    def pause_writing(self) -> None:
        self._pause()

    def resume_writing(self) -> None:
        # Not from within the transport's callback: what ``resume`` writes at
        # once, followed by an end of input, would be cut off by the pipe
        # transport, which closes right after this returns if it was told to.
        asyncio.get_running_loop().call_soon(self._resume)


async def read_outputs(child: Child, deliver: Callable[[int, bytes], None]) -> list[Output]:
    """Start reading the child's outputs: ``deliver(index, data)`` with 0
    for stdout (or the terminal), 1 for stderr."""
    loop = asyncio.get_running_loop()
    outputs = []
    for i, fd in enumerate(child.outputs):
        protocol = Output(lambda data, i=i: deliver(i, data))  # type: ignore[misc]
        await loop.connect_read_pipe(lambda p=protocol: p, os.fdopen(fd, "rb", buffering=0))  # type: ignore[misc]
        outputs.append(protocol)
    return outputs


async def write_input(child: Child, pause: Callable[[], None], resume: Callable[[], None]) -> asyncio.WriteTransport:
    """The transport that writes the child's input, flow-controlled by ``pause``/``resume``."""
    assert child.stdin is not None
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_write_pipe(
        lambda: Input(pause, resume), os.fdopen(child.stdin, "wb", buffering=0)
    )
    return transport


def signal_number(name: str) -> int | None:
    """``"INT"`` → SIGINT; None for a name that is not a signal."""
    return getattr(signal, f"SIG{name}", None) if name.isalnum() else None
