"""Issue 33, item 1: every request body is capped per route, signed in or
not. A real HTTP client sends 100 MB with ``Transfer-Encoding: chunked`` to
the real server (uvicorn); the server answers 413 once the body passes its
cap, without reading the 100 MB and without spooling it to disk (Django's
ASGI handler writes a body past 2.5 MB to a temporary file before any view
runs: the server's ``wchar`` in /proc/<pid>/io would show it)."""

from __future__ import annotations

import http.client
import json
import select
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fixtures import Person
from tests.support.web import WebServer, WebServers

pytestmark = pytest.mark.django_db(transaction=True)

MB = 1 << 20
BODY = 100 * MB
BLOCK = b"x" * (64 * 1024)
SENT_AT_MOST = 16 * MB  # the cap plus what the sockets' buffers take before the server stops reading
WRITTEN_AT_MOST = 8 * MB


def _written(pid: int) -> int:
    """Bytes the process has passed to write() (files, sockets, pipes)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["wchar"])


def _send_chunked(server: WebServer, path: str, headers: dict[str, str]) -> tuple[int | None, dict[str, object], int]:
    """POST 100 MB chunked, stopping once the server answers or hangs up:
    (status or None if it only closed, the JSON answer, bytes sent)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.connect()
    assert connection.sock is not None
    connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        while sent < BODY:
            if select.select([connection.sock], [], [], 0)[0]:  # the server answered (or closed)
                return
            sent += len(BLOCK)
            yield BLOCK

    try:
        connection.request("POST", path, body=body(), headers={**headers, "Content-Type": "application/json"},
                           encode_chunked=True)  # fmt: skip
        response = connection.getresponse()
    except (BrokenPipeError, ConnectionResetError):
        return None, {}, sent
    data = response.read()
    connection.close()
    return response.status, json.loads(data) if data else {}, sent


def _server(web_server: WebServers) -> tuple[WebServer, int]:
    server = web_server.start()
    process = server._process  # the uvicorn process itself (one worker)
    assert process is not None
    return server, process.pid


def test_an_unauthenticated_100_mb_chunked_body_is_cut_at_its_cap(web_server: WebServers) -> None:
    server, pid = _server(web_server)
    before = _written(pid)

    status, answer, sent = _send_chunked(server, "/api/v1/auth/login/", {})

    assert status in (413, None), answer
    if status == 413:
        assert answer["extra"] == {"limit_bytes": 64 * 1024}
    assert sent < SENT_AT_MOST, f"the client sent {sent / MB:.0f} MB"
    assert _written(pid) - before < WRITTEN_AT_MOST


def test_a_signed_in_100_mb_chunked_body_is_cut_at_the_routes_smaller_cap(
    web_server: WebServers, owner: Person
) -> None:
    server, pid = _server(web_server)
    before = _written(pid)

    status, answer, sent = _send_chunked(server, "/api/v1/tokens/", {"Authorization": f"Bearer {owner.token}"})

    assert status in (413, None), answer
    if status == 413:
        assert answer["extra"] == {"limit_bytes": MB}  # TRAINYARD_MAX_BODY_BYTES: a small JSON route
    assert sent < SENT_AT_MOST, f"the client sent {sent / MB:.0f} MB"
    assert _written(pid) - before < WRITTEN_AT_MOST, "the body was not spooled to disk"
