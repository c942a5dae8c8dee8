"""Reads for accounts."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from importlib import import_module
from types import SimpleNamespace
from typing import cast

from django.conf import settings
from django.contrib import auth
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from backend.accounts.models import (
    ApiToken,
    AuditEvent,
    AuditKind,
    Invitation,
    Membership,
    SshKey,
    User,
    Workspace,
)
from backend.accounts.services import hash_token
from backend.core.cursors import Position, cursor_decode, cursor_encode
from backend.core.errors import ApplicationError


def user_for_token(*, token: str) -> User | None:
    """The active user of a live API token: not revoked, not expired."""
    now = timezone.now()
    row = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_token(token), revoked_at__isnull=True, user__is_active=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .first()
    )
    if row is None:
        return None
    # Coarse last-used stamp: at most one write a minute per token.
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user


def api_token_expired_at(*, token: str) -> datetime | None:
    """When this API token expired; None when it did not (or is unknown)."""
    return (
        ApiToken.objects.filter(token_hash=hash_token(token), expires_at__lte=timezone.now())
        .values_list("expires_at", flat=True)
        .first()
    )


def api_token_refused_account_at(*, token: str) -> datetime | None:
    """When the allowlist's re-check refused the account of this (live) API token; None otherwise."""
    return (
        ApiToken.objects.filter(
            token_hash=hash_token(token),
            revoked_at__isnull=True,
            user__is_active=False,
            user__allow_refused_at__isnull=False,
        )
        .values_list("user__allow_refused_at", flat=True)
        .first()
    )


def membership_get(*, user: User, workspace_slug: str) -> Membership | None:
    return Membership.objects.select_related("workspace").filter(user=user, workspace__slug=workspace_slug).first()


def memberships_of(*, user: User) -> list[Membership]:
    return list(Membership.objects.select_related("workspace").filter(user=user).order_by("workspace__slug"))


def default_workspace(*, user: User) -> Workspace | None:
    personal = Workspace.objects.filter(personal_owner=user).first()
    if personal is not None:
        return personal
    first = Membership.objects.filter(user=user).select_related("workspace").order_by("created_at").first()
    return first.workspace if first else None


def members_of(*, workspace: Workspace) -> list[Membership]:
    return list(Membership.objects.for_workspace(workspace).select_related("user").order_by("user__username"))


def invitations_pending(*, workspace: Workspace) -> list[Invitation]:
    """Not accepted and not expired, newest first."""
    pending = Invitation.objects.for_workspace(workspace).filter(
        accepted_at__isnull=True, expires_at__gt=timezone.now()
    )
    return list(pending.order_by("-created_at"))


def api_tokens_of(*, user: User) -> list[ApiToken]:
    """The user's live tokens, newest first."""
    return list(ApiToken.objects.filter(user=user, revoked_at__isnull=True).order_by("-created_at"))


def ssh_keys_of(*, user: User) -> list[SshKey]:
    """The user's SSH public keys, oldest first."""
    return list(SshKey.objects.filter(user=user).order_by("created_at", "id"))


def ssh_public_keys(user: User) -> list[str]:
    """The OpenSSH lines (``<type> <base64>``) the runner's SSH server lets ``user`` in with."""
    return [key.public_key for key in ssh_keys_of(user=user)]


class AccessLost(enum.Enum):
    """Why a long-lived connection (a websocket) may no longer read a workspace."""

    SIGNED_OUT = "signed out: the session has ended"
    TOKEN_REVOKED = "the API token was revoked or has expired"
    DEACTIVATED = "the account is deactivated"
    NOT_A_MEMBER = "no longer a member of this workspace"


def user_for_session(*, session_key: str) -> User | None:
    """The active user signed in with this session (Django's own checks: the
    backend still knows the user, the session's password hash still matches)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    user = auth.get_user(cast(HttpRequest, SimpleNamespace(session=store)))
    return user if isinstance(user, User) and user.is_active else None


def access_lost(*, user: User, token: str | None, session_key: str | None, workspace_slug: str) -> AccessLost | None:
    """Re-checks what let ``user`` in (the token, else the session) and the
    membership; None while both still hold."""
    if token is not None:
        current = user_for_token(token=token)
    else:
        current = user_for_session(session_key=session_key) if session_key else None
    if current is None or current.pk != user.pk:
        if not User.objects.filter(pk=user.pk, is_active=True).exists():
            return AccessLost.DEACTIVATED
        return AccessLost.TOKEN_REVOKED if token is not None else AccessLost.SIGNED_OUT
    if membership_get(user=current, workspace_slug=workspace_slug) is None:
        return AccessLost.NOT_A_MEMBER
    return None


@dataclass(frozen=True)
class AuditPage:
    events: list[AuditEvent]
    next: str | None  # the cursor of the next page, None on the last


def audit_page(*, workspace: Workspace, kind: str = "", cursor: str = "", size: int = 50) -> AuditPage:
    """The workspace's events newest first, ``kind`` only when given, one
    keyset page after ``cursor``."""
    if kind and kind not in AuditKind.values:
        raise ApplicationError(
            f"kind {kind!r} is not an audit event kind: one of {', '.join(AuditKind.values)}.",
            extra={"field": "kind"},
        )
    events: QuerySet[AuditEvent] = AuditEvent.objects.for_workspace(workspace).order_by("-created_at", "-id")
    if kind:
        events = events.filter(kind=kind)
    if cursor:
        at = cursor_decode(cursor)
        events = events.filter(created_at__lte=at.created_at).filter(
            Q(created_at__lt=at.created_at) | Q(created_at=at.created_at, id__lt=at.id)
        )
    rows = list(events.select_related("user")[: size + 1])
    page = rows[:size]
    more = len(rows) > size
    return AuditPage(page, cursor_encode(Position(page[-1].created_at, page[-1].id)) if more else None)
