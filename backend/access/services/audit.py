"""A session in the workspace's audit trail: one record when its client
first connects, one when it has ended and its ends have counted its bytes."""

from __future__ import annotations

from django.utils import timezone

from backend.access.models import AccessSession
from backend.accounts.models import AuditKind
from backend.accounts.services.audit import Actor, audit_record


def session_audit_start(session: AccessSession) -> None:
    audit_record(
        workspace_id=session.workspace_id,
        kind=AuditKind.SESSION,
        action="session.start",
        actor=_actor(session),
        target=_target(session),
        detail=_detail(session),
    )


def session_audit_end(session: AccessSession) -> None:
    """Once per session (a compare-and-set on ``audited_at``)."""
    if not AccessSession.objects.filter(pk=session.pk, audited_at__isnull=True).update(audited_at=timezone.now()):
        return
    session.refresh_from_db()
    audit_record(
        workspace_id=session.workspace_id,
        kind=AuditKind.SESSION,
        action="session.end",
        actor=_actor(session),
        target=_target(session),
        detail={
            **_detail(session),
            "reason": session.end_reason,
            "bytes_up": session.bytes_up,
            "bytes_down": session.bytes_down,
            "started_at": session.started_at.isoformat() if session.started_at else None,
            "ended_at": session.ended_at.isoformat() if session.ended_at else None,
        },
    )


def _actor(session: AccessSession) -> Actor:
    return Actor(user=session.user, address=session.client_address or "")


def _target(session: AccessSession) -> str:
    return f"{session.job.run.name}/{session.job.name}"


def _detail(session: AccessSession) -> dict[str, object]:
    return {
        "session": str(session.pk),
        "kind": session.kind,
        "port": session.port,
        "job": str(session.job_id),
        "attempt": session.attempt.number,
        "client": session.client_label,
    }
