"""Sessions that end when the credentials they were granted with change:
removing an SSH key ends its owner's live SSH sessions, in every workspace
(a grant sends the runner all of the grantee's keys, and the runner does not
say which one logged in, so none of those sessions may outlive the key)."""

from __future__ import annotations

from backend.access.models import LIVE_SESSION, AccessSession, SessionKind
from backend.access.services.sessions import CLOSE_ENDED_BY_ADMIN, end_session
from backend.accounts.models import User


def ssh_sessions_end_for_user(*, user: User, reason: str) -> int:
    """Ends ``user``'s live SSH sessions of every workspace (the one query of
    sessions across workspaces: they are all the user's own); how many ended."""
    live = AccessSession.objects.filter(user=user, kind=SessionKind.SSH, state__in=LIVE_SESSION)
    return sum(end_session(pk, reason, code=CLOSE_ENDED_BY_ADMIN) for pk in list(live.values_list("pk", flat=True)))
