"""/ws/v1/workspaces/<ws>/runs/<run>/: a run's status and log lines, live.

Join the run's group first, then send the stored backlog, then forward
published lines; ``sent`` (the highest seq sent per job) drops the lines that
arrive both ways, so every line goes out once and in order.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from backend.accounts.auth import token_from_header
from backend.accounts.models import Membership, Workspace
from backend.accounts.selectors import membership_get, user_for_token
from backend.runs.api.serializers import run_to_dict
from backend.runs.events import run_group, workspace_group
from backend.runs.selectors import job_log_lines, run_get

BACKLOG_PAGE = 5000
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404


class _MemberConsumer(AsyncJsonWebsocketConsumer):
    """Accepts, then closes 4401 without credentials and 4404 for a workspace
    the caller is not a member of (the same answer as for one that does not
    exist)."""

    async def member_of_workspace(self) -> Membership | None:
        await self.accept()
        user = await database_sync_to_async(_user)(self.scope)
        if user is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return None
        slug = self.scope["url_route"]["kwargs"]["workspace"]
        membership = await database_sync_to_async(membership_get)(user=user, workspace_slug=slug)
        if membership is None:
            await self.close(code=CLOSE_NOT_FOUND)
        return membership

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        return  # followers only listen


class RunFollowConsumer(_MemberConsumer):
    run_id: str | None = None

    async def connect(self) -> None:
        membership = await self.member_of_workspace()
        if membership is None:
            return
        ref = self.scope["url_route"]["kwargs"]["run"]
        found = await database_sync_to_async(_run_for)(membership.workspace, ref)
        if found is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.run_id = found["id"]
        self.sent: dict[str, int] = {}
        await self.channel_layer.group_add(run_group(self.run_id), self.channel_name)
        await self.send_json({"type": "run", "run": found})
        await self._send_backlog(found, _after_seq(self.scope))

    async def disconnect(self, code: int) -> None:
        if self.run_id:
            await self.channel_layer.group_discard(run_group(self.run_id), self.channel_name)

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
        else:
            lines = [line for line in json.loads(event["frame"])["lines"] if line[0] > sent]
            await self.send_json({"type": "logs", "job": job, "lines": lines})
        self.sent[job] = last

    async def run_status(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "run", "run": event["run"]})

    async def _send_backlog(self, run: dict[str, Any], after_seq: int) -> None:
        for job in run["jobs"]:
            self.sent.setdefault(job["id"], after_seq)
            await self._send_stored(job["id"])

    async def _send_stored(self, job: str, until: int | None = None) -> None:
        """Stored lines after what was sent (up to ``until``), in pages."""
        self.sent.setdefault(job, 0)
        while until is None or self.sent[job] < until:
            page = await database_sync_to_async(_lines)(job, self.sent[job], until)
            if not page:
                return
            self.sent[job] = page[-1][0]
            await self.send_json({"type": "logs", "job": job, "lines": page})
            if len(page) < BACKLOG_PAGE:
                return


class WorkspaceRunsConsumer(_MemberConsumer):
    """/ws/v1/workspaces/<ws>/runs/: every status change of the workspace's runs."""

    group: str | None = None

    async def connect(self) -> None:
        membership = await self.member_of_workspace()
        if membership is None:
            return
        self.group = workspace_group(membership.workspace_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.send_json({"type": "ready"})

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def run_status(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "run", "run": event["run"]})


def _user(scope: dict[str, Any]) -> Any:
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            token = token_from_header(value.decode("latin-1"))
            return user_for_token(token=token) if token else None
    user = scope.get("user")
    return user if user is not None and user.is_authenticated else None


def _run_for(workspace: Workspace, ref: str) -> dict[str, Any] | None:
    run = run_get(workspace=workspace, ref=ref)
    return run_to_dict(run) if run is not None else None


def _lines(job_id: str, after_seq: int, until: int | None = None) -> list[list[Any]]:
    from backend.runs.models import Job

    job = Job.objects.get(pk=job_id)
    limit = BACKLOG_PAGE if until is None else min(BACKLOG_PAGE, until - after_seq)
    return [list(row) for row in job_log_lines(job=job, after_seq=after_seq, limit=limit)]


def _after_seq(scope: dict[str, Any]) -> int:
    values = parse_qs(scope.get("query_string", b"").decode()).get("after_seq", ["0"])
    try:
        return max(0, int(values[0]))
    except ValueError:
        return 0
