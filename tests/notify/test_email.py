"""Email subscriptions: sent through Django's SMTP email backend to a local
SMTP server the test starts (aiosmtpd)."""

from __future__ import annotations

import email
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from backend.notify.services import delivery_send
from tests.support.fixtures import Person

NOTIFICATIONS = "/api/v1/workspaces/acme/notifications/"


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


def test_an_email_subscription_reaches_the_smtp_server(owner: Person, smtp: Inbox) -> None:
    created = owner.client().post(
        NOTIFICATIONS, {"kind": "email", "target": "ml-team@acme.example", "events": ["run.failed"]}, format="json"
    )
    assert created.status_code == 201, created.json()
    sent = owner.client().post(f"{NOTIFICATIONS}{created.json()['id']}/test/").json()

    assert delivery_send(delivery_id=sent["id"]) == "delivered"

    (envelope,) = smtp.envelopes
    assert (envelope.mail_from, envelope.rcpt_tos) == ("trainyard@acme.example", ["ml-team@acme.example"])
    message = email.message_from_bytes(envelope.original_content or b"")
    assert message["Subject"] == "[Trainyard] acme: a test notification from Trainyard"
    assert '"type": "test"' in message.get_payload()


def test_an_installation_without_smtp_refuses_email_subscriptions(owner: Person, settings: Any) -> None:
    settings.EMAIL_HOST = ""
    refused = owner.client().post(
        NOTIFICATIONS, {"kind": "email", "target": "ml-team@acme.example", "events": ["run.failed"]}, format="json"
    )

    assert refused.status_code == 400
    assert "TRAINYARD_EMAIL_HOST" in refused.json()["message"]
