"""/ws/v1/workspaces/<ws>/runs/<run>/: a run's status and log lines, live.

Join the run's group first, then send the stored backlog, then forward
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
from typing import Any
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from trainyard_runner.protocol import chunk_fields, chunk_lines

from backend.accounts.auth import token_from_header
from backend.accounts.models import Membership, User, Workspace
from backend.accounts.selectors import membership_get, user_for_token
from backend.runs.api.serializers import run_to_dict
from backend.runs.consumers.limits import CLOSE_RATE_LIMITED, close_reason, connect_hit, scope_ip
from backend.runs.consumers.threads import off_shared_thread
from backend.runs.consumers.watch import Credentials, watch
from backend.runs.events import run_group, workspace_group
from backend.runs.selectors import job_log_page, run_get
from backend.runs.services.logs import follower_frame, follower_frames

logger = logging.getLogger(__name__)

BACKLOG_PAGE = 5000
# A send that waited this long means the follower stopped reading: events may be lost.
STALLED_SEND_SECONDS = 1.0
# Catch up from storage once nothing was sent for this long after a stall.
CATCH_UP_IDLE_SECONDS = 1.0
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404


class _MemberConsumer(AsyncJsonWebsocketConsumer):
    """Accepts, then closes 4429 over a connect rate limit (per address, then
    per user), 4401 without credentials and 4404 for a workspace the caller
    is not a member of (the same answer as for one that does not exist).
    Once following, ``watch`` re-checks both (consumers/watch.py)."""

    credentials: Credentials | None = None
    _watch: asyncio.Task[None] | None = None
    _closed = False

    async def member_of_workspace(self) -> Membership | None:
        refusal = await connect_hit(scope="ws", kind="ip", identity=scope_ip(self.scope))
        await self.accept()
        user, token = await off_shared_thread(_user)(self.scope) if refusal is None else (None, None)
        if refusal is None and user is not None:
            refusal = await connect_hit(scope="ws", kind="user", identity=f"user:{user.pk}")
        if refusal is not None:
            await self.close(code=CLOSE_RATE_LIMITED, reason=close_reason(refusal))
            return None
        if user is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return None
        slug = self.scope["url_route"]["kwargs"]["workspace"]
        membership = await off_shared_thread(membership_get)(user=user, workspace_slug=slug)
        if membership is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return None
        session = self.scope.get("session")
        session_key = None if token is not None or session is None else session.session_key
        self.credentials = Credentials(user=user, token=token, session_key=session_key, workspace_slug=slug)
        return membership

    async def follow(self, group: str) -> None:
        """Join ``group`` and keep access and membership checked (consumers/watch.py)."""
        await self.channel_layer.group_add(group, self.channel_name)
        assert self.credentials is not None
        self._watch = asyncio.create_task(watch(self, self.credentials, [group], on_tick=self.on_tick))

    async def on_tick(self) -> None:
        """Called by the watch after each successful re-check."""

    async def disconnect(self, code: int) -> None:
        if self._watch is not None:
            self._watch.cancel()

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

    async def connect(self) -> None:
        membership = await self.member_of_workspace()
        if membership is None:
            return
        ref = self.scope["url_route"]["kwargs"]["run"]
        found = await off_shared_thread(_run_for)(membership.workspace, ref)
        if found is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.run_id = found["id"]
        self.workspace = membership.workspace
        self.sent: dict[str, int] = {}
        await self.follow(run_group(self.run_id))
        await self.send_json({"type": "run", "run": found})
        await self._send_backlog(found, _after_seq(self.scope), _job_after(self.scope))

    async def disconnect(self, code: int) -> None:
        await super().disconnect(code)
        if self._stall_catch_up is not None:
            self._stall_catch_up.cancel()
        if self.run_id:
            await self.channel_layer.group_discard(run_group(self.run_id), self.channel_name)

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
        if first == sent + 1:
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

    async def _send_backlog(self, run: dict[str, Any], after_seq: int, job_after: dict[str, int]) -> None:
        for job in run["jobs"]:
            self.sent.setdefault(job["id"], job_after.get(job["id"], after_seq))
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

    group: str | None = None

    async def connect(self) -> None:
        membership = await self.member_of_workspace()
        if membership is None:
            return
        self.group = workspace_group(membership.workspace_id)
        await self.follow(self.group)
        await self.send_json({"type": "ready"})

    async def disconnect(self, code: int) -> None:
        await super().disconnect(code)
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def run_status(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "run", "run": event["run"]})


def _user(scope: dict[str, Any]) -> tuple[User | None, str | None]:
    """The caller and its API token (None: signed in with the session cookie)."""
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            token = token_from_header(value.decode("latin-1"))
            return (user_for_token(token=token), token) if token else (None, None)
    user = scope.get("user")
    # The GitHub backend's get_user does not check is_active: deactivated is signed out here too.
    return (user if isinstance(user, User) and user.is_active else None), None


def _run_for(workspace: Workspace, ref: str) -> dict[str, Any] | None:
    run = run_get(workspace=workspace, ref=ref)
    return run_to_dict(run) if run is not None else None


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
