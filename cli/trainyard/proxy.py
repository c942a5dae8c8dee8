"""The client end of a session's byte stream (docs/ACCESS.md): the
websocket of a grant, pumped to and from two file descriptors (ssh's
ProxyCommand: our stdin and stdout) until either side ends.

Binary frames are the stream's bytes (at most ``MAX_FRAME`` each); text
frames are the server's JSON control messages: ``ready`` once the job's
runner is connected (nothing is sent before it), ``end`` with the reason
right before the server closes.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

MAX_FRAME = 256 * 1024
READY_TIMEOUT = 30.0
OPEN_TIMEOUT = 15.0
CLOSE_MESSAGES = {
    4401: "the server refused the session: no valid credentials (check TRAINYARD_TOKEN, or run `trainyard login`)",
    4403: "the server refused the session: you may not open sessions into this job",
    4404: "the session's grant is unknown or expired (it must be used within a minute): try again",
    4408: "the session ended: idle for too long",
    4409: "the session ended: the job's attempt ended",
    4410: "the session ended: ended by an admin, or its key was removed",
    4429: "the server refused the session: too many sessions open",
}


class ProxyError(Exception):
    """The session could not be carried; the message says why."""


def pump(grant: dict[str, Any], *, read_fd: int, write_fd: int) -> str:
    """Carries the session of ``grant`` until either side ends; returns the
    server's reason when it ended the session ("" when this side did).
    ProxyError when the server refused or the stream broke."""
    ws = _open(grant)
    with ws:
        _await_ready(ws, write_fd)
        sender = threading.Thread(target=_upstream, args=(ws, read_fd), name="session-upstream", daemon=True)
        sender.start()
        return _downstream(ws, write_fd)


def _open(grant: dict[str, Any]) -> ClientConnection:
    headers = {"Authorization": f"Bearer {grant['token']}"}
    try:
        return connect(
            str(grant["url"]),
            additional_headers=headers,
            open_timeout=OPEN_TIMEOUT,
            close_timeout=2,
            max_size=2 * MAX_FRAME,
            compression=None,  # ssh's bytes are encrypted: nothing to gain
            ping_interval=20,
            ping_timeout=60,
        )
    except InvalidStatus as e:
        raise ProxyError(f"the server refused the session's websocket (HTTP {e.response.status_code})") from None
    except ConnectionClosed as e:
        raise ProxyError(_closed_message(e)) from None
    except (OSError, InvalidHandshake, TimeoutError) as e:
        raise ProxyError(f"cannot open the session's websocket at {grant['url']}: {e}") from None


def _await_ready(ws: ClientConnection, write_fd: int) -> None:
    """Reads control frames until ``ready``."""
    try:
        while True:
            frame = ws.recv(timeout=READY_TIMEOUT)
            if isinstance(frame, bytes):  # the job spoke first: pass it on
                _write_all(write_fd, frame)
                return
            message = _control(frame)
            if message.get("type") == "ready":
                return
            if message.get("type") == "end":
                raise ProxyError(f"the session ended: {message.get('reason') or 'no reason given'}")
    except TimeoutError:
        raise ProxyError(f"the job's runner did not answer within {READY_TIMEOUT:.0f}s: try again") from None
    except ConnectionClosed as e:
        raise ProxyError(_closed_message(e)) from None


def _upstream(ws: ClientConnection, read_fd: int) -> None:
    """Our input to the job; at its end (ssh is done) the websocket is closed."""
    try:
        while chunk := os.read(read_fd, MAX_FRAME):
            ws.send(chunk)
    except (OSError, ConnectionClosed):
        pass
    ws.close()


def _downstream(ws: ClientConnection, write_fd: int) -> str:
    reason = ""
    try:
        for frame in ws:
            if isinstance(frame, bytes):
                _write_all(write_fd, frame)
            elif (message := _control(frame)).get("type") == "end":
                reason = str(message.get("reason") or "")[:500]
    except ConnectionClosed as e:
        if e.rcvd is not None and e.rcvd.code in CLOSE_MESSAGES:
            raise ProxyError(_closed_message(e, reason)) from None
    except OSError:  # ssh went away: nothing left to write to
        pass
    return reason


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _control(frame: str) -> dict[str, Any]:
    try:
        message = json.loads(frame)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def _closed_message(closed: ConnectionClosed, reason: str = "") -> str:
    code = closed.rcvd.code if closed.rcvd is not None else None
    said = reason or (closed.rcvd.reason if closed.rcvd is not None else "")
    known = CLOSE_MESSAGES.get(code or 0, f"the server closed the session (code {code})")
    return f"{known}: {said}" if said else known
