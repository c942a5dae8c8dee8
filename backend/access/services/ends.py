"""The two ends of a session's relay: each attaches (recording the channel it
listens on, under the session's row lock, so whichever comes second finds
the first), counts its bytes, and detaches. The end that detaches last from
an ended session writes its end into the audit trail."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from backend.access.models import AccessSession, SessionKind, SessionState
from backend.access.services.audit import session_audit_end, session_audit_start
from backend.access.services.notify import client_gone_on_commit, client_replaced_on_commit
from backend.access.services.sessions import (
    CLOSE_FORBIDDEN,
    CLOSE_NOT_FOUND,
    CLOSE_UNAUTHENTICATED,
    end_session,
)
from backend.accounts.models import User
from backend.core.tokens import hash_token
from backend.runs.services.runner_session import runner_authenticate


@dataclass(frozen=True)
class Attached:
    """An end's admission: ``refusal_code`` 0 when attached; ``peer`` the
    other end's channel ("" until it attaches)."""

    refusal_code: int = 0
    refusal: str = ""
    session_id: str = ""
    kind: str = ""
    peer: str = ""


def client_attach(
    *,
    session_id: UUID | str,
    token: str,
    user: User | None,
    channel: str,
    address: str = "",
    server_side: bool = False,
) -> Attached:
    """The client's socket: the session's token (CLI) or its grantee signed
    in (browser), or the server itself (``server_side``: the apps proxy,
    which granted the session). A granted session opens (before its grant
    expires), a terminal reattaches (a connection of its still open is
    closed: the newest wins); anything else is refused."""
    now = timezone.now()
    with transaction.atomic():
        session = AccessSession.objects.select_for_update().filter(pk=session_id).first()
        if session is None:
            return Attached(CLOSE_NOT_FOUND, "no such session")
        if not server_side and not _client_is_grantee(session, token, user):
            return Attached(CLOSE_UNAUTHENTICATED, "not this session's client: bad token")
        refusal = _client_refusal(session, now)
        if refusal is not None:
            return refusal
        if session.state == SessionState.OPEN and session.client_channel:
            # A terminal's client back before its old socket was seen to drop
            # (a proxy that keeps the server's side open): the new one takes over.
            client_replaced_on_commit(session, session.client_channel)
        first = session.state == SessionState.GRANTED
        AccessSession.objects.filter(pk=session.pk).update(
            state=SessionState.OPEN,
            client_channel=channel,
            started_at=session.started_at or now,
            detached_at=None,
            last_activity_at=now,
            **({"client_address": address} if first and address else {}),
        )
        if first:
            session.refresh_from_db()
            session_audit_start(session)
    return Attached(session_id=str(session.pk), kind=session.kind, peer=session.runner_channel)


def runner_attach(*, session_id: UUID | str, runner_token: str, relay_key: str, channel: str) -> Attached:
    """The runner's socket: the session's instance's runner token and the
    session's relay key."""
    runner = runner_authenticate(token=runner_token) if runner_token else None
    if runner is None or not runner.instance_id or runner.bootstrap:
        return Attached(CLOSE_UNAUTHENTICATED, "not a runner")
    with transaction.atomic():
        session = AccessSession.objects.select_for_update().filter(pk=session_id).first()
        if session is None or str(session.instance_id) != runner.instance_id:
            return Attached(CLOSE_NOT_FOUND, "no such session on this runner")
        if not relay_key or hash_token(relay_key) != session.relay_key_hash:
            return Attached(CLOSE_UNAUTHENTICATED, "bad relay key")
        if session.state == SessionState.ENDED:
            return Attached(CLOSE_NOT_FOUND, f"the session has ended: {session.end_reason}"[:120])
        if session.runner_channel:
            return Attached(CLOSE_FORBIDDEN, "the session's runner end is attached already")
        AccessSession.objects.filter(pk=session.pk).update(runner_channel=channel)
    return Attached(session_id=str(session.pk), kind=session.kind, peer=session.client_channel)


def end_detach(*, session_id: str, side: str, channel: str) -> None:
    """An end's socket closed (``side`` "client" or "runner"). A terminal's
    client leaving makes the session ``detached`` (its shell waits for a
    reconnect within the grace); any other end leaving ends the session.
    The last end to leave an ended session audits its end."""
    column = f"{side}_channel"
    with transaction.atomic():
        session = AccessSession.objects.select_for_update().filter(pk=session_id).first()
        if session is None or getattr(session, column) != channel:
            return  # another connection of that side took over
        AccessSession.objects.filter(pk=session.pk).update(**{column: ""})
        setattr(session, column, "")
        ended = session.state == SessionState.ENDED
    if not ended and side == "client" and session.kind == SessionKind.TERMINAL:
        with transaction.atomic():
            AccessSession.objects.filter(pk=session.pk, state=SessionState.OPEN).update(
                state=SessionState.DETACHED, detached_at=timezone.now()
            )
            client_gone_on_commit(session, gone=channel)
        return
    if not ended:
        who = "client" if side == "client" else "job's side"
        end_session(session_id, f"the {who} closed the session")
        session.refresh_from_db()
    if not session.client_channel and not session.runner_channel:
        session_audit_end(session)


def session_traffic(*, session_id: str, up: int = 0, down: int = 0) -> None:
    """Bytes an end moved since its last count (``up``: client → job)."""
    AccessSession.objects.filter(pk=session_id).update(
        bytes_up=F("bytes_up") + up, bytes_down=F("bytes_down") + down, last_activity_at=timezone.now()
    )


def _client_is_grantee(session: AccessSession, token: str, user: User | None) -> bool:
    if token:
        return hash_token(token) == session.token_hash
    return user is not None and user.pk == session.user_id


def _client_refusal(session: AccessSession, now: object) -> Attached | None:
    if session.state == SessionState.ENDED:
        return Attached(CLOSE_NOT_FOUND, f"the session has ended: {session.end_reason}"[:120])
    if session.state == SessionState.GRANTED and session.grant_expires_at <= now:  # type: ignore[operator]
        end_session(session.pk, "the grant expired before a client connected", code=CLOSE_NOT_FOUND)
        return Attached(CLOSE_NOT_FOUND, "the grant expired: ask for a new session")
    if session.state == SessionState.OPEN and session.kind != SessionKind.TERMINAL:
        return Attached(CLOSE_FORBIDDEN, "the session has a client already")
    return None
