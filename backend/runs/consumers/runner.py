"""/ws/runner/: one websocket per runner (protocol in trainyard_runner.protocol).

Thin: authenticate, validate each frame, call one service, answer. Messages
for the runner from other processes (assignments, cancels) arrive through the
channel layer as ``runner.frame`` events addressed to this consumer's
channel name, which the instance row records.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import connections
from pydantic import ValidationError
from trainyard_runner import protocol

from backend.accounts.auth import token_from_header
from backend.clouds.services.instances import (
    instance_bootstrap_exchange,
    instance_disconnected,
    instance_for_bootstrap_token,
    instance_for_token,
    instance_heartbeat,
    instance_refusal,
)
from backend.core.testhooks import file_hook_fires
from backend.runs.consumers.limits import close_reason, connect_hit, connect_over, scope_ip
from backend.runs.consumers.threads import off_shared_thread
from backend.runs.events import publish_runs, publishing_held, run_group
from backend.runs.lifecycle.transitions import (
    attempt_end,
    job_accept,
    job_awaited_running,
    job_report_final,
    job_set_reason,
)
from backend.runs.models import Attempt
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.handover import instance_assign_next
from backend.runs.services.environments import environment_record
from backend.runs.services.loglimits import logs_check
from backend.runs.services.logs import StoredLogs, UnknownJob, logs_prepare, logs_store
from backend.runs.services.runners import runner_connect
from backend.runs.wakeups import schedule_request

logger = logging.getLogger(__name__)

FINAL_STATES = {"succeeded", "failed", "stopped", "interrupted"}
# Log frames queued on one connection before it is closed (the runner keeps
# at most logstream.WINDOW = 10 unacknowledged).
MAX_QUEUED_LOG_FRAMES = 64
# Stored batches waiting for their publish before the writer waits too.
MAX_UNPUBLISHED = 4
STALE = "this attempt is not the job's current one on this runner (it was moved, stopped or fenced)"
PROGRESS = {
    "preparing": "preparing the code",
    "running": "the commands are running",
    "uploading": "uploading artifacts",
}


# A coalesced store holds at most this many lines (several frames' worth).
MAX_STORE_LINES = 40_000


class RunnerConsumer(AsyncWebsocketConsumer):
    """Log frames are stored by one writer task per connection, in order, in
    a thread of the connection's own (``_logs_thread``): receiving and
    validating the next frames overlaps with storing the previous ones,
    frames queued meanwhile are stored together (one transaction, one COPY,
    one ack), and one runner's logs neither wait for nor hold up another's
    or the shared database thread. A batch is acknowledged as soon as it is
    stored; a publisher task sends it to the followers in order meanwhile,
    so the next store does not wait for the publish."""

    instance_id: str | None = None
    pending_instance_id: str | None = None  # the token's instance, until its hello is accepted
    _bootstrap_token = ""  # set when the runner came with its machine's single-use token
    _writer: asyncio.Task[None] | None = None
    _logs_thread: ThreadPoolExecutor | None = None
    _publisher: asyncio.Task[None] | None = None
    _state_worker: asyncio.Task[None] | None = None
    _refused_attempts: set[tuple[str, int]] = set()  # replaced per connection in connect()

    async def connect(self) -> None:
        """Rate limits: per runner (its instance), and per address only for
        connects whose token was refused, so many runners behind one NAT are
        never limited by each other (docs/decisions/0038-rate-limits.md)."""
        self._refused_attempts = set()
        ip = scope_ip(self.scope)
        # Read before the accept, so the token is looked up right after it, as before.
        refusal = await connect_over(scope="runner", kind="ip", identity=ip)
        await self.accept()
        if refusal is not None:
            await self.close(code=protocol.CLOSE_RATE_LIMITED, reason=close_reason(refusal))
            return
        token = token_from_header(_header(self.scope, b"authorization"))
        # The connect's lookups stay in the shared thread (not off_shared_thread): queued
        # there right after the accept, they come before anything queued later.
        instance = await database_sync_to_async(instance_for_token)(token=token) if token else None
        if instance is None and token:
            instance = await database_sync_to_async(instance_for_bootstrap_token)(token=token)
            self._bootstrap_token = token if instance is not None else ""
        if instance is None:
            await connect_hit(scope="runner", kind="ip", identity=ip)
            # A revoked runner is told so, and stops (4401 is fatal to it).
            reason = await database_sync_to_async(instance_refusal)(token=token) if token else ""
            await self.close(code=protocol.CLOSE_UNAUTHORIZED, reason=reason[:120])
            return
        if refusal := await connect_hit(scope="runner", kind="user", identity=f"instance:{instance.pk}"):
            await self.close(code=protocol.CLOSE_RATE_LIMITED, reason=close_reason(refusal))
            return
        self.pending_instance_id = str(instance.pk)

    async def disconnect(self, code: int) -> None:
        if self._writer is not None:
            self._writer.cancel()
        if self._logs_thread is not None:
            self._logs_thread.submit(connections.close_all)  # after a store under way: the thread's connection
            self._logs_thread.shutdown(wait=False)
        if self._publisher is not None:
            self._published.put_nowait(None)  # what is stored still reaches the followers, then it ends
        if self._state_worker is not None:
            self._states.put_nowait(None)  # the states received are still handled (a final one is sent once)
        if self.instance_id:
            await off_shared_thread(instance_disconnected)(instance_id=self.instance_id, channel_name=self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = protocol.runner_message.validate_json(text_data or bytes_data or b"")
        except ValidationError as exc:
            theirs = _hello_protocol(text_data or bytes_data or b"") if self.instance_id is None else None
            if theirs is not None and theirs != protocol.PROTOCOL_VERSION:
                # Another version's hello need not validate as ours: say what to upgrade.
                await self.close(code=protocol.CLOSE_VERSION_MISMATCH, reason=_version_advice(theirs))
                return
            logger.warning("runner sent a bad frame: %s", exc.errors()[:1])
            await self.close(code=protocol.CLOSE_BAD_MESSAGE)
            return
        if self.instance_id is None and not isinstance(message, protocol.Hello):
            await self.close(code=protocol.CLOSE_BAD_MESSAGE)
            return
        await getattr(self, f"on_{message.type}")(message)

    # ---------------------------------------------------------------- frames

    async def on_hello(self, hello: protocol.Hello) -> None:
        if self.pending_instance_id is None:  # refused at connect; a frame that was already on its way
            return
        if hello.protocol != protocol.PROTOCOL_VERSION:
            await self.close(code=protocol.CLOSE_VERSION_MISMATCH, reason=_version_advice(hello.protocol))
            return
        own_token = ""
        if self._bootstrap_token:
            # Spent now, whatever follows: a second hello with it is refused.
            own_token = (
                await off_shared_thread(instance_bootstrap_exchange)(
                    instance_id=self.pending_instance_id, token=self._bootstrap_token
                )
                or ""
            )
            self._bootstrap_token = ""
            if not own_token:
                await self.close(code=protocol.CLOSE_UNAUTHORIZED, reason="bootstrap token already used")
                return
        connected = await off_shared_thread(runner_connect)(
            instance_id=self.pending_instance_id,
            hello=hello,
            channel_name=self.channel_name,
            heartbeat_seconds=settings.TRAINYARD["HEARTBEAT_SECONDS"],
        )
        if connected.instance is None or connected.welcome is None:
            logger.warning("refusing a runner's hello: %s", connected.refusal)
            await self.close(code=protocol.CLOSE_FENCED, reason=connected.refusal[:120])
            return
        self.instance_id = str(connected.instance.pk)
        if connected.previous_channel and connected.previous_channel != self.channel_name:
            await self.channel_layer.send(connected.previous_channel, {"type": "runner.replaced"})
        welcome = connected.welcome.model_copy(update={"token": own_token}) if own_token else connected.welcome
        await self.send(text_data=welcome.model_dump_json())
        await self._take_next_job()
        await _ask_for_a_pass()

    async def on_heartbeat(self, message: protocol.Heartbeat) -> None:
        await off_shared_thread(instance_heartbeat)(instance_id=self.instance_id, busy=message.state == "busy")

    async def on_job_accepted(self, message: protocol.JobAccepted) -> None:
        if _drop_acceptance_for_tests():
            return
        # Off the process's shared database thread: a submission's request
        # still answering there (its plan, its run) must not hold up the
        # confirmation the runner waits for before the commands start.
        ok, changed = await off_shared_thread(_accept)(
            job_id=message.job,
            instance_id=self.instance_id,
            attempt=message.attempt,
            lease=message.lease,
            ports=message.ports,
        )
        if not ok:
            reason = "this runner no longer holds the job (lease expired, stopped or moved)"
            await self._refuse(message.job, message.attempt, reason)
            return
        await self.send(text_data=protocol.JobConfirmed(job=message.job, attempt=message.attempt).model_dump_json())
        # The commands start now; the followers hear of it right after.
        if await off_shared_thread(_accepted)(changed, message.job):
            await _ask_for_a_pass()  # jobs waiting for this one to be running (workers of a master)

    async def on_job_rejected(self, message: protocol.JobRejected) -> None:
        await off_shared_thread(_rejected)(self.instance_id, message)
        await _ask_for_a_pass()

    async def on_job_state(self, message: protocol.JobState) -> None:
        """Progress states (preparing, running, uploading) are handled in order
        by a task of their own (``_handle_states``): their database work and
        publishes take tens of milliseconds, and the log frames that follow
        them on the socket do not wait (the first line of a warm start did,
        ~100 ms). A final state (interrupted included) is handled here, after
        the progress states before it, as before: what follows it on the
        socket is handled knowing it."""
        if message.state in FINAL_STATES:
            if self._state_worker is not None:
                await self._states.join()
            await self._job_state(message, self.instance_id)
            return
        if self._state_worker is None:
            self._states: asyncio.Queue[tuple[protocol.JobState, str | None] | None] = asyncio.Queue()
            self._state_worker = asyncio.create_task(self._handle_states())
        self._states.put_nowait((message, self.instance_id))

    async def _handle_states(self) -> None:
        """Until the connection closed and every state received is handled.
        A progress state that fails is logged: the runner re-sends its jobs'
        latest states after every reconnect."""
        while (item := await self._states.get()) is not None:
            message, instance_id = item
            try:
                await self._job_state(message, instance_id)
            except Exception:
                logger.exception("handling job %s's state %s failed", message.job, message.state)
            finally:
                self._states.task_done()

    async def _job_state(self, message: protocol.JobState, instance_id: str | None) -> None:
        if message.environment is not None:
            await off_shared_thread(environment_record)(
                job_id=message.job, instance_id=instance_id, attempt=message.attempt, report=message.environment
            )
        if message.state not in FINAL_STATES:
            reason = message.reason or PROGRESS[message.state]
            await off_shared_thread(job_set_reason)(
                job_id=message.job, instance_id=instance_id, attempt=message.attempt, reason=reason
            )
            return
        ok = await off_shared_thread(job_report_final)(
            job_id=message.job,
            instance_id=instance_id,
            attempt=message.attempt,
            state=message.state,
            exit_code=message.exit_code,
            reason=message.reason,
            interrupt_at=message.interrupt_at,
        )
        if not ok:
            await self._refuse(message.job, message.attempt, STALE)
            await _ask_for_a_pass()
            return
        if message.state != "interrupted":  # an interrupted runner is not idle: it winds down
            await self._take_next_job()
        if message.log_lines is not None:  # older runners do not say: their logs are not checked
            await off_shared_thread(logs_check)(
                job_id=message.job, attempt=message.attempt, lines=message.log_lines, digest=message.log_digest
            )
        await _ask_for_a_pass()

    async def _take_next_job(self) -> None:
        """The runner is idle (it said hello, or finished a job): it takes the
        oldest pending job it fits now, not after a pass
        (``instance_assign_next``). Should that fail, the pass asked for
        next assigns it."""
        if self.instance_id is None:
            return
        try:
            await off_shared_thread(instance_assign_next)(instance_id=self.instance_id)
        except Exception:
            logger.exception("runner %s: handing it the next job failed; the pass will", self.instance_id)

    async def _refuse(self, job: str, attempt: int, reason: str) -> None:
        await self.send(text_data=protocol.Refused(job=job, attempt=attempt, reason=reason).model_dump_json())

    async def on_logs(self, message: protocol.Logs) -> None:
        if self._refused_attempts and (message.job, message.attempt) in self._refused_attempts:
            return  # already told: the runner drops the attempt when it reads that
        # The runner's window (WINDOW frames in flight) bounds this queue; a
        # runner that does not wait for acks is cut off before it can fill
        # this process's memory.
        if self._writer is None:
            self._log_queue: asyncio.Queue[protocol.Logs] = asyncio.Queue()
            self._published: asyncio.Queue[StoredLogs | None] = asyncio.Queue()
            self._logs_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner-logs")
            self._writer = asyncio.create_task(self._write_logs())
            self._publisher = asyncio.create_task(self._publish_logs())
        if self._log_queue.qsize() >= MAX_QUEUED_LOG_FRAMES:
            logger.warning("runner %s sent %d log frames without waiting for acks: closing", self.instance_id,
                           MAX_QUEUED_LOG_FRAMES)  # fmt: skip
            await self.close(code=protocol.CLOSE_FLOODING)
            return
        self._log_queue.put_nowait(message)

    async def _write_logs(self) -> None:
        """Prepare and store the queued frames, strictly in order. Preparing
        and storing run one after the other in the connection's thread: two
        threads of one process passing the GIL back and forth made every
        database round trip of the store wait (bench/README.md)."""
        store = database_sync_to_async(_store_frame, thread_sensitive=False, executor=self._logs_thread)
        try:
            while True:
                batch = _coalesce(await self._log_queue.get(), self._log_queue)
                try:
                    stored = await store(batch, self.instance_id)
                except UnknownJob:
                    # Not this attempt's job (any more): refused, not "stored", so the
                    # runner stops the attempt instead of believing its lines are kept.
                    self._refused_attempts.add((batch.job, batch.attempt))
                    await self._refuse(batch.job, batch.attempt, STALE)
                    continue
                await self.send(text_data=protocol.LogAck(job=batch.job, seq=stored.last_seq).model_dump_json())
                if stored.count:
                    if self._published.qsize() >= MAX_UNPUBLISHED:
                        await self._published.join()  # the followers' publishes fell behind: store no faster
                    self._published.put_nowait(stored)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("storing logs failed; closing the runner's connection so it resends")
            await self.close(code=1011)

    async def _publish_logs(self) -> None:
        """Send stored batches to the run's followers, in the order they were
        stored. A follower that misses one (this process died first) fills
        the gap from storage (consumers/follow.py)."""
        while (stored := await self._published.get()) is not None:
            try:
                await self.channel_layer.group_send(run_group(stored.run_id), _follower_event(stored))
            except Exception:
                logger.exception("publishing stored logs to followers failed (they catch up from storage)")
            finally:
                self._published.task_done()

    # ------------------------------------------------------- channel events

    async def runner_frame(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["frame"])

    async def runner_drop(self, event: dict[str, Any]) -> None:
        # 1012 "service restart": the runner reconnects and resends.
        await self.close(code=1012)

    async def runner_replaced(self, event: dict[str, Any]) -> None:
        self.instance_id = None  # the new connection owns the instance now
        await self.close(code=protocol.CLOSE_REPLACED)

    async def runner_fenced(self, event: dict[str, Any]) -> None:
        """The instance was declared lost: the runner must stop, not reconnect."""
        self.instance_id = None
        await self.close(code=protocol.CLOSE_FENCED, reason=str(event.get("reason", ""))[:120])


def _coalesce(first: protocol.Logs, queue: asyncio.Queue[protocol.Logs]) -> protocol.Logs:
    """The first queued frame, extended by the queued frames that continue it
    (string joins: no line is visited)."""
    streams, times, texts = [first.streams], list(first.times), [first.text]
    count = len(first.streams)
    while not queue.empty() and count < MAX_STORE_LINES:
        following = queue._queue[0]  # type: ignore[attr-defined]  # peek: asyncio.Queue has no peek
        if (
            following.job != first.job
            or following.attempt != first.attempt
            or following.first_seq != first.first_seq + count
        ):
            break
        queue.get_nowait()
        streams.append(following.streams)
        times += following.times
        texts.append(following.text)
        count += len(following.streams)
    if len(texts) == 1:
        return first
    return first.model_copy(update={"streams": "".join(streams), "times": times, "text": "".join(texts)})


def _store_frame(frame: protocol.Logs, instance_id: str) -> StoredLogs:
    prepared = logs_prepare(
        job_id=frame.job,
        first_seq=frame.first_seq,
        streams=frame.streams,
        times=frame.times,
        text=frame.text,
        attempt=frame.attempt,
    )
    return logs_store(job_id=frame.job, instance_id=instance_id, attempt=frame.attempt, prepared=prepared)


def _follower_event(stored: StoredLogs) -> dict[str, Any]:
    first = stored.first_new_seq
    return {
        "type": "run.logs",
        "job": stored.job_id,
        "first_seq": first,
        "last_seq": first + stored.count - 1,
        "frame": stored.frame,
    }


def _rejected(instance_id: str, message: protocol.JobRejected) -> None:
    attempt = Attempt.objects.current(job_id=message.job, number=message.attempt, instance_id=instance_id).first()
    if attempt is not None and attempt.lease == message.lease:
        attempt_end(
            attempt_id=str(attempt.pk),
            reason=TerminationReason.REJECTED,
            message=f"a runner refused it: {message.reason}",
        )


def _drop_acceptance_for_tests() -> bool:
    """Test hook (TRAINYARD_TEST_DROP_ACCEPTANCES=<file>): each line of the
    file drops one acceptance, as a lost frame would."""
    return file_hook_fires("TEST_DROP_ACCEPTANCES", "dropping a job acceptance")


def _hello_protocol(raw: str | bytes) -> int | None:
    """The ``protocol`` of a hello frame of any version, else None."""
    try:
        frame = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(frame, dict) or frame.get("type") != "hello":
        return None
    version = frame.get("protocol")
    return version if isinstance(version, int) else None


def _version_advice(theirs: int) -> str:
    ours = protocol.PROTOCOL_VERSION
    side = "trainyard-runner" if theirs < ours else "the Trainyard server"
    return f"runner speaks protocol {theirs}, server {ours}: upgrade {side}"


def _accept(**acceptance: Any) -> tuple[bool, set[str]]:
    """``job_accept``, holding back the publishing of the runs it changed:
    (accepted, those runs)."""
    with publishing_held() as changed:
        ok = job_accept(**acceptance)
    return ok, changed


def _accepted(changed: set[str], job_id: str) -> bool:
    """After the confirmation: publish the runs ``_accept`` held back; True
    when a pending job waits for this one to be running."""
    publish_runs(changed)
    return job_awaited_running(job_id=job_id)


async def _ask_for_a_pass() -> None:
    """``schedule_request`` off the database thread: a publish to a broker
    that is down or frozen takes up to a minute to fail (socket timeout ×
    publish retries), and on the database thread it would stall every
    connection of this process, pulse included."""
    await sync_to_async(schedule_request, thread_sensitive=False)()


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""
