"""The connection loop: one websocket to the server, reconnected forever with
capped backoff, and the dispatch of server messages.

Jobs live across connections; on every (re)connection the runner says which
jobs it still holds, rewinds their log streams to what the server has stored,
and re-sends their latest state. They can live across runner processes too:
with ``jobs_outlive_runner`` their commands survive the runner's death, and a
runner started on the same work dir re-attaches to them (``reattach.py``)
before its first hello. Exit codes of ``Agent.run``: 0 after a
``Shutdown`` (or SIGTERM), 1 when the server was unreachable for
``give_up_after`` seconds while the runner held no job (not even a final
state still to deliver), 2 when the server refused the runner
(close codes 4401/4403/4409/4410, HTTP 401/403), ``EXIT_POWER_OFF`` (3)
when it was unreachable for ``power_off_after`` seconds likewise (the caller
powers the machine off). 0 disables either limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import random
import socket
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from . import __version__, data, http, jobuser, kept
from . import protocol as p
from .job import Job, Lifecycle, NoSession, Resumed, environments_dir
from .machine import TOKEN_FILE, save_token
from .ports import free_ports, port_env
from .process import ShimStandby
from .reattach import find_resumable, lock_work_dir
from .register import CONFIG_NAME
from .relay import Relays, host_key_line
from .resources import detect_resources
from .serverwatch import ServerWatch
from .sessions.context import SessionContext
from .spot import Notice, SpotWatcher

log = logging.getLogger(__name__)

FATAL_CLOSE_CODES = {
    p.CLOSE_UNAUTHORIZED,
    p.CLOSE_FORBIDDEN,
    p.CLOSE_VERSION_MISMATCH,
    p.CLOSE_REPLACED,
    p.CLOSE_FENCED,
}
BACKOFF_MIN, BACKOFF_MAX = 0.2, 5.0
WELCOME_TIMEOUT = 10.0
ACK_TIMEOUT = 30.0  # batches in flight without any ack: the connection is dead
MAX_FRAME = 16 << 20
STOP_TIMEOUT = 20.0
EXIT_POWER_OFF = 3
SPOT_ENDING = "the machine is being reclaimed (spot); the job resumes elsewhere — start a new session then"
# Worth retrying: network errors, timeouts, server restarts, a bad welcome.
RECOVERABLE = (OSError, TimeoutError, WebSocketException, ValueError)


class Fatal(Exception):
    """The server refused this runner; retrying will not help."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class Agent:
    def __init__(
        self,
        *,
        server_url: str,
        token: str,
        work_dir: Path,
        give_up_after: float = 300.0,
        drain_timeout: float = 60.0,
        address: str = "",
        power_off_after: float = 0.0,
        cloud: p.CloudIdentity | None = None,
        jobs_outlive_runner: bool = False,
        absolute_paths: bool = False,
        keep_failed_seconds: float = kept.KEEP_SECONDS,
        kept_retry_seconds: float = kept.RETRY_FIRST,
        api_origin_fixed: bool = False,
    ) -> None:
        self.url = runner_ws_url(server_url)
        self._api_origin_fixed = api_origin_fixed  # --api-origin: the welcome does not move it
        self._address = address  # empty: worked out on every connection (default_address)
        self._token = token
        self._work_dir = work_dir
        self._standby = ShimStandby(work_dir / "jobs")
        self._give_up_after = give_up_after
        self._power_off_after = power_off_after
        self._cloud = cloud
        self._drain_timeout = drain_timeout
        self._outlive = jobs_outlive_runner
        self._absolute_paths = absolute_paths
        self._keep_failed_seconds = keep_failed_seconds
        self._detach = False  # SIGTERM with jobs_outlive_runner: exit, leaving started jobs running
        self._jobs: dict[str, Job] = {}
        self._job_tasks: dict[str, asyncio.Task[None]] = {}
        self._finals: dict[str, p.JobState] = {}  # final states not yet sent
        self._states: dict[str, p.JobState] = {}  # latest non-final state per job
        self._ws: ClientConnection | None = None
        self._wake = asyncio.Event()  # log lines or window space available
        self._end_session = asyncio.Event()
        self._stopping = False  # Shutdown or SIGTERM: take no new jobs, then exit 0
        self._exit_code: int | None = None
        self._last_ack_at = time.monotonic()
        self._server = ServerWatch()  # when the server was last heard; stops jobs cut off past its grace
        self._gpus: list[p.Gpu] | None = None
        self._lock: IO[bytes] | None = None  # flock'd for as long as this process runs
        # Set before run() with --cloud aws: calls on_notice / on_rebalance.
        self.spot: SpotWatcher | None = None
        self._notice: Notice | None = None  # the machine is being reclaimed: no new jobs
        self._leaving = False  # on_termination: exit once the jobs' final states are delivered
        self._background: set[asyncio.Task[object]] = set()
        self._kept = kept.Uploader(work_dir, lambda: self._token, first=kept_retry_seconds)
        self.relays = Relays(
            main_url=self.url,
            token=lambda: self._token,
            work_dir=work_dir,
            job_context=self._context,
            job_ending=self._ending,
        )
        self._host_key: str | None = None  # read once, at the first hello

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def leaving(self) -> bool:
        return self._leaving

    @property
    def state(self) -> Lifecycle:
        if self._exit_code is not None:
            return Lifecycle.STOPPED
        if self._ws is None:
            return Lifecycle.CONNECTING
        job = next(iter(self._jobs.values()), None)
        return job.phase if job else Lifecycle.IDLE

    async def run(self) -> int:
        """Connect, serve, reconnect until told to stop; returns the exit code."""
        try:
            return await self._run()
        finally:
            self._standby.close()

    async def _run(self) -> int:
        self._work_dir.mkdir(parents=True, exist_ok=True)
        if jobuser.isolating():
            jobuser.prepare_work_dir(
                self._work_dir,
                private=[self._work_dir / TOKEN_FILE, self._work_dir / CONFIG_NAME, self._work_dir / kept.KEPT_DIR],
                shared=[environments_dir(self._work_dir)],
            )
        self._lock = await lock_work_dir(self._work_dir)
        if self._lock is None:
            log.error("another runner process uses %s; exiting", self._work_dir)
            return 2
        for resumed in find_resumable(self._work_dir):
            self._new_job(resumed.spec, resumed)
            log.info(
                "re-attached to job %s attempt %d (shim pid %d)",
                resumed.spec.job,
                resumed.spec.attempt,
                resumed.shim.pid,
            )
        if self.spot is not None:
            self._keep(self.spot.run())
        self._keep(self._watch_server())
        self._keep(self._kept.run())
        await self._standby.fill()
        delay, last_contact = BACKOFF_MIN, time.monotonic()
        while self._exit_code is None:
            error: Exception | None = None
            try:
                await self._connect_and_serve()
            except Fatal as e:
                log.error("server refused this runner: %s; exiting", e)
                # Fenced: nothing of ours may keep running. Replaced by a newer
                # runner: with jobs that outlive us, it may be the one that
                # re-attached to them.
                if not (self._outlive and e.code == p.CLOSE_REPLACED):
                    for job in self._jobs.values():
                        await job.wait_wound_down()  # an interrupted job keeps its time until the deadline
                        await job.kill_now()
                return 2
            except RECOVERABLE as e:
                error = e
            finally:
                if self._ws is not None:  # the server welcomed us: a fresh start for the backoff
                    last_contact, delay = time.monotonic(), BACKOFF_MIN
                self._ws = None
            if self._exit_code is not None:
                break
            if error is not None:
                log.warning("connection to %s failed: %s; retrying in %.1fs", self.url, _describe(error), delay)
            # Not _busy(): a job that ended during the outage is not busy, but
            # until its final state is delivered the server would count it
            # lost (and run it again) if we left.
            if not self._jobs and (code := self._give_up(time.monotonic() - last_contact)) is not None:
                return code
            await asyncio.sleep(min(delay * random.uniform(0.8, 1.2), BACKOFF_MAX))
            delay = min(delay * 2, BACKOFF_MAX)
        return self._exit_code

    def _give_up(self, unreachable: float) -> int | None:
        """Idle and cut off: power off (cloud machines), or exit 1, or keep trying."""
        if self._power_off_after and unreachable > self._power_off_after:
            log.error("server unreachable for %.0fs while idle; the machine powers off", self._power_off_after)
            return EXIT_POWER_OFF
        if self._give_up_after and unreachable > self._give_up_after:
            log.error("server unreachable for %.0fs while idle; giving up", self._give_up_after)
            return 1
        return None

    def stop(self, reason: str) -> None:
        """SIGTERM: stop the running job, report it, then exit 0. With
        ``jobs_outlive_runner`` a job whose commands run is left running (the
        next runner on this work dir re-attaches); only a job still preparing
        is stopped and reported."""
        log.info("stopping: %s", reason)
        self._stopping = True
        self._detach = self._outlive
        for job in self._jobs.values():
            if self._detach and job.detachable:
                log.info("leaving job %s running: a runner started on %s re-attaches to it", job.id, self._work_dir)
            else:
                job.cancel(reason)
        self._maybe_exit()
        # Reporting needs the server; do not wait for it forever.
        asyncio.get_running_loop().call_later(STOP_TIMEOUT, self._force_exit)

    def on_notice(self, notice: Notice) -> None:
        """A spot interruption notice: every job winds down by its deadline,
        and no new job is taken."""
        self._notice = notice
        for job in list(self._jobs.values()):
            job.interrupt(notice)

    def on_termination(self, notice: Notice) -> None:
        """The machine itself is going (a pod's SIGTERM, ``--cloud
        kubernetes``): the notice for every job (``on_notice``: each winds
        down by ``notice.at``, is reported interrupted), no new job, and the
        runner exits 0 once every job's final state is delivered, at the
        latest at ``notice.at``. Jobs are never left running (the machine
        goes with the runner)."""
        if self._leaving:
            return
        log.warning("the machine is going at %s: winding the jobs down, then exiting", notice.when)
        self._leaving = True
        self._stopping = True
        self._detach = False
        self.on_notice(notice)
        self._maybe_exit()
        loop = asyncio.get_running_loop()
        loop.call_later(max(notice.at - time.time(), 0.0), self._force_exit, f"the machine goes at {notice.when}")

    def on_rebalance(self, recommendation: str) -> None:
        """A rebalance recommendation: sync every running job's checkpoint, keep running."""
        for job in list(self._jobs.values()):
            if job.phase == Lifecycle.RUNNING and not job.interrupted:
                self._keep(job.checkpoint_now("rebalance"))

    def _keep(self, coro: Any) -> None:
        """Run ``coro`` in the background for as long as the agent runs; a crash is logged."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[object]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a background task of the runner failed", exc_info=task.exception())

    def _force_exit(self, why: str = "") -> None:
        if self._exit_code is None:
            why = why or f"could not report to the server within {STOP_TIMEOUT:.0f}s"
            log.warning("%s; exiting anyway", why)
            self._exit_code = 0
            self._end_session.set()

    # ---------------------------------------------------------------- session

    async def _connect_and_serve(self) -> None:
        headers = {"Authorization": f"Bearer {self._token}"}
        address = self._address or await asyncio.to_thread(default_address, self.url)
        try:
            async with connect(
                self.url,
                additional_headers=headers,
                open_timeout=10,
                close_timeout=5,
                max_size=MAX_FRAME,
                user_agent_header=f"trainyard-runner/{__version__}",
            ) as ws:
                await self._session(ws, address)
        except InvalidStatus as e:
            if e.response.status_code in (401, 403):
                raise Fatal(f"HTTP {e.response.status_code} (bad token?)") from e
            raise
        if self._exit_code is None:
            log.info("connection ended, reconnecting")

    async def _session(self, ws: ClientConnection, address: str) -> None:
        """1. Hello → Welcome, 2. rewind streams and re-send states and final
        states, 3. receive, heartbeat and send logs until the connection ends."""
        try:
            await ws.send(self._hello(address).model_dump_json())
            welcome = await self._welcome(ws)
            self._ws = ws
            if welcome.token:  # saved first: a crash from here on must not lose it
                self._take_token(welcome.token)
            log.info("connected to %s as instance %s", self.url, welcome.instance)
            if welcome.api_origin and not self._api_origin_fixed:
                try:
                    log.debug("the runner's token goes only to %s", http.pin_token_origin(welcome.api_origin))
                except ValueError as e:
                    log.warning("ignoring the welcome's API origin: %s", e)
            self._apply_welcome(welcome)
            for state in list(self._states.values()):
                job = self._jobs.get(state.job)
                if job is not None and not job.refused:
                    await ws.send(state.model_dump_json())
            await self._deliver_finals()
            self._end_session.clear()
            self._maybe_exit()
            await self._serve(ws, max(welcome.heartbeat_seconds, 0.5))
        except ConnectionClosed as e:
            _raise_if_fatal(e.rcvd.code if e.rcvd else None, e.rcvd.reason if e.rcvd else "")
            raise
        _raise_if_fatal(ws.close_code, ws.close_reason or "")

    async def _serve(self, ws: ClientConnection, heartbeat: float) -> None:
        tasks = [
            asyncio.create_task(self._receive(ws)),
            asyncio.create_task(self._heartbeat(ws, heartbeat)),
            asyncio.create_task(self._pump(ws)),
            asyncio.create_task(self._end_session.wait()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _welcome(self, ws: ClientConnection) -> p.Welcome:
        raw = await asyncio.wait_for(ws.recv(), WELCOME_TIMEOUT)
        msg = p.server_message.validate_json(raw)
        if not isinstance(msg, p.Welcome):
            raise WebSocketException(f"expected welcome, got {msg.type}")
        if msg.protocol != p.PROTOCOL_VERSION:
            side = "trainyard-runner" if msg.protocol > p.PROTOCOL_VERSION else "the Trainyard server"
            raise Fatal(f"server speaks protocol {msg.protocol}, runner {p.PROTOCOL_VERSION}: upgrade {side}")
        return msg

    def _take_token(self, token: str) -> None:
        """The bootstrap token is spent: this one is ours from now on, also after a restart."""
        self._token = token
        try:
            save_token(self._work_dir, token)
        except OSError as e:  # kept in memory; a restart could not connect again
            log.error("could not save the runner's token in %s: %s", self._work_dir, e)
            return
        log.info("exchanged the bootstrap token for the runner's own (saved in the work dir)")

    def _hello(self, address: str) -> p.Hello:
        if self._gpus is None:  # nvidia-smi is slow: ask once
            self._gpus = detect_resources(self._work_dir).gpus
        resources = detect_resources(self._work_dir, gpus=self._gpus)
        # Texts longer than the protocol's bounds are cut by the models. A
        # runner holds one job and the finished ones it has still to report,
        # far fewer than MAX_HELD_JOBS: the cut is a guard, never a bad frame.
        held = [j for j in self._jobs.values() if not j.refused][: p.MAX_HELD_JOBS]
        if self._host_key is None:
            self._host_key = host_key_line(self._work_dir)
        return p.Hello(
            version=__version__,
            hostname=socket.gethostname(),
            address=address,
            resources=resources,
            running_jobs=[
                p.HeldJob(job=j.id, attempt=j.attempt, lease=j.spec.lease, confirmed=j.confirmed, ports=j.ports)
                for j in held
            ],
            cloud=self._cloud,
            relay=p.RELAY_VERSION,
            ssh_host_key=self._host_key,
        )

    def _context(self, job_id: str) -> SessionContext | str:
        """The ``SessionContext`` of a job this runner holds and still runs, else why not."""
        job = self._jobs.get(job_id)
        if job is None or job.finished or job.refused:
            return "the job is not running on this runner"
        try:
            return job.session_context()
        except NoSession as e:
            return str(e)

    def _ending(self, job_id: str) -> str:
        """Why a job's sessions end while it is ending, else ""."""
        job = self._jobs.get(job_id)
        if job is not None and job.interrupted:
            return SPOT_ENDING
        if job is None or job.finished:
            return "the job ended: its session ends with it"
        if job.cancel_reason:
            return f"the job is being stopped ({job.cancel_reason}): its session ends with it"
        return ""

    def _apply_welcome(self, welcome: p.Welcome) -> None:
        self._server.welcomed(welcome)
        for job in self._jobs.values():
            job.stream.rewind(welcome.acked.get(job.id, job.stream.acked))
        for job_id in welcome.confirmed:
            if job_id in self._jobs:
                self._jobs[job_id].confirm()
        for job_id in welcome.cancel:
            if job_id in self._jobs:
                self._jobs[job_id].cancel("cancelled by the server")
        for job_id in welcome.refused:
            if job_id in self._jobs:
                self._jobs[job_id].refuse("the server no longer wants this attempt")
        self._last_ack_at = time.monotonic()

    async def _receive(self, ws: ClientConnection) -> None:
        async for raw in ws:
            self._server.heard()
            try:
                msg = p.server_message.validate_json(raw)
            except ValidationError as e:
                log.warning("ignoring a message the runner does not understand: %s", str(e).splitlines()[0])
                continue
            await self._dispatch(ws, msg)

    async def _dispatch(self, ws: ClientConnection, msg: p.ServerMessage) -> None:
        if isinstance(msg, p.LogAck):
            if msg.job in self._jobs:
                self._jobs[msg.job].stream.ack(msg.seq)
                self._last_ack_at = time.monotonic()
        elif isinstance(msg, p.AssignJob):
            await ws.send(self._assign(msg).model_dump_json())
        elif isinstance(msg, p.JobConfirmed):
            job = self._jobs.get(msg.job)
            if job is not None and job.attempt == msg.attempt:
                job.confirm()
        elif isinstance(msg, p.Refused):
            job = self._jobs.get(msg.job)
            if job is not None and job.attempt == msg.attempt:
                log.warning("job %s attempt %d refused by the server: %s", msg.job, msg.attempt, msg.reason)
                job.refuse(msg.reason)
        elif isinstance(msg, p.CancelJob):
            job = self._jobs.get(msg.job)
            if job is not None and msg.attempt in (0, job.attempt):  # unknown jobs: nothing to stop
                job.cancel(msg.reason or "cancelled", grace=msg.grace)
        elif isinstance(msg, p.OpenRelay):
            self.relays.open(msg)
        elif isinstance(msg, p.CloseRelay):
            self.relays.close(msg.session, msg.reason)
        elif isinstance(msg, p.Shutdown):
            log.info("server asked the runner to shut down: %s", msg.reason or "no reason given")
            self._stopping = True
            self._maybe_exit()

    def _assign(self, msg: p.AssignJob) -> p.JobAccepted | p.JobRejected:
        """Accept at once (the lease is short) and run the job in the background."""
        held = self._jobs.get(msg.job)
        if held is not None and held.attempt == msg.attempt:  # the same assignment again after a reconnect
            return p.JobAccepted(job=msg.job, attempt=msg.attempt, lease=msg.lease, ports=held.ports)
        if held is not None:  # an earlier attempt of this job is still shutting down here
            reason = f"still stopping attempt {held.attempt} of this job"
            return p.JobRejected(job=msg.job, attempt=msg.attempt, lease=msg.lease, reason=reason)
        reason = self._refusal(msg)
        if reason:
            log.info("rejecting job %s: %s", msg.job, reason)
            return p.JobRejected(job=msg.job, attempt=msg.attempt, lease=msg.lease, reason=reason)
        if msg.port_count:
            try:
                ports = free_ports(msg.port_count)
            except OSError as e:
                reason = f"could not find {msg.port_count} free ports on this machine: {e}"
                return p.JobRejected(job=msg.job, attempt=msg.attempt, lease=msg.lease, reason=reason)
            msg = msg.model_copy(update={"env": {**msg.env, **port_env(ports)}})
        job = self._new_job(msg)
        log.info("job %s attempt %d assigned: %s/%s", job.id, msg.attempt, msg.run_name, msg.workflow)
        return p.JobAccepted(job=msg.job, attempt=msg.attempt, lease=msg.lease, ports=job.ports)

    def _new_job(self, spec: p.AssignJob, resumed: Resumed | None = None) -> Job:
        job = Job(
            spec,
            work_dir=self._work_dir,
            token=self._token,
            report=self._report,
            on_logs_ready=self._wake.set,
            on_drain_stuck=self._end_session.set,
            drain_timeout=self._drain_timeout,
            outlive=self._outlive,
            absolute_paths=self._absolute_paths,
            keep_failed_seconds=self._keep_failed_seconds,
            resumed=resumed,
            standby=self._standby,
        )
        self._jobs[job.id] = job
        self._job_tasks[job.id] = asyncio.create_task(self._run_job(job))
        return job

    def _refusal(self, msg: p.AssignJob) -> str:
        if self._stopping:
            return "runner is shutting down"
        if self._notice is not None:
            return f"this machine is being reclaimed by the cloud at {self._notice.when}"
        if not msg.job or "/" in msg.job or msg.job.startswith("."):
            return "invalid job id"
        busy = [j.id for j in self._jobs.values() if j.id not in self._finals]
        return f"busy with job {busy[0]}" if busy else ""

    async def _heartbeat(self, ws: ClientConnection, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            kept_until = kept.latest_until(self._work_dir)
            idle = [s for j in self._jobs.values() if (s := j.app_idle_seconds) is not None]
            beat = p.Heartbeat(
                state="busy" if self._busy() else "idle",
                kept_until=kept_until,
                app_idle_seconds=min(idle) if idle else None,
                data_cached=await asyncio.to_thread(data.cached, self._work_dir),
            )
            # Optional fields only when set: a server of the previous release refuses fields it does not know.
            unset = None if beat.data_cached else {"data_cached"}
            await ws.send(beat.model_dump_json(exclude_none=True, exclude=unset))
            self._keep(self._pong(ws, every))

    async def _pong(self, ws: ClientConnection, within: float) -> None:
        """A pong is the server heard, also while it has nothing to send."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(await ws.ping(), within)
            self._server.heard()

    async def _watch_server(self) -> None:
        """Every second: stop the jobs cut off from the server past its grace (``serverwatch``)."""
        while True:
            await asyncio.sleep(1.0)
            self._server.stop_cut_off(list(self._jobs.values()))

    async def _pump(self, ws: ClientConnection) -> None:
        """Send due log batches of every job; wake on new lines or acks, or
        when a partial batch becomes due."""
        while True:
            self._wake.clear()
            timeout = 1.0
            for job in list(self._jobs.values()):
                stream = job.stream
                while (batch := stream.take_batch()) is not None:
                    if stream.in_flight() == 1:
                        self._last_ack_at = time.monotonic()
                    first_seq, lines = batch
                    # Built directly, not through the pydantic model: this is the hot path.
                    streams, times, text = p.chunk_fields(lines)
                    frame = {
                        "type": "logs",
                        "job": job.id,
                        "attempt": job.attempt,
                        "first_seq": first_seq,
                        "streams": streams,
                        "times": times,
                        "text": text,
                    }
                    await ws.send(json.dumps(frame, ensure_ascii=False))
                metrics = job.metrics
                if metrics is not None and not job.refused and (metrics_frame := metrics.frame()) is not None:
                    await ws.send(metrics_frame.model_dump_json())
                    metrics.sent(metrics_frame)
                due = stream.seconds_until_due()
                if due is not None:
                    timeout = min(timeout, due)
                if stream.in_flight() and time.monotonic() - self._last_ack_at > ACK_TIMEOUT:
                    raise WebSocketException(f"no log ack for {ACK_TIMEOUT:.0f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    # ---------------------------------------------------------------- jobs

    async def _run_job(self, job: Job) -> None:
        try:
            final = await job.run()
        except Exception as e:  # a bug must not leave the job hanging forever
            log.exception("job %s crashed", job.id)
            final = job.final("failed", None, f"runner error: {e}")
        log.info("job %s %s (exit code %s) %s", job.id, final.state, final.exit_code, final.reason)
        self.relays.close_job(
            job.id, SPOT_ENDING if final.state == "interrupted" else f"the job {final.state}: its session ends with it"
        )
        self._states.pop(job.id, None)
        self._finals[job.id] = final
        if final.kept_until is not None:
            self._kept.wake()  # a first retry of its upload starts the backoff
        await self._deliver_finals()
        self._maybe_exit()
        if not self._stopping:
            await job.make_spare()  # for the next job of the same repository: no clone
            await self._standby.fill()  # and its shim started

    async def _report(self, state: p.JobState) -> None:
        """Send a job's intermediate state now if connected; it is re-sent after
        every reconnect until the job ends. Before ``interrupted``, after
        which the server stores nothing more of the attempt, its last
        metrics frame; no more are sent."""
        self._states[state.job] = state
        job = self._jobs.get(state.job)
        if state.state == "interrupted" and job is not None and job.metrics is not None:
            with contextlib.suppress(ConnectionClosed):
                await self._send_last_metrics(job)
            job.metrics.abandon()
        if self._ws is None:
            return
        with contextlib.suppress(ConnectionClosed):  # re-sent after the reconnect
            await self._ws.send(state.model_dump_json())

    async def _send_last_metrics(self, job: Job) -> None:
        """The job's metrics still to send, in one frame, once the server
        takes another frame of the job (``metrics.END_GAP``); nothing when
        disconnected (kept for the next connection). Raises ``ConnectionClosed``."""
        metrics = job.metrics
        if metrics is None or not metrics.pending():
            return
        await asyncio.sleep(metrics.seconds_until_final())
        ws = self._ws
        frame = metrics.frame(final=True)
        if ws is None or frame is None:
            return
        await ws.send(frame.model_dump_json())
        metrics.sent(frame)

    async def _deliver_finals(self) -> None:
        for job_id, final in list(self._finals.items()):
            job = self._jobs.get(job_id)
            if job is not None and job.refused:  # fenced: the server listens to it no more
                del self._finals[job_id]
                self._job_tasks.pop(job_id, None)
                self._jobs.pop(job_id).remove_files()
                continue
            if self._ws is None:
                return
            try:
                if job is not None:  # the attempt's last metrics go before its final state
                    await self._send_last_metrics(job)
                if self._ws is None:
                    return
                await self._ws.send(final.model_dump_json())
            except ConnectionClosed:
                return
            del self._finals[job_id]
            self._job_tasks.pop(job_id, None)
            self._jobs.pop(job_id).remove_files()

    def _busy(self) -> bool:
        """A job is preparing, running, draining its logs or uploading its
        artifacts (only its final state is left to send: not busy)."""
        return any(not job.finished for job in self._jobs.values())

    def _maybe_exit(self) -> None:
        if self._stopping and all(self._detach and job.detachable for job in self._jobs.values()):
            self._exit_code = 0
            self._end_session.set()


def runner_ws_url(server: str) -> str:
    """``ws://host:8000`` (or http://…) → ``ws://host:8000/ws/runner/``."""
    url = server.rstrip("/")
    if url.startswith("http"):
        url = "ws" + url[4:]
    return url + "/" if url.endswith("/ws/runner") else url + "/ws/runner/"


def default_address(server_url: str) -> str:
    """Where other jobs reach this machine: 127.0.0.1 when the server is on a
    loopback address, else the local address the OS routes to the server
    (a UDP socket's connect sends no packet). Empty when that fails."""
    parts = urlsplit(server_url)
    host = parts.hostname or ""
    if _is_loopback(host):
        return "127.0.0.1"
    port = parts.port or (443 if parts.scheme in ("https", "wss") else 80)
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            local = s.getsockname()[0]
    except OSError as e:
        log.debug("could not work out this machine's address towards %s: %s", host, e)
        return ""
    return "127.0.0.1" if _is_loopback(local) else local


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _raise_if_fatal(code: int | None, reason: str) -> None:
    if code in FATAL_CLOSE_CODES:
        raise Fatal(f"close code {code} {reason}".strip(), code)


def _describe(e: Exception) -> str:
    if isinstance(e, InvalidStatus):
        return f"HTTP {e.response.status_code}"
    return str(e) or type(e).__name__
