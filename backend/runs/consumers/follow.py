"""/ws/v1/workspaces/<ws>/runs/<run>/: a run's status and log lines, live.

Join the run's group first (through the process's relay of it,
consumers/fanout.py), then send the stored backlog, then forward
published lines; ``sent`` (the highest seq sent per job) drops the lines that
arrive both ways, so every line goes out once and in order.

Events the channel layer dropped (a follower that stopped reading fills its
channel past capacity; a message expires) are caught up from storage: a gap
before a later event at once, the tail (no later event comes) once the
follower is quiet after a stalled send, and at every re-check in any case.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from trainyard_runner.protocol import chunk_fields, chunk_lines

from backend.accounts.auth import token_from_header
from backend.accounts.models import Membership, User, Workspace
from backend.accounts.selectors import membership_get, user_for_token
from backend.core.ratelimit import Refusal, rate_hit
from backend.core.socketslots import SLOT_RENEWALS, socket_slot_release, socket_slot_renew, socket_slot_take
from backend.runs.api.listing import run_shown
from backend.runs.consumers import fanout
from backend.runs.consumers.limits import CLOSE_RATE_LIMITED, close_reason, scope_ip
from backend.runs.consumers.threads import off_shared_thread
from backend.runs.consumers.watch import Credentials, interval, watch
from backend.runs.events import run_group, workspace_group
from backend.runs.selectors import job_log_page, run_by_ref
from backend.runs.services.logs import follower_frame, follower_frames

logger = logging.getLogger(__name__)
T = TypeVar("T")

BACKLOG_PAGE = 5000
# A send that waited this long means the follower stopped reading: events may be lost.
STALLED_SEND_SECONDS = 1.0
# Catch up from storage once nothing was sent for this long after a stall.
CATCH_UP_IDLE_SECONDS = 1.0
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_TRY_AGAIN_LATER = 1013
# A follower's connect reads in threads (its admission, its opening). At most
# this many run at once in a process, so that a burst of connects (many people
# opening one run's page) never takes the interpreter from the event loop
# that sends the frames of those already following; the other connects wait
# their turn on the loop. A lone connect does not wait (decision 0065;
# bench/results/2026-12-04-followers-connects-gated.md).
CONNECT_READS_AT_ONCE = 2


class _MemberConsumer(AsyncJsonWebsocketConsumer):
    """Accepts, then closes 4429 over a connect rate limit (per address, then
    per user), 4401 without credentials and 4404 for a workspace the caller
    is not a member of (the same answer as for one that does not exist), and
    4429 again, naming the limit, when the user has TRAINYARD_WS_PER_USER
    sockets open already (core/socketslots.py: the socket holds a slot until
    it disconnects). Once following, ``watch`` re-checks both (consumers/watch.py)."""

    # No channel of its own: its groups' events come through the process's
    # relays (fanout.py). With one, each socket also kept a read of the
    # channel layer waiting, which woke for every message of the process.
    channel_layer_alias = "trainyard.no-channel"
    credentials: Credentials | None = None
    _slot = ""  # the socket's slot among its user's open sockets (core/socketslots.py), once admitted
    _watch: asyncio.Task[None] | None = None
    _closed = False
    _inbox: fanout.Inbox | None = None
    _groups: tuple[str, ...] = ()

    async def member_of_workspace(self, run_ref: str | None = None) -> Admission | None:
        """The checks above in one call to a thread (``_admit``): at a burst
        of connects each call waits its turn for the pool's threads, and
        there were five. ``run_ref``: also look that run up (its id)."""
        await self.accept()
        slug = self.scope["url_route"]["kwargs"]["workspace"]
        admission = await connect_read(_admit, self.scope, slug, run_ref)
        if admission.refusal is not None:
            await self.close(code=CLOSE_RATE_LIMITED, reason=close_reason(admission.refusal))
            return None
        if admission.sockets_limit is not None:
            await self.close(code=CLOSE_RATE_LIMITED, reason=sockets_reason(admission.sockets_limit))
            return None
        if admission.user is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return None
        if admission.membership is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return None
        session = self.scope.get("session")
        token = admission.token
        session_key = None if token is not None or session is None else session.session_key
        self.credentials = Credentials(user=admission.user, token=token, session_key=session_key, workspace_slug=slug)
        self._slot = admission.slot
        return admission

    async def follow(self, group: str) -> bool:
        """Get ``group``'s events through this process's relay of it
        (consumers/fanout.py), handled by ``dispatch`` in order, and keep
        access and membership checked (consumers/watch.py). False: the
        channel layer could not be joined (Redis down) and the socket is
        closed 1013, try again later."""
        if self._inbox is None:
            self._inbox = fanout.Inbox(self.relayed, self._event_failed)
        self._groups += (group,)
        try:
            await fanout.join(group, self._inbox)
        except Exception as e:
            logger.warning("a follower could not join %s (%s); closing it 1013, try again later", group, e)
            await self.close(code=CLOSE_TRY_AGAIN_LATER)
            return False
        assert self.credentials is not None
        self._watch = asyncio.create_task(watch(self, self.credentials, leave=self.leave_groups, on_tick=self._ticked))
        return True

    async def relayed(self, event: dict[str, Any]) -> None:
        """An event of a group, to its handler (``run.logs``: ``run_logs``).
        Not through ``dispatch``: Channels' closes stale database
        connections first, a hop to a thread for every event and follower,
        and these handlers read the database only in threads of their own."""
        handler = getattr(self, get_handler_name(event), None)
        if handler is None:
            raise ValueError(f"no handler for event type {event['type']}")
        await handler(event)

    async def leave_groups(self) -> None:
        groups, self._groups = self._groups, ()
        if self._inbox is not None:
            for group in groups:
                await fanout.leave(group, self._inbox)

    async def _event_failed(self, error: BaseException) -> None:
        """A handler raised: as when a consumer's handler raises, the socket
        ends (1011); the client reconnects and reads the backlog."""
        logger.error("a follower's event handler failed; closing its socket", exc_info=error)
        await self.leave_groups()
        await self.close(code=1011)

    async def on_tick(self) -> None:
        """Called by the watch after each successful re-check."""

    async def _ticked(self) -> None:
        """Still open and allowed: the socket's slot lives on, then ``on_tick``."""
        if self._slot and self.credentials is not None:
            await _off_loop(socket_slot_renew)(
                user_id=self.credentials.user.pk, slot=self._slot, lifetime=slot_lifetime()
            )
        await self.on_tick()

    async def disconnect(self, code: int) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._slot and self.credentials is not None:
            slot, self._slot = self._slot, ""
            await _off_loop(socket_slot_release)(user_id=self.credentials.user.pk, slot=slot)
        await self.leave_groups()
        if self._inbox is not None:
            self._inbox.close()

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False) -> None:
        if not self._closed:  # events queued before a close are dropped, not sent after it
            await super().send(text_data=text_data, bytes_data=bytes_data, close=close)

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        if not self._closed:
            self._closed = True
            await super().close(code=code, reason=reason)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        return  # followers only listen


class RunFollowConsumer(_MemberConsumer):
    """Handlers and catch-ups run one at a time (``_lock``): each reads and
    advances ``sent`` across its sends."""

    run_id: str | None = None
    _stall_catch_up: asyncio.Task[None] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = asyncio.Lock()
        self._last_run: dict[str, Any] | None = None
        self._last_send = 0.0

    async def dispatch(self, message: dict[str, Any]) -> None:
        async with self._lock:
            await super().dispatch(message)

    async def relayed(self, event: dict[str, Any]) -> None:
        async with self._lock:
            await super().relayed(event)

    async def connect(self) -> None:
        """Admitted, join the run's group, then read the run and each job's
        first page of backlog in one call to a thread (the run read after
        the join: a change published in between is in it, or comes after)."""
        admission = await self.member_of_workspace(run_ref=self.scope["url_route"]["kwargs"]["run"])
        if admission is None:
            return
        if admission.run_id is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        assert admission.membership is not None
        self.run_id = admission.run_id
        self.workspace = admission.membership.workspace
        self.sent: dict[str, int] = {}
        if not await self.follow(run_group(self.run_id)):
            return
        after_seq, job_after = _after_seq(self.scope), _job_after(self.scope)
        opening = await connect_read(_opening, self.workspace, self.run_id, after_seq, job_after)
        if opening is None:  # deleted meanwhile
            await self.close(code=CLOSE_NOT_FOUND)
            return
        run, pages = opening
        await self.send_json({"type": "run", "run": run})
        for job in run["jobs"]:
            page, more = pages[job["id"]]
            self.sent[job["id"]] = page[-1][0] if page else job_after.get(job["id"], after_seq)
            for frame in follower_frames(job["id"], page):
                await self.send_json(frame)
            if more:
                await self._send_stored(job["id"])

    async def disconnect(self, code: int) -> None:
        await super().disconnect(code)
        if self._stall_catch_up is not None:
            self._stall_catch_up.cancel()

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False) -> None:
        started = time.monotonic()
        await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        self._last_send = time.monotonic()
        if self._last_send - started > STALLED_SEND_SECONDS and self._stall_catch_up is None:
            self._stall_catch_up = asyncio.create_task(self._catch_up_when_quiet())

    async def send_json(self, content: Any, close: bool = False) -> None:
        if content.get("type") == "run":
            self._last_run = content["run"]
        await super().send_json(content, close=close)

    async def on_tick(self) -> None:
        if self._lock.locked():
            return  # a handler is sending (events flow), or waits on a stalled socket: next time
        async with self._lock:
            await self._catch_up()

    async def run_logs(self, event: dict[str, Any]) -> None:
        """Published lines ``first_seq..last_seq``: send the ready-made frame
        when it continues what this follower has; fill a gap (an event lost
        by the channel layer) from storage first; trim an overlap."""
        job, first, last = event["job"], event["first_seq"], event["last_seq"]
        sent = self.sent.get(job, 0)
        if last <= sent:
            return
        if first > sent + 1:
            await self._send_stored(job, until=first - 1)
            sent = self.sent[job]
        if first >= sent + 1:  # it continues (or storage had no lines for the gap: they are not made up)
            await self.send(text_data=event["frame"])
        else:  # an overlap (rare): the frame's lines after ``sent``
            frame = json.loads(event["frame"])
            lines = chunk_lines(frame["streams"], frame["times"], frame["text"])[sent + 1 - first :]
            streams, times, text = chunk_fields(lines)
            await self.send_json(follower_frame(job, sent + 1, streams, times, text))
        self.sent[job] = last

    async def run_status(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "run", "run": event["run"]})

    async def _catch_up_when_quiet(self) -> None:
        """After a stalled send: the channel layer may have dropped the newest
        events while this follower did not read; once it is quiet, send them from storage."""
        while time.monotonic() - self._last_send < CATCH_UP_IDLE_SECONDS:
            await asyncio.sleep(CATCH_UP_IDLE_SECONDS)
        self._stall_catch_up = None  # a stall during the catch-up schedules another one
        try:
            async with self._lock:
                await self._catch_up()
        except Exception:  # the socket went away meanwhile; a reconnect reads the backlog
            logger.info("a follower's catch-up after a stall failed", exc_info=True)

    async def _catch_up(self) -> None:
        """The run's state, if it changed unseen, and the stored lines not sent yet."""
        if self.run_id is None or self._closed:
            return
        run = await off_shared_thread(_run_for)(self.workspace, self.run_id)
        if run is None:
            return
        if run != self._last_run:
            await self.send_json({"type": "run", "run": run})
        for job in run["jobs"]:
            if job["last_seq"] > self.sent.get(job["id"], 0):
                await self._send_stored(job["id"])

    async def _send_stored(self, job: str, until: int | None = None) -> None:
        """Stored lines after what was sent (up to ``until``), in pages."""
        self.sent.setdefault(job, 0)
        while until is None or self.sent[job] < until:
            page, more = await off_shared_thread(_lines)(job, self.sent[job], until)
            if not page:
                return
            self.sent[job] = page[-1][0]
            for frame in follower_frames(job, page):
                await self.send_json(frame)
            if not more:
                return


class WorkspaceRunsConsumer(_MemberConsumer):
    """/ws/v1/workspaces/<ws>/runs/: every status change of the workspace's runs."""

    async def connect(self) -> None:
        membership = await self.member_of_workspace()
        if membership is None:
            return
        assert membership.membership is not None
        if not await self.follow(workspace_group(membership.membership.workspace_id)):
            return
        await self.send_json({"type": "ready"})

    async def run_status(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "run", "run": event["run"]})


_CONNECT_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


async def connect_read(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread (``off_shared_thread``), at most
    ``CONNECT_READS_AT_ONCE`` of them at once in this process (its loop)."""
    loop = asyncio.get_running_loop()
    gate = _CONNECT_GATES.get(loop)
    if gate is None:
        gate = _CONNECT_GATES[loop] = asyncio.Semaphore(CONNECT_READS_AT_ONCE)
    async with gate:
        return await off_shared_thread(fn)(*args)


def slot_lifetime() -> float:
    """A socket's slot outlives ``SLOT_RENEWALS`` missed re-checks, no more."""
    return SLOT_RENEWALS * interval()


def sockets_reason(limit: int) -> str:
    return f"too many open websockets: at most {limit} per user (TRAINYARD_WS_PER_USER); close one and retry"


def _off_loop(fn: Callable[..., T]) -> Callable[..., Any]:
    # One Redis round trip of the sync client, never on the event loop nor the shared database thread.
    return sync_to_async(fn, thread_sensitive=False)


def _user(scope: dict[str, Any]) -> tuple[User | None, str | None]:
    """The caller and its API token (None: signed in with the session cookie)."""
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            token = token_from_header(value.decode("latin-1"))
            return (user_for_token(token=token), token) if token else (None, None)
    user = scope.get("user")
    # The GitHub backend's get_user does not check is_active: deactivated is signed out here too.
    return (user if isinstance(user, User) and user.is_active else None), None


@dataclass(frozen=True)
class Admission:
    """What ``_admit`` found: a refusal, or the caller, its membership and the run's id."""

    refusal: Refusal | None = None
    user: User | None = None
    token: str | None = None
    membership: Membership | None = None
    run_id: str | None = None
    sockets_limit: int | None = None  # set: the user has that many sockets open already
    slot: str = ""


def _admit(scope: dict[str, Any], slug: str, run_ref: str | None) -> Admission:
    """The connect rate limits (per address, then per user), the caller, its
    membership of ``slug`` and the id of the run ``run_ref`` there."""
    refusal = rate_hit(scope="ws", kind="ip", identity=scope_ip(scope))
    if refusal is not None:
        return Admission(refusal=refusal)
    user, token = _user(scope)
    if user is None:
        return Admission()
    refusal = rate_hit(scope="ws", kind="user", identity=f"user:{user.pk}")
    if refusal is not None:
        return Admission(refusal=refusal)
    membership = membership_get(user=user, workspace_slug=slug)
    if membership is None:
        return Admission(user=user, token=token)
    run_id = None
    if run_ref is not None:
        found = run_by_ref(workspace=membership.workspace, ref=run_ref).values_list("id", flat=True).first()
        if found is None:
            return Admission(user=user, token=token, membership=membership)
        run_id = str(found)
    slot = uuid.uuid4().hex
    limit = socket_slot_take(user_id=user.pk, slot=slot, lifetime=slot_lifetime())
    if limit is not None:
        return Admission(user=user, token=token, membership=membership, sockets_limit=limit)
    return Admission(user=user, token=token, membership=membership, run_id=run_id, slot=slot)


def _opening(
    workspace: Workspace, run_id: str, after_seq: int, job_after: dict[str, int]
) -> tuple[dict[str, Any], dict[str, tuple[list[tuple[int, float, str, str]], bool]]] | None:
    """The run as shown and each job's first page of lines after its start
    (``job_after``'s seq, else ``after_seq``). A job whose stored lines end
    there (its ``last_seq``, read with the run) is not read: a follower of a
    run just submitted, ``trainyard run``'s, waits for no query. What is
    stored after the run's read was published after the join: it comes."""
    run = _run_for(workspace, run_id)
    if run is None:
        return None
    pages = {}
    for job in run["jobs"]:
        start = job_after.get(job["id"], after_seq)
        pages[job["id"]] = _lines(job["id"], start) if job["last_seq"] > start else ([], False)
    return run, pages


def _run_for(workspace: Workspace, ref: str) -> dict[str, Any] | None:
    """The run as the API shows it, in one query: every follower reads it
    when it connects and at each re-check."""
    return run_shown(run_by_ref(workspace=workspace, ref=ref))


def _lines(job_id: str, after_seq: int, until: int | None = None) -> tuple[list[tuple[int, float, str, str]], bool]:
    """A page of stored lines (at most BACKLOG_PAGE lines and LOG_PAGE_BYTES) and whether more follow."""
    from django.conf import settings

    from backend.runs.models import Job

    job = Job.objects.get(pk=job_id)
    max_bytes = settings.TRAINYARD["LOG_PAGE_BYTES"]
    page = job_log_page(job=job, after_seq=after_seq, limit=BACKLOG_PAGE, max_bytes=max_bytes, until=until)
    return list(page.lines), page.has_more


def _job_after(scope: dict[str, Any]) -> dict[str, int]:
    """``job_after=<job id>:<seq>`` (repeated): where each job's backlog
    starts instead of ``after_seq``. The dashboard reads a long log's older
    lines through the pages, so it asks the socket only for each job's new
    ones. A malformed value is ignored, as a bad ``after_seq`` is."""
    found: dict[str, int] = {}
    for value in parse_qs(scope.get("query_string", b"").decode()).get("job_after", []):
        job, _, seq = value.rpartition(":")
        if job and seq.isdigit():
            found[job] = int(seq)
    return found


def _after_seq(scope: dict[str, Any]) -> int:
    values = parse_qs(scope.get("query_string", b"").decode()).get("after_seq", ["0"])
    try:
        return max(0, int(values[0]))
    except ValueError:
        return 0
