"""Reads of sessions for the API."""

from __future__ import annotations

from django.db.models import QuerySet

from backend.access.models import LIVE_SESSION, AccessSession
from backend.accounts.models import User, Workspace

MAX_LISTED = 500


def sessions_visible(*, workspace: Workspace, user: User, admin: bool, live: bool = False) -> QuerySet[AccessSession]:
    """An admin sees every session of the workspace; anyone else their own. Newest first."""
    sessions = AccessSession.objects.for_workspace(workspace)
    if not admin:
        sessions = sessions.filter(user=user)
    if live:
        sessions = sessions.filter(state__in=LIVE_SESSION)
    return sessions.select_related("user", "job", "job__run", "attempt").order_by("-created_at")[:MAX_LISTED]


def session_visible(*, workspace: Workspace, user: User, admin: bool, session_id: str) -> AccessSession | None:
    sessions = AccessSession.objects.for_workspace(workspace).filter(pk=session_id)
    return (sessions if admin else sessions.filter(user=user)).first()
