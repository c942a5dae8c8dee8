"""How a webhook's body is signed: ``Trainyard-Signature: t=<unix>,v1=<hex
HMAC-SHA256(secret, f"{t}.{body}")>``. A receiver checks it with the
snippet of docs/examples/verify_webhook.py (the timestamp against replay)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"


def secret_new() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(*, secret: str, body: bytes, timestamp: int) -> str:
    """The ``Trainyard-Signature`` header's value for ``body`` sent at ``timestamp``."""
    signed = f"{timestamp}.".encode() + body
    return f"t={timestamp},v1={hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()}"
