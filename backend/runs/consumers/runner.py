"""/ws/runner/: one websocket per runner (protocol in trainyard_runner.protocol).

The consumer authenticates the connection, validates each frame, calls the
one use case of ``services/runner_session.py`` that handles it, and does
what that returns (``Reply``): sends its frames, then its work that must
follow them, then asks for a pass. Log frames go to the connection's
``LogIngest`` (``services/logingest.py``), which stores, acknowledges and
publishes them. Metrics frames go to ``backend.metrics``' ingestion, in
order, by a task of their own, under a rate cap (``FrameCap``). Messages
for the runner from other processes (assignments, cancels) arrive through
the channel layer as ``runner.frame`` events addressed to this consumer's
channel name, which the instance row records.

Where each call runs is chosen here: the connect's token lookups in the
process's shared database thread, queued right after the accept; every
frame's use case off it (``off_shared_thread``), so a request answering
there does not hold up a runner; log frames in the connection's own thread
(``LogIngest``); a pass never in a database thread.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from pydantic import ValidationError
from trainyard_runner import protocol

from backend.accounts.auth import token_from_header
from backend.clouds.services.instances import instance_disconnected, instance_heartbeat
from backend.core.channels import signed, verified
from backend.metrics.services.ingest import FrameCap, record_metrics
from backend.runs.consumers.limits import close_reason, connect_hit, connect_over, scope_ip
from backend.runs.consumers.threads import off_shared_thread
from backend.runs.services.devenvs import dev_environment_active
from backend.runs.services.inorder import InOrder
from backend.runs.services.logingest import MAX_QUEUED_LOG_FRAMES, LogIngest
from backend.runs.services.runner_session import (
    FINAL_STATES,
    Answer,
    Authenticated,
    Reply,
    runner_authenticate,
    runner_hello,
    runner_job_accepted,
    runner_job_rejected,
    runner_job_state,
)
from backend.runs.wakeups import schedule_request

logger = logging.getLogger(__name__)

# Progress states waiting for their turn (``_progress``). A runner sends a
# few per job and waits for nothing; more than this many unhandled is a
# flood, and the connection is closed rather than the queue grown.
MAX_QUEUED_PROGRESS = 64
# Metrics frames waiting to be stored (``_metrics``); past this many a frame
# is dropped and counted (metrics are not acknowledged: the runner goes on).
MAX_QUEUED_METRICS = 16


class RunnerConsumer(AsyncWebsocketConsumer):
    """One runner's connection. Its progress states are handled in order by
    a task of their own (``_progress``): their database work and publishes
    take tens of milliseconds, and the log frames that follow them on the
    socket do not wait (a warm start's first line). A final state
    (interrupted included) is handled in its frame's turn, once the progress
    states before it are: what follows it on the socket is handled knowing it."""

    instance_id: str | None = None
    pending_instance_id: str | None = None  # the token's instance, until its hello is accepted
    _bootstrap_token = ""  # set when the runner came with its machine's single-use token

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logs = LogIngest(runner=lambda: self.instance_id, send=self._send, close=lambda code: self.close(code))
        self._progress: InOrder[tuple[protocol.JobState, str | None]] = InOrder(
            self._progress_state, failed=lambda item: f"handling job {item[0].job}'s state {item[0].state} failed"
        )
        self._metrics: InOrder[tuple[protocol.Metrics, str | None, int]] = InOrder(
            self._store_metrics, failed=lambda item: f"storing job {item[0].job}'s metrics failed"
        )
        self._metrics_cap = FrameCap()
        # What the last heartbeat said the machine's data cache holds (None: nothing heard yet).
        self._data_cached: list[str] | None = None

    async def connect(self) -> None:
        """Rate limits: per runner (its instance), and per address only for
        connects whose token was refused, so many runners behind one NAT are
        never limited by each other (docs/decisions/0038-rate-limits.md)."""
        ip = scope_ip(self.scope)
        # Read before the accept: the token is looked up right after it.
        refusal = await connect_over(scope="runner", kind="ip", identity=ip)
        await self.accept()
        if refusal is not None:
            await self.close(code=protocol.CLOSE_RATE_LIMITED, reason=close_reason(refusal))
            return
        token = token_from_header(_header(self.scope, b"authorization"))
        # In the shared thread (not off_shared_thread): queued there right
        # after the accept, the lookups come before anything queued later.
        runner = await database_sync_to_async(runner_authenticate)(token=token) if token else Authenticated()
        if not runner.instance_id:
            await connect_hit(scope="runner", kind="ip", identity=ip)
            await self.close(code=protocol.CLOSE_UNAUTHORIZED, reason=runner.refusal[:120])
            return
        if refusal := await connect_hit(scope="runner", kind="user", identity=f"instance:{runner.instance_id}"):
            await self.close(code=protocol.CLOSE_RATE_LIMITED, reason=close_reason(refusal))
            return
        self._bootstrap_token = token if token and runner.bootstrap else ""
        self.pending_instance_id = runner.instance_id

    async def disconnect(self, code: int) -> None:
        self.logs.close()
        self._progress.close()  # the states received are still handled (a final one is sent once)
        self._metrics.close()
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
            await self.close(code=protocol.CLOSE_BAD_MESSAGE, reason=_bad_frame_reason(exc))
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
        greeting = await off_shared_thread(runner_hello)(
            instance_id=self.pending_instance_id,
            hello=hello,
            channel_name=self.channel_name,
            bootstrap_token=self._bootstrap_token,
            address=scope_ip(self.scope),
        )
        self._bootstrap_token = ""  # spent, whatever the answer
        if not greeting.instance_id:
            await self.close(code=greeting.close_code, reason=greeting.close_reason)
            return
        self.instance_id = greeting.instance_id
        if greeting.replaced:
            await self.channel_layer.send(greeting.replaced, signed({"type": "runner.replaced"}))
        await self._answer(greeting.reply)

    async def on_heartbeat(self, message: protocol.Heartbeat) -> None:
        # The machine's cached data snapshots are written when they change (up to 16 kB).
        cached = list(message.data_cached)
        changed = cached != self._data_cached
        self._data_cached = cached
        await off_shared_thread(instance_heartbeat)(
            instance_id=self.instance_id,
            busy=message.state == "busy",
            kept_until=message.kept_until,
            data_cached=cached if changed else None,
        )
        if message.app_idle_seconds is not None:
            await off_shared_thread(dev_environment_active)(
                instance_id=self.instance_id, idle_seconds=message.app_idle_seconds
            )

    async def on_job_accepted(self, message: protocol.JobAccepted) -> None:
        # Off the shared database thread: a submission's request still
        # answering there must not hold up the confirmation the runner
        # waits for before the commands start.
        await self._answer(await off_shared_thread(runner_job_accepted)(instance_id=self.instance_id, message=message))

    async def on_job_rejected(self, message: protocol.JobRejected) -> None:
        await self._answer(await off_shared_thread(runner_job_rejected)(instance_id=self.instance_id, message=message))

    async def on_job_state(self, message: protocol.JobState) -> None:
        if message.state not in FINAL_STATES:
            if self._progress.waiting() >= MAX_QUEUED_PROGRESS:
                logger.warning("runner %s sent %d job states faster than they are handled: closing",
                               self.instance_id, MAX_QUEUED_PROGRESS)  # fmt: skip
                reason = f"flooding: more than {MAX_QUEUED_PROGRESS} job states waiting to be handled"
                await self.close(code=protocol.CLOSE_FLOODING, reason=reason)
                return
            self._progress.put((message, self.instance_id))
            return
        await self._progress.join()
        await self._metrics.join()  # the attempt's last metrics frame, sent before its end, is stored first
        await self._answer(await off_shared_thread(runner_job_state)(instance_id=self.instance_id, message=message))

    async def _progress_state(self, item: tuple[protocol.JobState, str | None]) -> None:
        """A failure is logged (``InOrder``): the runner re-sends its jobs'
        latest states after every reconnect."""
        message, instance_id = item
        await self._answer(await off_shared_thread(runner_job_state)(instance_id=instance_id, message=message))

    async def on_logs(self, message: protocol.Logs) -> None:
        if not self.logs.put(message):
            reason = f"flooding: more than {MAX_QUEUED_LOG_FRAMES} log frames sent without waiting for acks"
            await self.close(code=protocol.CLOSE_FLOODING, reason=reason)

    async def on_metrics(self, message: protocol.Metrics) -> None:
        """Stored in order by a task of its own, off the database thread; a
        job's frames faster than the cap (``FrameCap``) or past
        MAX_QUEUED_METRICS waiting are dropped and counted, never an error
        to the runner."""
        if not self._metrics_cap.admit(message.job):
            return
        if self._metrics.waiting() >= MAX_QUEUED_METRICS:
            self._metrics_cap.drop(message.job)
            return
        self._metrics.put((message, self.instance_id, self._metrics_cap.take_dropped(message.job)))

    async def _store_metrics(self, item: tuple[protocol.Metrics, str | None, int]) -> None:
        message, instance_id, dropped = item
        if instance_id is not None:
            await off_shared_thread(record_metrics)(instance_id=instance_id, message=message, frames_dropped=dropped)

    async def _answer(self, reply: Reply) -> None:
        """What a frame's use case returned, in its order (``Reply``)."""
        for frame in reply.frames:
            await self._send(frame)
        wanted = reply.ask_for_a_pass
        if reply.after_sending is not None:
            wanted = await off_shared_thread(reply.after_sending)() or wanted
        if wanted:
            await _ask_for_a_pass()

    async def _send(self, frame: Answer) -> None:
        await self.send(text_data=frame.model_dump_json())

    # ------------------------------------------------------- channel events

    # Every event through the channel layer is signed by the server
    # (``core.channels.signed``): one that is not (written into Redis by
    # whoever can) is dropped and logged, never forwarded or acted on.

    def _forged(self, event: dict[str, Any]) -> bool:
        if verified(event):
            return False
        logger.warning(
            "security: an unsigned %r event reached runner instance %s through the channel layer; dropped",
            str(event.get("type"))[:40],
            self.instance_id,
        )
        return True

    async def runner_frame(self, event: dict[str, Any]) -> None:
        if self._forged(event):
            return
        await self.send(text_data=event["frame"])

    async def runner_drop(self, event: dict[str, Any]) -> None:
        if self._forged(event):
            return
        # 1012 "service restart": the runner reconnects and resends.
        await self.close(code=1012)

    async def runner_replaced(self, event: dict[str, Any]) -> None:
        if self._forged(event):
            return
        self.instance_id = None  # the new connection owns the instance now
        await self.close(code=protocol.CLOSE_REPLACED)

    async def runner_fenced(self, event: dict[str, Any]) -> None:
        """The instance was declared lost: the runner must stop, not reconnect."""
        if self._forged(event):
            return
        self.instance_id = None
        await self.close(code=protocol.CLOSE_FENCED, reason=str(event.get("reason", ""))[:120])


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


def _bad_frame_reason(exc: ValidationError) -> str:
    """The first problem, where it is and what limit it breaks (``running_jobs:
    List should have at most 64 items``), in the 123 bytes a close reason has."""
    first = exc.errors(include_url=False, include_input=False)[:1]
    if not first:
        return "bad frame"
    where = ".".join(str(part) for part in first[0]["loc"])
    text = f"bad frame: {where}: {first[0]['msg']}"
    return text.encode()[:123].decode(errors="ignore")


def _version_advice(theirs: int) -> str:
    ours = protocol.PROTOCOL_VERSION
    side = "trainyard-runner" if theirs < ours else "the Trainyard server"
    return f"runner speaks protocol {theirs}, server {ours}: upgrade {side}"


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
