"""The periodic pass over live sessions (``sessions-sweep`` in
settings.CELERY_BEAT_SCHEDULE): what no end of a relay can see for itself."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from backend.access.models import AccessSession, SessionState
from backend.access.services.audit import session_audit_end
from backend.access.services.sessions import CLOSE_IDLE, CLOSE_NORMAL, CLOSE_NOT_FOUND, end_session

# An ended session whose ends never detached (their web process died) is
# audited with what was counted once this long has passed.
AUDIT_LEFTOVER_SECONDS = 60


def sessions_sweep() -> int:
    """1. A grant no client used before it expired ends.
    2. A terminal whose client left longer ago than the grace ends.
    3. A session that moved no byte for ``TRAINYARD_SESSION_IDLE_SECONDS`` ends.
    4. An ended session still not audited (an end's process died) is.
    Returns how many sessions it ended."""
    now = timezone.now()
    grace = timedelta(seconds=settings.TRAINYARD["TERMINAL_GRACE"])
    idle = timedelta(seconds=settings.TRAINYARD["SESSION_IDLE_SECONDS"])
    sessions = AccessSession.objects
    ended = 0
    for pk in sessions.filter(state=SessionState.GRANTED, grant_expires_at__lt=now).values_list("pk", flat=True):
        ended += end_session(pk, "the grant expired before a client connected", code=CLOSE_NOT_FOUND)
    for pk in sessions.filter(state=SessionState.DETACHED, detached_at__lt=now - grace).values_list("pk", flat=True):
        ended += end_session(pk, f"the terminal's client did not come back within {grace.seconds} s", code=CLOSE_NORMAL)
    quiet = Q(last_activity_at__lt=now - idle) | Q(last_activity_at__isnull=True, started_at__lt=now - idle)
    for pk in sessions.filter(quiet, state=SessionState.OPEN).values_list("pk", flat=True):
        ended += end_session(pk, f"idle for {_words(idle)}: no byte either way", code=CLOSE_IDLE)
    leftover = now - timedelta(seconds=AUDIT_LEFTOVER_SECONDS)
    for session in sessions.filter(state=SessionState.ENDED, audited_at__isnull=True, ended_at__lt=leftover):
        session_audit_end(session)
    return ended


def _words(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    return f"{seconds // 60} min" if seconds >= 120 else f"{seconds} s"
