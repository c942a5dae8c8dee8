"""Email subscriptions: sent through Django's SMTP email backend to a local
SMTP server the test starts (aiosmtpd)."""

from __future__ import annotations

import email
from typing import Any

from backend.notify.services import delivery_send
from tests.notify.conftest import Inbox
from tests.support.fixtures import Person

NOTIFICATIONS = "/api/v1/workspaces/acme/notifications/"


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
