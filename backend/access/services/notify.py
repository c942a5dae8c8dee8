"""What a session's change tells the ends of its relay and its runner, after
commit, through the channel layer (signed: ``core.channels``)."""

from __future__ import annotations

from django.db import transaction
from trainyard_runner import protocol

from backend.access.models import AccessSession
from backend.core.channels import send_to_channel

CLOSE_REPLACED = 4410  # as an admin's end: this connection is over, the session is not


def end_ends_on_commit(session: AccessSession, *, reason: str, code: int) -> None:
    """Both ends (those attached) say ``reason`` to their sockets and close."""
    event = {"type": "relay.end", "session": str(session.pk), "reason": reason[:500], "code": code}
    for channel in (session.client_channel, session.runner_channel):
        if channel:
            transaction.on_commit(lambda channel=channel: send_to_channel(channel, event))  # type: ignore[misc]


def client_gone_on_commit(session: AccessSession, *, gone: str) -> None:
    """A terminal's client (its end's channel ``gone``) left: the runner's
    end stops reading the job's side until a client reattaches, so the
    shell's output waits for it. The next client may have told the runner's
    end it is here before this arrives: ``gone`` says which one left."""
    if session.runner_channel:
        event = {"type": "relay.peer", "session": str(session.pk), "channel": "", "gone": gone}
        channel = session.runner_channel
        transaction.on_commit(lambda: send_to_channel(channel, event))


def client_replaced_on_commit(session: AccessSession, old_channel: str) -> None:
    """A terminal's newer client took over: the older connection closes."""
    reason = "this terminal was reopened in another connection"
    event = {"type": "relay.end", "session": str(session.pk), "reason": reason, "code": CLOSE_REPLACED}
    transaction.on_commit(lambda: send_to_channel(old_channel, event))


def close_relay_on_commit(session: AccessSession, *, reason: str) -> None:
    """The runner stops serving the session, also if it never dialled the relay."""
    channel = session.instance.channel_name
    if not channel:
        return
    frame = protocol.CloseRelay(session=str(session.pk), reason=reason[:500]).model_dump_json()
    transaction.on_commit(lambda: send_to_channel(channel, {"type": "runner.frame", "frame": frame}))
