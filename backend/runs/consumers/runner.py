"""/ws/runner/: one websocket per runner (protocol in trainyard_runner.protocol).

Thin: authenticate, validate each frame, call one service, answer. Messages
for the runner from other processes (assignments, cancels) arrive through the
channel layer as ``runner.frame`` events addressed to this consumer's
channel name, which the instance row records.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from pydantic import ValidationError
from trainyard_runner import protocol

from backend.accounts.auth import token_from_header
from backend.clouds.services import (
    instance_connect,
    instance_disconnect,
    instance_for_token,
    instance_heartbeat,
    instance_job_done,
)
from backend.runs.events import run_group
from backend.runs.models import JobStatus
from backend.runs.services.logs import PreparedLogs, StoredLogs, UnknownJob, logs_prepare, logs_store
from backend.runs.services.transitions import job_accept, job_finish, job_release, job_set_reason

logger = logging.getLogger(__name__)

FINAL_STATES = {"succeeded": JobStatus.SUCCEEDED, "failed": JobStatus.FAILED, "stopped": JobStatus.STOPPED}
PROGRESS = {
    "preparing": "preparing the code",
    "running": "the commands are running",
    "uploading": "uploading artifacts",
}


# A coalesced store holds at most this many lines (several frames' worth).
MAX_STORE_LINES = 20_000


class RunnerConsumer(AsyncWebsocketConsumer):
    """Log frames are stored by one writer task per connection, in order:
    receiving and validating the next frames overlaps with storing the
    previous ones, and frames queued meanwhile are stored together (one
    transaction, one COPY, one publish, one ack)."""

    instance_id: str | None = None
    _writer: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        await self.accept()
        token = token_from_header(_header(self.scope, b"authorization"))
        instance = await database_sync_to_async(instance_for_token)(token=token) if token else None
        if instance is None:
            await self.close(code=protocol.CLOSE_UNAUTHORIZED)
            return
        self.pending_instance_id = str(instance.pk)

    async def disconnect(self, code: int) -> None:
        if self._writer is not None:
            self._writer.cancel()
        if self.instance_id:
            await database_sync_to_async(instance_disconnect)(
                instance_id=self.instance_id, channel_name=self.channel_name
            )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = protocol.runner_message.validate_json(text_data or bytes_data or b"")
        except ValidationError as exc:
            logger.warning("runner sent a bad frame: %s", exc.errors()[:1])
            await self.close(code=protocol.CLOSE_BAD_MESSAGE)
            return
        if self.instance_id is None and not isinstance(message, protocol.Hello):
            await self.close(code=protocol.CLOSE_BAD_MESSAGE)
            return
        await getattr(self, f"on_{message.type}")(message)

    # ---------------------------------------------------------------- frames

    async def on_hello(self, hello: protocol.Hello) -> None:
        if hello.protocol != protocol.PROTOCOL_VERSION:
            await self.close(code=protocol.CLOSE_VERSION_MISMATCH)
            return
        connected = await database_sync_to_async(instance_connect)(
            instance_id=self.pending_instance_id,
            hello=hello,
            channel_name=self.channel_name,
            heartbeat_seconds=settings.TRAINYARD["HEARTBEAT_SECONDS"],
        )
        self.instance_id = str(connected.instance.pk)
        if connected.previous_channel and connected.previous_channel != self.channel_name:
            await self.channel_layer.send(connected.previous_channel, {"type": "runner.replaced"})
        await self.send(text_data=connected.welcome.model_dump_json())
        await _enqueue_schedule()

    async def on_heartbeat(self, message: protocol.Heartbeat) -> None:
        await database_sync_to_async(instance_heartbeat)(instance_id=self.instance_id)

    async def on_job_accepted(self, message: protocol.JobAccepted) -> None:
        ok = await database_sync_to_async(job_accept)(
            job_id=message.job, instance_id=self.instance_id, lease=message.lease
        )
        if not ok:
            cancel = protocol.CancelJob(
                job=message.job, reason="this runner no longer holds the job (lease expired or stopped)"
            )
            await self.send(text_data=cancel.model_dump_json())
            return
        await _enqueue_schedule()  # jobs waiting for this one to be running (workers of a master)

    async def on_job_rejected(self, message: protocol.JobRejected) -> None:
        await database_sync_to_async(job_release)(
            job_id=message.job,
            reason=f"a runner refused it: {message.reason}",
            instance_id=self.instance_id,
            lease=message.lease,
        )
        await _enqueue_schedule()

    async def on_job_state(self, message: protocol.JobState) -> None:
        final = FINAL_STATES.get(message.state)
        if final is None:
            reason = message.reason or PROGRESS[message.state]
            await database_sync_to_async(job_set_reason)(
                job_id=message.job, instance_id=self.instance_id, reason=reason
            )
            return
        await database_sync_to_async(_finish)(self.instance_id, message, final)
        await _enqueue_schedule()

    async def on_logs(self, message: protocol.Logs) -> None:
        # The runner's window (a few frames in flight) bounds this queue.
        if self._writer is None:
            self._log_queue: asyncio.Queue[protocol.Logs] = asyncio.Queue()
            self._writer = asyncio.create_task(self._write_logs())
        self._log_queue.put_nowait(message)

    async def _write_logs(self) -> None:
        """Two stages: batch N+1 is prepared (pure CPU, another thread) while
        batch N is in the database; stores stay strictly in order."""
        storing: asyncio.Task[None] | None = None
        try:
            while True:
                job, first_seq, lines = _coalesce(await self._log_queue.get(), self._log_queue)
                prepared = await sync_to_async(logs_prepare, thread_sensitive=False)(
                    job_id=job, first_seq=first_seq, lines=lines
                )
                if storing is not None:
                    await storing
                storing = asyncio.create_task(self._store(prepared))
        except asyncio.CancelledError:
            if storing is not None:
                storing.cancel()
            raise
        except Exception:
            logger.exception("storing logs failed; closing the runner's connection so it resends")
            await self.close(code=1011)

    async def _store(self, prepared: PreparedLogs) -> None:
        job, first_seq, lines = prepared.job_id, prepared.first_seq, prepared.lines
        try:
            stored = await database_sync_to_async(logs_store)(
                job_id=job, instance_id=self.instance_id, first_seq=first_seq, lines=lines, prepared=prepared
            )
        except UnknownJob:
            # Not this runner's job (any more): acknowledge so it stops resending.
            ack = protocol.LogAck(job=job, seq=first_seq + len(lines) - 1)
            await self.send(text_data=ack.model_dump_json())
            return
        if stored.new_lines:
            await self.channel_layer.group_send(run_group(stored.run_id), _follower_event(stored))
        await self.send(text_data=protocol.LogAck(job=job, seq=stored.last_seq).model_dump_json())

    # ------------------------------------------------------- channel events

    async def runner_frame(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["frame"])

    async def runner_drop(self, event: dict[str, Any]) -> None:
        # 1012 "service restart": the runner reconnects and resends.
        await self.close(code=1012)

    async def runner_replaced(self, event: dict[str, Any]) -> None:
        self.instance_id = None  # the new connection owns the instance now
        await self.close(code=protocol.CLOSE_REPLACED)


def _coalesce(first: protocol.Logs, queue: asyncio.Queue[protocol.Logs]) -> tuple[str, int, list[protocol.LogLineWire]]:
    """The first queued frame, extended by the queued frames that continue it."""
    lines = list(first.lines)
    while not queue.empty() and len(lines) < MAX_STORE_LINES:
        following = queue._queue[0]  # type: ignore[attr-defined]  # peek: asyncio.Queue has no peek
        if following.job != first.job or following.first_seq != first.first_seq + len(lines):
            break
        lines += queue.get_nowait().lines
    return first.job, first.first_seq, lines


def _follower_event(stored: StoredLogs) -> dict[str, Any]:
    first = stored.first_new_seq
    return {
        "type": "run.logs",
        "job": stored.job_id,
        "first_seq": first,
        "last_seq": first + len(stored.new_lines) - 1,
        "frame": stored.frame,
    }


def _finish(instance_id: str, message: protocol.JobState, status: JobStatus) -> None:
    reason = message.reason
    if status == JobStatus.FAILED and not reason and message.exit_code is not None:
        reason = f"exited with code {message.exit_code}"
    job_finish(job_id=message.job, status=status, exit_code=message.exit_code, reason=reason, instance_id=instance_id)
    instance_job_done(instance_id=instance_id)


async def _enqueue_schedule() -> None:
    from backend.runs.tasks import schedule

    await database_sync_to_async(schedule.delay)()


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""
