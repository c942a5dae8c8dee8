"""Writes for accounts: users with their personal workspace, tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.db import transaction
from django.utils.text import slugify

from backend.accounts.models import ApiToken, Membership, Role, User, Workspace

TOKEN_PREFIX = "trainyard_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def user_get_or_create(*, username: str, email: str = "") -> User:
    """The user, created with a personal workspace if new."""
    user, created = User.objects.get_or_create(username=username, defaults={"email": email})
    if created:
        workspace_create_personal(user=user)
    return user


def workspace_create_personal(*, user: User) -> Workspace:
    slug = _free_slug(slugify(user.username) or "user")
    workspace = Workspace.objects.create(slug=slug, name=user.username, personal_owner=user)
    Membership.objects.create(workspace=workspace, user=user, role=Role.ADMIN)
    return workspace


def api_token_create(*, user: User, name: str = "cli") -> str:
    """Makes a token and returns it in clear: the only time it is visible."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, name=name, token_hash=hash_token(token), prefix=token[:14])
    return token


def _free_slug(base: str) -> str:
    slug, n = base[:60], 1
    while Workspace.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base[:56]}-{n}"
    return slug
