"""The relay's events between web processes, signed by the server, and
their encoding on the wire between the ends (``transport``).

Whoever can write to Redis must not be able to inject bytes into a session.
Control events carry ``core.channels.signed``'s HMAC of their JSON; data
events carry an HMAC-SHA256 over the sending channel, the sequence number
and the bytes, under a key of the session and the direction (client → job
or job → client), so an event replayed into another session, the other
direction or out of order is refused
(docs/decisions/0097-relay-transport.md).

Encoded (one Redis list item each): a data event is ``b"D"``, the sequence
number and the sender's length (``>QH``), the sender, the MAC and the bytes;
a control event ``b"C"`` and its signed JSON; ``WAKE`` is a marker an end
puts in its own list (it carries nothing and is trusted for nothing).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from typing import Any

from django.utils.crypto import salted_hmac

from backend.core.channels import signed, verified

UP = "up"  # client → job
DOWN = "down"  # job → client

WAKE = b"W"
_HEAD = struct.Struct(">QH")
_MAC_SIZE = hashlib.sha256().digest_size

__all__ = [
    "DOWN",
    "UP",
    "WAKE",
    "decoded",
    "direction_key",
    "encoded_control",
    "encoded_data",
    "signed",
    "verified",
]


def direction_key(session_id: str, direction: str) -> bytes:
    return salted_hmac("trainyard.relay", f"{session_id}:{direction}", algorithm="sha256").digest()


def _mac(key: bytes, sender: str, seq: int, data: bytes) -> bytes:
    mac = hmac.new(key, f"{sender}\n{seq}\n".encode(), hashlib.sha256)
    mac.update(data)
    return mac.digest()


def encoded_data(key: bytes, *, sender: str, seq: int, data: bytes) -> bytes:
    name = sender.encode()
    return b"".join((b"D", _HEAD.pack(seq, len(name)), name, _mac(key, sender, seq, data), data))


def encoded_control(event: dict[str, Any]) -> bytes:
    """``event`` signed, as JSON."""
    return b"C" + json.dumps(signed(event)).encode()


def decoded(key: bytes, item: bytes) -> dict[str, Any] | None:
    """An encoded event as the ends handle it: a data event only if its MAC
    under ``key`` holds, a control event only if signed; None for anything
    else (``WAKE`` is ``{"type": "relay.wake"}``)."""
    if item == WAKE:
        return {"type": "relay.wake"}
    if item[:1] == b"C":
        try:
            event = json.loads(item[1:])
        except ValueError:
            return None
        return event if isinstance(event, dict) and verified(event) else None
    if item[:1] != b"D" or len(item) < 1 + _HEAD.size:
        return None
    seq, length = _HEAD.unpack_from(item, 1)
    start = 1 + _HEAD.size
    try:
        sender = item[start : start + length].decode()
    except UnicodeDecodeError:
        return None
    mac = item[start + length : start + length + _MAC_SIZE]
    data = item[start + length + _MAC_SIZE :]
    if not hmac.compare_digest(mac, _mac(key, sender, seq, data)):
        return None
    return {"type": "relay.data", "from": sender, "seq": seq, "data": data}
