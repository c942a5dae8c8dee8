"""Tenant fixtures, and the receivers each test starts: a real HTTP server
thread on the loopback network (which the tests' installation lists in
``TRAINYARD_NOTIFY_PRIVATE_NETWORKS`` where a test sends to it), and a
local SMTP server (aiosmtpd) that Django's SMTP email backend sends to."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

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


class Inbox:
    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.envelopes.append(envelope)
        return "250 OK"


@pytest.fixture
def smtp(settings: Any) -> Iterator[Inbox]:
    inbox = Inbox()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_USE_TLS = "127.0.0.1", port, False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.DEFAULT_FROM_EMAIL = "trainyard@acme.example"
    yield inbox
    controller.stop()
