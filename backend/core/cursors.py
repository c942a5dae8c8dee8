"""Opaque cursors of keyset pages (the runs list: docs/API.md, "Pagination")."""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from backend.core.errors import ApplicationError


@dataclass(frozen=True)
class Position:
    """Where a keyset page ends: the last row's (created_at, id). The next
    page is the rows strictly after it in ``-created_at, -id`` order."""

    created_at: datetime
    id: uuid.UUID


def cursor_encode(position: Position) -> str:
    """An opaque, URL-safe token for ``position`` (clients pass it back as is)."""
    raw = json.dumps([position.created_at.isoformat(), str(position.id)], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def cursor_decode(token: str) -> Position:
    """The position of a token ``cursor_encode`` made; a clear error otherwise."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created_at, ident = json.loads(raw)
        position = Position(datetime.fromisoformat(created_at), uuid.UUID(ident))
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise ApplicationError(
            "cursor is not valid: pass the `next` link (or its cursor) of the previous page unchanged."
        ) from None
    if position.created_at.tzinfo is None:
        raise ApplicationError("cursor is not valid: pass the `next` link of the previous page unchanged.")
    return position
