"""Reads for accounts."""

from __future__ import annotations

from django.utils import timezone

from backend.accounts.models import ApiToken, Invitation, Membership, User, Workspace
from backend.accounts.services import hash_token


def user_for_token(*, token: str) -> User | None:
    row = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_token(token), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if row is None:
        return None
    # Coarse last-used stamp: at most one write a minute per token.
    now = timezone.now()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user


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
    return list(Invitation.objects.for_workspace(workspace).filter(accepted_at__isnull=True).order_by("-created_at"))


def api_tokens_of(*, user: User) -> list[ApiToken]:
    """The user's live tokens, newest first."""
    return list(ApiToken.objects.filter(user=user, revoked_at__isnull=True).order_by("-created_at"))
