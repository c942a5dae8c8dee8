"""Sessions into a job: the runner's end of the relay (docs/ACCESS.md).

For each ``OpenRelay`` the runner dials a websocket of its own to the server
(``/ws/runner/relay/<session>/``, with its token and the session's relay
key; never its main socket, so a session cannot delay the job's logs) and
pumps it to and from one end of a ``socket.socketpair()``; the other end
goes to the handler of the session's kind: ``port`` (a TCP connection to
127.0.0.1:<port>, here), ``ssh`` and ``terminal`` (``sessions/``).

A session's failure is its own: it is logged and its socket closed; the job
and the main connection never notice. Sessions end when their job ends
(``close_job``), when the server says so (``CloseRelay``, or by closing the
socket), or when their handler ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncssh
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from . import __version__
from . import protocol as p
from .sessions import hostkey
from .sessions.context import SessionContext
from .sessions.ssh import serve_ssh
from .sessions.terminal import serve_terminal

log = logging.getLogger(__name__)

OPEN_TIMEOUT = 10.0
MAX_SESSIONS = 256  # at once on this runner; the server caps them per job and user too
READ_SIZE = p.MAX_RELAY_FRAME  # what is there, up to a frame: fewer, larger events
Handler = Callable[[socket.socket, p.OpenRelay, "asyncio.Queue[tuple[int, int]]"], Awaitable[None]]


class Relays:
    """The sessions this runner serves. ``job_context(job_id)`` is the job's
    ``SessionContext``, or why no session can get into it now;
    ``job_ending(job_id)`` why its sessions end when the job is ending
    ("" while it runs)."""

    def __init__(
        self,
        *,
        main_url: str,
        token: Callable[[], str],
        work_dir: Path,
        job_context: Callable[[str], SessionContext | str],
        job_ending: Callable[[str], str],
    ) -> None:
        self._base = main_url.rstrip("/") + "/relay/"
        self._token = token
        self._work_dir = work_dir
        self._job_context = job_context
        self._job_ending = job_ending
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}  # session → (job, task)
        self._closing: dict[str, str] = {}  # session → the reason it is being closed

    def open(self, message: p.OpenRelay) -> None:
        if message.session in self._tasks:
            return
        if len(self._tasks) >= MAX_SESSIONS or "/" in message.session:
            log.warning("refusing session %s: %d sessions open", message.session, len(self._tasks))
            return
        task = asyncio.get_running_loop().create_task(self._serve(message))
        self._tasks[message.session] = (message.job, task)
        task.add_done_callback(lambda _: self._forget(message.session))

    def close(self, session: str, reason: str) -> None:
        """The server ended the session."""
        held = self._tasks.get(session)
        if held is not None:
            log.info("session %s closed by the server: %s", session, reason or "no reason given")
            held[1].cancel()

    def close_job(self, job_id: str, reason: str) -> None:
        """The job ended: so do its sessions, saying ``reason`` to their clients."""
        for session, (job, task) in list(self._tasks.items()):
            if job == job_id:
                self._closing[session] = reason
                task.cancel()

    def _forget(self, session: str) -> None:
        self._tasks.pop(session, None)
        self._closing.pop(session, None)

    async def _serve(self, message: p.OpenRelay) -> None:
        try:
            async with self._dial(message) as ws:
                ending = functools.partial(self._ending, message)
                await _Session(ws, message, self._handler(message), ending).run()
        except (OSError, TimeoutError, WebSocketException) as e:
            log.warning("session %s: the relay failed: %s", message.session, e)
        except Exception:
            log.exception("session %s failed", message.session)

    def _dial(self, message: p.OpenRelay) -> Any:
        headers = {"Authorization": f"Bearer {self._token()}", p.RELAY_KEY_HEADER: message.relay_key}
        return connect(
            f"{self._base}{message.session}/",
            additional_headers=headers,
            open_timeout=OPEN_TIMEOUT,
            close_timeout=5,
            max_size=p.MAX_RELAY_FRAME + 4096,
            compression=None,  # ssh is encrypted, a terminal says little: deflate would only cost CPU
            user_agent_header=f"trainyard-runner/{__version__}",
        )

    def _ending(self, message: p.OpenRelay) -> str:
        return self._closing.get(message.session) or self._job_ending(message.job)

    def _handler(self, message: p.OpenRelay) -> Handler | str:
        """The kind's handler, or why this runner cannot serve it."""
        if message.kind == "port":
            return serve_port
        context = self._job_context(message.job)
        if isinstance(context, str):
            return context
        return _kind_handler(message, context, self._work_dir)


class _Session:
    """One session's pump: websocket ⇄ socketpair ⇄ handler."""

    def __init__(
        self, ws: ClientConnection, message: p.OpenRelay, handler: Handler | str, ending: Callable[[], str]
    ) -> None:
        self.ws = ws
        self.message = message
        self.handler = handler
        self.ending = ending  # why the session ends when its job is ending, else ""
        self.resizes: asyncio.Queue[tuple[int, int]] = asyncio.Queue(maxsize=16)

    async def run(self) -> None:
        if isinstance(self.handler, str):
            await self._end(self.handler)
            return
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=ours, limit=READ_SIZE)
        tasks = [
            asyncio.ensure_future(self._to_socket(writer)),
            asyncio.ensure_future(self._to_relay(reader)),
            asyncio.ensure_future(self._handle(theirs)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            writer.close()
            theirs.close()
            if self.ending():  # closed because its job ended: the client is told why
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._end(self.ending(), job_ending=True), 2)

    async def _to_socket(self, writer: asyncio.StreamWriter) -> None:
        """The client's bytes to the handler; the server's control messages."""
        with contextlib.suppress(ConnectionClosed):
            async for frame in self.ws:
                if isinstance(frame, bytes):
                    writer.write(frame)
                    await writer.drain()
                elif not self._control(frame):
                    return

    async def _to_relay(self, reader: asyncio.StreamReader) -> None:
        """The handler's bytes to the client, until it closes its end."""
        while data := await reader.read(READ_SIZE):
            await self.ws.send(data)
        await self._end(self._ended_words(), job_ending=bool(self.ending()))

    async def _handle(self, sock: socket.socket) -> None:
        assert not isinstance(self.handler, str)
        try:
            await self.handler(sock, self.message, self.resizes)
        except Exception as e:
            log.warning("session %s: its %s handler failed: %s", self.message.session, self.message.kind, e)
            await self._end(f"the {self.message.kind} session failed on the runner: {e}")
        finally:
            sock.close()
        await asyncio.sleep(30)  # its last bytes still go to the client: _to_relay ends the session

    def _control(self, text: str) -> bool:
        """False: the server ended the session."""
        try:
            message = json.loads(text)
        except ValueError:
            return True
        if not isinstance(message, dict) or message.get("type") == "end":
            return False
        if message.get("type") == "resize":
            with contextlib.suppress(asyncio.QueueFull, TypeError, ValueError):
                self.resizes.put_nowait((int(message["cols"]), int(message["rows"])))
        return True

    async def _end(self, reason: str, *, job_ending: bool = False) -> None:
        """``job_ending``: the session ends because its job (this attempt) is ending."""
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(json.dumps({"type": "end", "reason": reason[:500], "job_ending": job_ending}))

    def _ended_words(self) -> str:
        if self.ending():
            return self.ending()
        if self.message.kind == "port":
            return f"port {self.message.port} of the job closed the connection"
        return f"the {self.message.kind} session ended"


async def serve_port(sock: socket.socket, message: p.OpenRelay, _resizes: asyncio.Queue[tuple[int, int]]) -> None:
    """A TCP connection to 127.0.0.1:<port>, pumped both ways until either side closes."""
    try:
        job_reader, job_writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", message.port), 10)
    except (OSError, TimeoutError) as e:
        raise ConnectionError(f"nothing answers on port {message.port} of the job's machine ({e})") from None
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        await asyncio.gather(_copy(reader, job_writer), _copy(job_reader, writer))
    finally:
        job_writer.close()
        writer.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(READ_SIZE):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


def _kind_handler(message: p.OpenRelay, context: SessionContext, work_dir: Path) -> Handler:
    """The ``sessions`` handler of ``message.kind``, bound to the job."""
    if message.kind == "terminal":

        async def terminal(sock: socket.socket, _m: p.OpenRelay, resizes: asyncio.Queue[tuple[int, int]]) -> None:
            await serve_terminal(sock, context, resizes)

        return terminal

    async def ssh(sock: socket.socket, m: p.OpenRelay, _r: asyncio.Queue[tuple[int, int]]) -> None:
        await serve_ssh(sock, context, list(m.keys), _host_key(work_dir))

    return ssh


def host_key_line(work_dir: Path) -> str:
    """This runner's SSH host key (one OpenSSH public key line); "" if none could be made."""
    try:
        return hostkey.public_line(_host_key(work_dir))[: p.MAX_HOST_KEY_CHARS]
    except Exception as e:
        log.warning("no SSH host key in %s: %s; ssh sessions cannot be served", work_dir, e)
        return ""


@functools.cache
def _host_key(work_dir: Path) -> asyncssh.SSHKey:
    """The machine's host key, read (or made) once per runner process: every
    SSH session and every hello use the same one."""
    return hostkey.load_or_create_host_key(work_dir)
