"""Personal API tokens: only a sha256 is stored; the token is visible once."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from backend.accounts.models import ApiToken, User
from backend.core.tokens import API_TOKEN_PREFIX, hash_token

TOKEN_PREFIX = API_TOKEN_PREFIX


@dataclass(frozen=True)
class IssuedToken:
    row: ApiToken
    token: str  # in clear: show it now, it cannot be recovered


def api_token_issue(*, user: User, name: str = "cli", expires_in: timedelta | None = None) -> IssuedToken:
    """A new token of ``user``; refused from ``expires_in`` from now on (None: never)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = timezone.now() + expires_in if expires_in is not None else None
    row = ApiToken.objects.create(
        user=user, name=name, token_hash=hash_token(token), prefix=token[:14], expires_at=expires_at
    )
    return IssuedToken(row=row, token=token)


def api_token_default_lifetime() -> timedelta | None:
    """How long a token lives when its creator names no lifetime
    (TRAINYARD_API_TOKEN_DAYS; None: never expires)."""
    days = settings.TRAINYARD["API_TOKEN_DAYS"]
    return timedelta(days=days) if days > 0 else None


def api_token_create(*, user: User, name: str = "cli", expires_in: timedelta | None = None) -> str:
    """Makes a token and returns it in clear: the only time it is visible."""
    return api_token_issue(user=user, name=name, expires_in=expires_in).token


def api_token_kept(*, user: User, path: Path, name: str) -> str:
    """``user``'s token kept in the file ``path`` (0600) while it still works;
    else a new one (no expiry), written there. What ``make run`` prints on
    every start, instead of a new token each time."""
    if path.exists():
        kept = path.read_text().strip()
        live = ApiToken.objects.filter(token_hash=hash_token(kept), revoked_at__isnull=True, user=user)
        if kept and live.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())).exists():
            return kept
    token = api_token_create(user=user, name=name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


def api_token_revoke(*, user: User, token_id: uuid.UUID) -> bool:
    """Revokes one of ``user``'s live tokens; False when there is no such token (or it is revoked already)."""
    updated = ApiToken.objects.filter(pk=token_id, user=user, revoked_at__isnull=True).update(revoked_at=timezone.now())
    return updated == 1
