"""The two ends of the relay as plain ASGI apps (not Channels consumers: see
``pipe``): ``/ws/v1/relay/<session>/``, the client's, and
``/ws/runner/relay/<session>/``, the runner's (docs/ACCESS.md).

Each accepts, attaches to the session (closing with 4401/4403/4404 when
refused), tells its peer it is here, relays until one side ends, then
detaches: a terminal's client may come back within the grace; anything else
leaving ends the session."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from backend.access.consumers.sockets import AsgiSocket
from backend.access.pipe import BROKEN, NO_PEER, Pipe
from backend.access.services.ends import Attached, client_attach, end_detach, runner_attach
from backend.access.services.sessions import CLOSE_ATTEMPT_ENDED, CLOSE_NORMAL, GRANT_SECONDS, end_session
from backend.accounts.auth import token_from_header
from backend.accounts.models import User
from backend.core.origins import scope_ip

logger = logging.getLogger(__name__)

RUNNER_WAIT_SECONDS = 30.0  # a client waits this long for the job's runner to dial in


def _db(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    return database_sync_to_async(fn, thread_sensitive=False)


class ClientEnd:
    """The CLI sends ``Authorization: Bearer <session token>``; a browser
    comes with its session cookie (the grantee signed in; the origin guard
    applies)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        socket = AsgiSocket(scope, receive, send)
        if not await socket.connected():
            return
        session_id = str(scope["url_route"]["kwargs"]["session"])
        user = scope.get("user")
        layer = get_channel_layer()
        channel = await layer.new_channel()
        attached = await _db(client_attach)(
            session_id=session_id,
            token=token_from_header(socket.header(b"authorization")) or "",
            user=user if isinstance(user, User) and user.is_active else None,
            channel=channel,
            address=scope_ip(scope),
        )
        await _relay(socket, attached, "client", layer, channel, RUNNER_WAIT_SECONDS, _client_text)


class RunnerEnd:
    """The runner of the session's instance, with its token and the
    session's relay key (``X-Trainyard-Relay-Key``)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        socket = AsgiSocket(scope, receive, send)
        if not await socket.connected():
            return
        session_id = str(scope["url_route"]["kwargs"]["session"])
        layer = get_channel_layer()
        channel = await layer.new_channel()
        attached = await _db(runner_attach)(
            session_id=session_id,
            runner_token=token_from_header(socket.header(b"authorization")) or "",
            relay_key=socket.relay_key(),
            channel=channel,
        )

        async def on_text(text: str) -> str | None:
            """The runner's ``{"type": "end", "reason", "job_ending"}``: the
            session ends; the client's close code says when it ended because
            its job's attempt is ending (4409: a new session reaches the job's
            next attempt)."""
            message = _json(text)
            if message.get("type") == "end":
                reason = str(message.get("reason") or "the job's side ended the session")[:500]
                code = CLOSE_ATTEMPT_ENDED if message.get("job_ending") is True else CLOSE_NORMAL
                await _db(end_session)(session_id, reason, code=code)
            return None

        wait = GRANT_SECONDS + settings.TRAINYARD["TERMINAL_GRACE"]
        await _relay(socket, attached, "runner", layer, channel, wait, on_text)


# As routed (``backend/config/routing.py``): plain ASGI apps.
client_end: Any = ClientEnd()
runner_end: Any = RunnerEnd()


async def _relay(
    socket: AsgiSocket,
    attached: Attached,
    side: str,
    layer: Any,
    channel: str,
    peer_timeout: float,
    on_text: Callable[[str], Awaitable[str | None]],
) -> None:
    await socket.accept()
    if attached.refusal_code:
        await socket.close(attached.refusal_code, attached.refusal)
        return
    pipe = Pipe(
        session_id=attached.session_id,
        side=side,
        local=socket,
        layer=layer,
        channel=channel,
        peer=attached.peer,
        on_text=on_text,
        peer_timeout=peer_timeout,
    )
    try:
        await pipe.announce()
        outcome = await pipe.run()
        if outcome in (BROKEN, NO_PEER):
            reason = pipe.broken_reason or "the job's runner did not connect to the relay"
            if outcome == NO_PEER and side == "runner":
                reason = "no client connected"
            await _db(end_session)(attached.session_id, reason)
            await socket.end(reason, 1011 if outcome == BROKEN else CLOSE_NORMAL)
    finally:
        await _db(end_detach)(session_id=attached.session_id, side=side, channel=channel)


async def _client_text(text: str) -> str | None:
    """A terminal's ``{"type": "resize", "cols", "rows"}`` goes to the runner; nothing else does."""
    message = _json(text)
    if message.get("type") != "resize":
        return None
    cols, rows = message.get("cols"), message.get("rows")
    if not (isinstance(cols, int) and isinstance(rows, int) and 1 <= cols <= 1000 and 1 <= rows <= 1000):
        return None
    return json.dumps({"type": "resize", "cols": cols, "rows": rows})


def _json(text: str) -> dict[str, Any]:
    if len(text) > 4096:
        return {}
    try:
        message = json.loads(text)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}
