"""Tenant fixtures, and a webhook receiver each test starts: a real HTTP
server thread on the loopback network (which the tests' installation lists
in ``TRAINYARD_NOTIFY_PRIVATE_NETWORKS`` where a test sends to it)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.fixtures import *  # noqa: F403


@dataclass
class Received:
    body: bytes
    headers: dict[str, str]


@dataclass
class Receiver:
    """Answers each POST with the next of ``answers`` (then 200) and keeps what it got."""

    url: str
    answers: list[int] = field(default_factory=list)
    got: list[Received] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.got.append(Received(body, dict(self.headers.items())))
            status = state.answers.pop(0) if state.answers else 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/trainyard"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def private(settings: Any) -> None:
    """The installation sends to its loopback network (where the test's receivers listen)."""
    settings.TRAINYARD = {**settings.TRAINYARD, "NOTIFY_PRIVATE_NETWORKS": ["127.0.0.0/8"]}
