"""Tokens are stored hashed: a leaked table gives no usable token."""

from __future__ import annotations

import hashlib


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
