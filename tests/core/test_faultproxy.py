"""The fault-injecting proxy of tests/support/faultproxy.py, against a real echo server."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.faultproxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        # The tests reset connections on purpose (the proxy's faults): the
        # echo's side of a reset ends its loop, not in a traceback on stderr.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while data := self.request.recv(65536):
                self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    running = FaultProxy(server.server_address[1]).start()
    yield running
    running.close()
    server.shutdown()
    server.server_close()


def _client(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def _recv(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got


def test_passthrough_blackhole_holds_then_delivers_and_drop_loses(proxy: FaultProxy) -> None:
    with _client(proxy) as sock:
        sock.sendall(b"hello")
        assert _recv(sock, 5) == b"hello"
        proxy.blackhole()
        sock.sendall(b"held")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        proxy.passthrough()
        sock.settimeout(5)
        assert _recv(sock, 4) == b"held"
        proxy.drop()
        sock.sendall(b"lost")
        time.sleep(0.3)
        proxy.passthrough()
        sock.sendall(b"kept")
        assert _recv(sock, 4) == b"kept"


def test_reset_aborts_connections_with_a_reset(proxy: FaultProxy) -> None:
    with _client(proxy) as sock:
        sock.sendall(b"x")
        assert _recv(sock, 1) == b"x"
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            sock.sendall(b"y")
            sock.recv(1)
    assert proxy.resets == 1


def test_slow_paces_each_direction(proxy: FaultProxy) -> None:
    proxy.slow(2000)
    with _client(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"z" * 1000)
        assert _recv(sock, 1000) == b"z" * 1000
        # 1,000 bytes each way at 2,000 bytes/s, pipelined: about half a second or more.
        assert time.monotonic() - started >= 0.45
