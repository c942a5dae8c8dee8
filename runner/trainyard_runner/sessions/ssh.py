"""SSH into a running job, served on one already-connected socket (the
relay's end of a session: no TCP listener) with asyncssh.

- Authentication: public keys only, the grantee's registered keys
  (``authorized_keys``, OpenSSH lines); any user name (decision
  0098-ssh-authentication).
- Sessions: a shell (``bash -i`` on a terminal when asked for one), a
  command (``bash -c``, on a terminal or on pipes; its exit status or signal
  goes back), the ``sftp`` subsystem and legacy ``scp -O`` (``scp -t``/``-f``)
  by ``sftp_server.py``; ``rsync`` runs as the command it is (``rsync`` must
  be installed on the machine). Every one of them is a process of the job's
  user in the job's tree and environment (``launch.py``); the runner only
  copies bytes (decision 0101-sftp-as-the-job-user).
- Forwarding: ``ssh -L``/``-D`` reach ports on the machine's loopback only;
  ``ssh -R`` listens on 127.0.0.1, on ports from 1024 up.
- Bounds: sessions and listeners per connection are capped; every byte path
  is flow-controlled (``launch.py``), so a client that stops reading stops
  the process, not the runner's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import cast

import asyncssh
from asyncssh.forward import SSHForwarder

from . import launch
from .context import SessionContext

log = logging.getLogger(__name__)
# asyncssh logs every connection, channel and request at INFO: the runner's
# log keeps its warnings only (a session's start and end are the server's audit).
logging.getLogger("asyncssh").setLevel(logging.WARNING)

MAX_SESSIONS = 32  # shells, commands and sftp at once on one connection
MAX_LISTENERS = 16  # ssh -R ports opened on one connection
MAX_TUNNELS = 256  # ssh -L/-D/-W connections at once on one connection (each buffers up to its window)
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "ip6-localhost"})
LOGIN_TIMEOUT = 30.0  # from the socket's hand-over to a successful authentication
PTY_DRAIN = 0.5  # after a terminal's process exits, how long its last output may take
SFTP_SERVER = Path(__file__).with_name("sftp_server.py")
CLIENT_ENV = ("LANG", "LC_")  # what a client may set (OpenSSH's AcceptEnv LANG LC_* on Debian)


async def serve_ssh(
    sock: socket.socket, ctx: SessionContext, authorized_keys: list[str], host_key: asyncssh.SSHKey
) -> None:
    """Serve one SSH connection on ``sock`` until the client leaves (or the
    task is cancelled: the connection closes and its processes get SIGHUP).
    A client that fails to authenticate is logged and dropped."""
    keys = authorized(authorized_keys)
    try:
        conn = await asyncssh.run_server(
            sock,
            server_factory=lambda: _Server(ctx),
            server_host_keys=[host_key],
            authorized_client_keys=keys,
            password_auth=False,
            kbdint_auth=False,
            gss_host=None,
            agent_forwarding=False,
            x11_forwarding=False,
            allow_scp=False,
            encoding=None,  # bytes both ways
            login_timeout=LOGIN_TIMEOUT,
        )
    except (asyncssh.Error, OSError, TimeoutError) as e:
        log.info("ssh session: the client did not get in: %s", e)
        sock.close()
        return
    except asyncio.CancelledError:
        sock.close()
        raise
    try:
        await conn.wait_closed()
    finally:
        conn.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(conn.wait_closed()), 5)


def authorized(lines: list[str]) -> asyncssh.SSHAuthorizedKeys:
    """The keys of ``lines`` without options (a registered key is only a
    key); lines that are not keys are skipped with a log line."""
    keys = []
    for line in lines:
        try:
            keys.append(asyncssh.import_public_key(line.strip()).export_public_key().decode())
        except (asyncssh.KeyImportError, ValueError):
            log.warning("ssh session: skipping an authorized key that is not an OpenSSH public key")
    return asyncssh.import_authorized_keys("".join(keys))


class _Server(asyncssh.SSHServer):
    """One SSH connection: who may get in, and which channels it may open."""

    def __init__(self, ctx: SessionContext) -> None:
        self._ctx = ctx
        self._conn: asyncssh.SSHServerConnection | None = None
        self.sessions = 0
        self.tunnels = 0
        self._listeners = 0

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn

    def begin_auth(self, username: str) -> bool:
        return True  # every user name; the key decides

    def public_key_auth_supported(self) -> bool:
        return True

    def session_requested(self) -> asyncssh.SSHServerSession[bytes] | bool:
        if self.sessions >= MAX_SESSIONS:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_RESOURCE_SHORTAGE, f"at most {MAX_SESSIONS} sessions at once on one connection"
            )
        return _Session(self._ctx, self)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Awaitable[asyncssh.SSHTCPSession[bytes]]:
        if dest_host.lower() not in LOOPBACK:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                f"only ports of the job's machine can be reached (127.0.0.1:PORT), not {dest_host}",
            )
        if self.tunnels >= MAX_TUNNELS:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_RESOURCE_SHORTAGE, f"at most {MAX_TUNNELS} forwarded connections at once"
            )
        self.tunnels += 1
        return self._tunnel("::1" if dest_host == "::1" else "127.0.0.1", dest_port)

    async def _tunnel(self, host: str, port: int) -> asyncssh.SSHTCPSession[bytes]:
        try:
            _, peer = await asyncio.get_running_loop().create_connection(SSHForwarder, host, port)
        except OSError as e:
            self.tunnels -= 1
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, str(e)) from None
        return cast(asyncssh.SSHTCPSession[bytes], _Tunnel(peer, self))

    def server_requested(self, listen_host: str, listen_port: int) -> bool | Awaitable[asyncssh.SSHListener]:
        if listen_port < 1024 or self._listeners >= MAX_LISTENERS or self._conn is None:
            return False
        return self._listen(listen_host, listen_port)

    async def _listen(self, listen_host: str, listen_port: int) -> asyncssh.SSHListener:
        # Always on the loopback, whatever address the client named; the
        # connections go back to the client under the names it asked for.
        assert self._conn is not None
        listener = await self._conn.forward_local_port("127.0.0.1", listen_port, listen_host, listen_port)
        self._listeners += 1
        return listener


class _Tunnel(SSHForwarder):
    """The channel's side of a forwarded connection (asyncssh's forwarder,
    flow-controlled both ways), counted while it is open."""

    def __init__(self, peer: SSHForwarder, server: _Server) -> None:
        super().__init__(peer)
        self._server = server

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.tunnels -= 1
        super().connection_lost(exc)


class _Session(asyncssh.SSHServerSession[bytes]):
    """One channel's process: a shell, a command or the sftp server."""

    def __init__(self, ctx: SessionContext, server: _Server) -> None:
        self._ctx = ctx
        self._server = server
        self._chan: asyncssh.SSHServerChannel[bytes] | None = None
        self._term: tuple[str, tuple[int, int]] | None = None
        self._argv: list[str] = []
        self._child: launch.Child | None = None
        self._outputs: list[launch.Output] = []
        self._input: asyncio.WriteTransport | None = None
        self._task: asyncio.Task[None] | None = None
        self._sftp = False
        self._closed = False
        self._early: list[bytes] = []  # input that came while the process was starting
        self._eof = False

    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        self._chan = chan
        self._server.sessions += 1

    def pty_requested(self, term_type: str, term_size: tuple[int, int, int, int], term_modes: object) -> bool:
        self._term = (term_type or "xterm", (term_size[0] or 80, term_size[1] or 24))
        return True

    def shell_requested(self) -> bool:
        # Without a terminal (``ssh -T``), bash reads its commands from the
        # input, as a login shell under sshd does (no prompt, no job control).
        self._argv = launch.SHELL if self._term is not None else ["bash"]
        return True

    def exec_requested(self, command: str) -> bool:
        if command.startswith("scp ") and (" -t" in command or " -f" in command):  # legacy scp (scp -O)
            self._argv = [sys.executable, "-I", str(SFTP_SERVER), "--scp", command]
            self._sftp = True
        else:
            self._argv = ["bash", "-c", command]
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        if subsystem != "sftp":
            return False
        self._argv = [sys.executable, "-I", str(SFTP_SERVER)]
        self._sftp = True
        self._term = None  # a file transfer is never on a terminal
        return True

    def session_started(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        assert self._chan is not None
        chan = self._chan
        env = {**self._ctx.env, **{k: v for k, v in chan.get_environment().items() if k.startswith(CLIENT_ENV)}}
        if self._sftp:
            env[CLIENT_VERSION_VAR] = str(chan.get_connection().get_extra_info("client_version", ""))
        ctx = SessionContext(cwd=self._ctx.cwd, env=env, uid=self._ctx.uid, gid=self._ctx.gid)
        term, size = self._term if self._term is not None else (None, (80, 24))
        try:
            child = await launch.start(ctx, self._argv, term=term, size=size)
        except OSError as e:
            if not self._closed:
                chan.write_stderr(f"trainyard: could not start {self._argv[0]}: {e}\r\n".encode())
                chan.exit(127)
            return
        self._child = child
        if self._closed:  # the client left while it started
            child.signal(signal.SIGHUP)
            child.close()
            return
        try:
            await self._pump(chan, child)
        finally:
            child.close()

    async def _pump(self, chan: asyncssh.SSHServerChannel[bytes], child: launch.Child) -> None:
        datatypes = (None, asyncssh.EXTENDED_DATA_STDERR)
        self._outputs = await launch.read_outputs(child, lambda i, data: self._deliver(data, datatypes[i]))
        self._input = await launch.write_input(child, chan.pause_reading, chan.resume_reading)
        for data in self._early:
            self._input.write(data)
        self._early.clear()
        if self._eof and child.master is None:
            self._input.write_eof()
        if self._input.get_write_buffer_size() <= self._input.get_write_buffer_limits()[1]:
            chan.resume_reading()  # else once the process took it (``Input.resume_writing``)
        if child.master is None:  # pipes: the end is when every output ended and the process exited
            await asyncio.gather(*(o.done.wait() for o in self._outputs))
            code = await child.proc.wait()
        else:  # a terminal: the end is the process's; what it printed last is read briefly
            code = await child.proc.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._outputs[0].done.wait(), PTY_DRAIN)
        self._input.close()
        chan.write_eof()
        if code < 0:
            chan.exit_with_signal(signal.Signals(-code).name.removeprefix("SIG"))
        else:
            chan.exit(code)

    def _deliver(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self._chan is not None and not self._closed:
            with contextlib.suppress(BrokenPipeError):  # the client closed its side meanwhile
                self._chan.write(data, datatype)

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self._input is None:  # the process is starting: the rest waits in the channel's window
            assert self._chan is not None
            self._early.append(data)
            self._chan.pause_reading()
        elif not self._input.is_closing():
            self._input.write(data)

    def eof_received(self) -> bool:
        # The process's input ends; its output goes on (``echo x | ssh job cat``).
        # A terminal has no end of input but the ^D its user types.
        self._eof = True
        if self._input is not None and self._child is not None and self._child.master is None:
            self._input.write_eof()
        return True

    def pause_writing(self) -> None:
        for output in self._outputs:
            if output.transport is not None:
                output.transport.pause_reading()

    def resume_writing(self) -> None:
        for output in self._outputs:
            if output.transport is not None and not output.transport.is_closing():
                output.transport.resume_reading()

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if self._child is not None and width and height:
            self._child.resize(width, height)

    def signal_received(self, signal_name: str) -> None:
        sig = launch.signal_number(signal_name)
        if self._child is not None and sig is not None:
            self._child.signal(sig)

    def break_received(self, msec: int) -> bool:
        if self._child is not None:
            self._child.signal(signal.SIGINT)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        """The channel closed (the client left): the process's group gets
        SIGHUP, as a terminal's processes do when it hangs up."""
        self._closed = True
        self._server.sessions -= 1
        if self._child is None:
            return  # still starting: ``_run`` sees ``_closed``
        self._child.signal(signal.SIGHUP)
        for output in self._outputs:
            if output.transport is not None:
                output.transport.close()
        if self._input is not None:
            self._input.close()
        if self._task is not None:
            self._task.cancel()


CLIENT_VERSION_VAR = "TRAINYARD_SFTP_CLIENT_VERSION"  # sftp_server.py adapts to OpenSSH's symlink order
