"""Encryption of secrets at rest with a rotatable key list (Fernet).

``TRAINYARD_SECRET_KEYS`` holds comma-separated Fernet keys: the first
encrypts, every one decrypts, so a new key is added in front and
``manage.py rotate_secret_keys`` re-encrypts everything with it before the
old key is removed. Without the variable (development only) one key is
derived from DJANGO_SECRET_KEY.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class Unreadable(Exception):
    """A ciphertext none of the keys opens: the key that encrypted it was
    removed (a rotation cut short) or the stored bytes were altered."""


def encrypt(value: str) -> bytes:
    return _fernet().encrypt(value.encode())


def decrypt(token: bytes | memoryview) -> str:
    """The plaintext; raises ``Unreadable`` when no key opens ``token``."""
    try:
        return _fernet().decrypt(bytes(token)).decode()
    except (InvalidToken, UnicodeDecodeError) as e:
        raise Unreadable from e


def rotate(token: bytes | memoryview) -> bytes:
    """``token`` encrypted with the first key; raises ``Unreadable`` like ``decrypt``."""
    try:
        return _fernet().rotate(bytes(token))
    except InvalidToken as e:
        raise Unreadable from e


@lru_cache(maxsize=1)
def _fernet() -> MultiFernet:
    keys = settings.TRAINYARD["SECRET_KEYS"]
    if not keys:
        derived = base64.urlsafe_b64encode(hashlib.sha256(settings.SECRET_KEY.encode()).digest())
        keys = [derived.decode()]
    return MultiFernet([Fernet(k) for k in keys])
