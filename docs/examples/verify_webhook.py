"""Verify a Trainyard webhook before trusting it (docs/COST.md, "Notifications").

Trainyard signs each delivery: the ``Trainyard-Signature`` header is
``t=<unix seconds>,v1=<hex HMAC-SHA256(secret, f"{t}.{body}")>``. Check the
signature over the raw body as received (before parsing the JSON), and
refuse a timestamp older than 5 minutes, so a body captured on the way
cannot be replayed later.
"""

import hashlib
import hmac
import time

TOLERANCE_SECONDS = 300


def verify(secret: str, body: bytes, header: str, now: float | None = None) -> bool:
    """True when ``header`` (the Trainyard-Signature value) signs ``body`` with
    ``secret`` and was made within the last 5 minutes."""
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > TOLERANCE_SECONDS:
        return False
    signed = f"{timestamp}.".encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts.get("v1", ""))
