"""Personal API tokens: only a sha256 is stored; the token is visible once."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass

from django.utils import timezone

from backend.accounts.models import ApiToken, User
from backend.core.tokens import hash_token

TOKEN_PREFIX = "trainyard_"


@dataclass(frozen=True)
class IssuedToken:
    row: ApiToken
    token: str  # in clear: show it now, it cannot be recovered


def api_token_issue(*, user: User, name: str = "cli") -> IssuedToken:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(user=user, name=name, token_hash=hash_token(token), prefix=token[:14])
    return IssuedToken(row=row, token=token)


def api_token_create(*, user: User, name: str = "cli") -> str:
    """Makes a token and returns it in clear: the only time it is visible."""
    return api_token_issue(user=user, name=name).token


def api_token_revoke(*, user: User, token_id: uuid.UUID) -> bool:
    """Revokes one of ``user``'s live tokens; False when there is no such token (or it is revoked already)."""
    updated = ApiToken.objects.filter(pk=token_id, user=user, revoked_at__isnull=True).update(revoked_at=timezone.now())
    return updated == 1
