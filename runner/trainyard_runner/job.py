"""Executing one assigned job: prepare the code and the inputs, run the
commands (under bash, or in a container for the docker provider), drain the
logs, upload the artifacts, and produce the final ``JobState``.

The job never talks to the websocket itself: it reports states through the
``report`` callback and leaves its lines in its ``LogStream``; the agent
delivers both whenever it is connected.

Before its commands start, a job writes ``job.json`` (its ``AssignJob``
without the environment, the inputs and the code's URLs: what a later runner
needs to finish the job, and no secret at rest). A runner started later on
the same work dir rebuilds the job from it (``Resumed``, ``reattach.py``) and
follows the shim that still runs the commands.

A spot interruption notice (``interrupt``): the job is reported
``interrupted`` at once, its process group gets SIGTERM and the time in
``TRAINYARD_INTERRUPT_FILE``, its checkpoint is synced when it exits or at
T-45 s, and it is SIGKILLed no later than T-10 s (docs/RUNNER.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from urllib.parse import urlencode

from . import docker, jobuser, kept, volumes
from .appwatch import TOKEN_VARIABLE as APP_TOKEN_VARIABLE
from .appwatch import AppWatch
from .artifacts import ArtifactError, upload_artifacts
from .caches import restore_caches, save_caches
from .checkpoints import CheckpointError, CheckpointSync
from .code import CodeError, prepare_code, spare_checkout
from .data import CACHE_DIR as DATA_CACHE_DIR
from .data import Hold as DataHold
from .data import fetch_data
from .docker import DockerError
from .environments import Environment, EnvironmentBuildError, prepare_environment, share
from .http import HttpError, get_json, post_json
from .inputs import InputError, fetch_inputs, fetch_manifests
from .jobuser import JobUser, NoJobUser
from .logstream import LogStream
from .metrics import METRICS_DIR, METRICS_FILE, METRICS_FILE_VAR, JobMetrics, job_metrics_env
from .ports import ports_of
from .process import MARK_VAR, Execution, ShimLost, ShimRecord, ShimStandby, job_env, script
from .protocol import ArtifactSpec, AssignJob, CheckpointSpec, CodeSpec, DataPage, InputPage, JobSecrets, JobState
from .sessions.context import SessionContext
from .spot import Notice

log = logging.getLogger(__name__)

CANCEL_GRACE = 5.0
SHARE_TIMEOUT = 900.0  # the longest the final state waits for the environment's upload
ENVIRONMENTS_VAR = "TRAINYARD_ENVIRONMENTS_DIR"
SPEC_FILE = "job.json"
# A spot interruption notice with time T: the job writes its checkpoint until
# T - CHECKPOINT_MARGIN (then it is synced) and is killed at T - KILL_MARGIN.
CHECKPOINT_MARGIN = 45.0
KILL_MARGIN = 10.0
# How long the lines written before the notice get to be acknowledged before
# the interruption is reported (nothing of the attempt is stored after it).
REPORT_DRAIN = 2.0
# The interrupt file: <job dir>/interrupt/interrupt.env, its path in TRAINYARD_INTERRUPT_FILE
# (a docker job sees the folder read-only at docker.INTERRUPT_MOUNT).
INTERRUPT_DIR, INTERRUPT_FILE = "interrupt", "interrupt.env"
INTERRUPT_FILE_VAR = "TRAINYARD_INTERRUPT_FILE"
HOME_DIR = "home"  # <job dir>/home: HOME of a job with a user of its own
SECRETS_ATTEMPTS = 3  # GETs of the job's secrets, for network errors and 5xx


class NoSession(Exception):
    """No session can get into this job now; the message says why."""


class SecretsError(Exception):
    """The job's secrets could not be fetched; the message says why (the
    server's reason, e.g. a secret no key opens)."""


@dataclass(frozen=True)
class Resumed:
    """A job found in the work dir by a runner that just started: its spec
    (from ``job.json``) and its shim, alive or ended with an exit file."""

    spec: AssignJob
    shim: ShimRecord


class Lifecycle(enum.StrEnum):
    """Where the runner (and its current job) is."""

    CONNECTING = "connecting"
    IDLE = "idle"
    PREPARING = "preparing"
    RUNNING = "running"
    UPLOADING = "uploading"
    DRAINING = "draining"
    STOPPED = "stopped"


class Job:
    def __init__(
        self,
        spec: AssignJob,
        *,
        work_dir: Path,
        token: str,
        report: Callable[[JobState], Awaitable[None]],
        on_logs_ready: Callable[[], None],
        on_drain_stuck: Callable[[], None],
        drain_timeout: float = 60.0,
        outlive: bool = False,
        absolute_paths: bool = False,
        keep_failed_seconds: float = kept.KEEP_SECONDS,
        resumed: Resumed | None = None,
        standby: ShimStandby | None = None,
    ) -> None:
        self.spec = spec
        # The job's calls carry the attempt's own token beside the runner's (AssignJob.job_token).
        token = f"{token}.{spec.job_token}" if spec.job_token else token
        self._standby = standby  # the runner's shim started ahead, if any
        self.id = spec.job
        self._work_root = work_dir
        self._keep_failed_seconds = keep_failed_seconds  # a failed upload's files stay this long (kept.py)
        self.dir = work_dir / "jobs" / spec.job
        self._cache_dir = work_dir / "git-cache"
        self._pip_cache_dir = work_dir / "pip-cache"
        self._environments_dir = environments_dir(work_dir)
        self.environment: Environment | None = None
        self._data_hold: DataHold | None = None  # the job's data snapshots, kept from eviction until it ends
        self._sharing: asyncio.Task[bool] | None = None
        self._token = token
        self._report = report
        self._on_drain_stuck = on_drain_stuck
        self._drain_timeout = drain_timeout
        self._outlive = outlive  # the commands keep running if this runner process dies
        self._absolute_paths = absolute_paths  # artifacts and inputs may be at absolute paths
        self._resumed = resumed
        if resumed is None:
            _reset_dir(self.dir)
        self.attempt = spec.attempt
        self.stream = LogStream(
            self.id,
            self.dir / "spool.jsonl",
            on_ready=on_logs_ready,
            first_seq=spec.seq_base + 1,
            resume=resumed is not None,
        )
        # The commands start only once the server confirmed the acceptance.
        self._confirmed = asyncio.Event()
        self.refused = False  # the server fenced this attempt: nothing more is sent for it
        self.phase = Lifecycle.PREPARING
        self._execution: Execution | None = None
        self._prepare_task: asyncio.Task[None] | None = None
        self._cancel_reason: str | None = None
        self._cancel_grace = CANCEL_GRACE
        self._stopper: asyncio.Task[None] | None = None
        self.finished = False  # run() returned: only the final state is left to send
        self._notice: Notice | None = None  # a spot interruption notice arrived
        self._wind_down_task: asyncio.Task[None] | None = None
        self._interrupted_before_start = False
        self._secrets = JobSecrets()  # fetched while preparing (AssignJob.secrets); in memory only
        self._app_watch: AppWatch | None = None  # a Jupyter dev environment's activity (appwatch)
        # The job's own uid when the runner is root (jobuser.py); None: the runner's user.
        self.user: JobUser | None = None
        self._volumes: list[volumes.Mounted] = []  # mounted while preparing, unmounted at the end (volumes.py)
        # Its metrics (metrics.py) from the start of its commands; the agent sends their frames.
        self.metrics: JobMetrics | None = None
        self._checkpoint = (
            CheckpointSync(
                spec.checkpoint,
                work=self.dir / "work",
                staging=self.dir / "tmp" / "checkpoint-sync",
                job=spec.job,
                attempt=spec.attempt,
                api_url=spec.api_url,
                token=token,
                fresh_url=self._fresh_url,
            )
            if spec.checkpoint is not None
            else None
        )
        self._mounts = [
            CheckpointSync(
                CheckpointSpec(path=a.path, sync_seconds=spec.mount_seconds),
                work=self.dir / "work",
                staging=self.dir / "tmp" / f"mount-{i}",
                job=spec.job,
                attempt=spec.attempt,
                api_url=spec.api_url,
                token=token,
                fresh_url=self._fresh_url,
                begin="artifacts",
            )
            for i, a in enumerate(spec.artifacts)
            if a.mount
        ]
        if resumed is not None:  # its commands were confirmed and started by an earlier runner process
            self._confirmed.set()
            self.phase = Lifecycle.RUNNING
            if resumed.shim.uid:
                self.user = jobuser.take(resumed.shim.uid)
                if self.user is None:
                    log.warning("job %s: its uid %d is held by another runner", self.id, resumed.shim.uid)
            self.metrics = self._new_metrics()
            self._execution = Execution.attach(
                self.dir, resumed.shim, self.stream, self.stream.offsets, user=self.user, tap=self._tap
            )

    @property
    def executing(self) -> bool:
        """The job's commands may still be running (or about to)."""
        return self.phase in (Lifecycle.PREPARING, Lifecycle.RUNNING)

    @property
    def docker(self) -> bool:
        return self.spec.provider == "docker"

    @property
    def detachable(self) -> bool:
        """Its commands were started under a shim that outlives this runner:
        a runner started later on the work dir can take the job over."""
        return self._outlive and self._execution is not None and not self.refused

    async def run(self) -> JobState:
        """Run the job to its end and return the final state (not yet sent)."""
        try:
            state = await self._run()
            if self._sharing is not None and not self._sharing.done() and state.state in ("succeeded", "failed"):
                # The job's endpoints close with its final state: the upload ends first.
                log.info("job %s: waiting for its environment to be stored", self.id)
                await asyncio.wait([self._sharing], timeout=SHARE_TIMEOUT)
            return state
        finally:
            self.finished = True
            if self._sharing is not None:
                self._sharing.cancel()
            if self.environment is not None:
                self.environment.release()
            if self._data_hold is not None:
                self._data_hold.release()
            self._release_user()
            if self._volumes and (self._execution is None or self._execution.over):
                # Its processes are gone: unmounted before the final state, so the server may detach.
                await asyncio.to_thread(volumes.unmount_all, self._volumes)

    def _release_user(self) -> None:
        """Kill every process of the job's uid and free it; a job left
        running for a later runner (``detachable``) keeps its processes."""
        user, self.user = self.user, None
        if user is None:
            return
        if self._execution is not None and not self._execution.over:
            user.unlock()
        else:
            user.release()

    async def _run(self) -> JobState:
        """1. preparing: docker engine check, working directory, code, inputs;
        2. running: the commands; 3. draining: wait until the server
        acknowledged every line; 4. uploading: artifacts, only after exit code 0.
        """
        try:
            if self._resumed is None:
                await self._state("preparing")
                await self._prepare()
            code = await self._execute()
        except CheckpointError as e:
            # Not the job's fault: another attempt may well restore it (retried as an interruption).
            return await self._finish("interrupted", None, str(e))
        except (
            CodeError,
            InputError,
            DockerError,
            ShimLost,
            SecretsError,
            EnvironmentBuildError,
            NoJobUser,
            volumes.VolumeError,
        ) as e:
            if self._notice is not None:  # the machine going away broke the setup: not the job's fault
                return await self._interrupted_final(None)
            return await self._finish("failed", None, str(e))
        except asyncio.CancelledError:
            if self._notice is not None:
                return await self._interrupted_final(None)
            if self._cancel_reason is None:
                raise
            return await self._finish("stopped", None, self._cancel_reason)
        if self._notice is not None:
            return await self._interrupted_final(code)
        if self._cancel_reason is not None:
            return await self._finish("stopped", code, self._cancel_reason)
        if code != 0:
            return await self._finish("failed", code, f"exit code {code}")
        if self.spec.caches:
            await save_caches(
                self.spec.caches,
                self.dir / "work",
                job=self.id,
                attempt=self.attempt,
                api_url=self.spec.api_url,
                token=self._token,
                user=self.user,
                home=self._home,
            )
        return await self._upload(code)

    async def sync_checkpoint(self, reason: str) -> bool:
        """Sync the job's checkpoint now (an interruption notice, a rebalance
        recommendation; ``reason`` is logged): True once the server's latest
        version holds the files as they are (a new version, or nothing
        changed), False if the job has no checkpoint, is no longer listened
        to, or the sync failed (the previous version stays the latest)."""
        if self._checkpoint is None or (self.refused and not self._winding_down()):
            return False
        return await self._checkpoint.sync(reason)

    def _winding_down(self) -> bool:
        """Interrupted at a notice and the machine not reclaimed yet: the
        server still takes this attempt's checkpoint syncs (and holds the
        next attempt for them) although it listens to nothing else of it."""
        return self._notice is not None and time.time() < self._notice.at

    @property
    def ports(self) -> list[int]:
        """The ports picked for ``ports: N`` (its PORT_0 …), [] for none."""
        return ports_of(self.spec.env, self.spec.port_count)

    @property
    def app_idle_seconds(self) -> float | None:
        """How long ago its Jupyter last saw activity (a dev environment; ``appwatch``), None if unknown."""
        return self._app_watch.idle_seconds() if self._app_watch is not None else None

    def _watch_app(self) -> asyncio.Task[None] | None:
        token = self._secrets.env.get(APP_TOKEN_VARIABLE)
        if not token or not self.ports:
            return None
        self._app_watch = AppWatch(self.ports[0], token)
        return asyncio.create_task(self._app_watch.run())

    @property
    def confirmed(self) -> bool:
        return self._confirmed.is_set()

    def confirm(self) -> None:
        """The server recorded the acceptance: the commands may start."""
        self._confirmed.set()

    def refuse(self, reason: str) -> None:
        """The server no longer listens to this attempt: stop it, send nothing
        more. An interrupted job is refused once its report arrived: it goes on
        winding down until the cloud's deadline."""
        self.refused = True
        self.stream.abandon()
        if self.metrics is not None:
            self.metrics.abandon()
        if self._notice is not None:
            return
        self.cancel(f"refused by the server: {reason}")

    @property
    def interrupted(self) -> bool:
        return self._notice is not None

    @property
    def cancel_reason(self) -> str | None:
        """Why the job is being stopped (``cancel``), None while it is not."""
        return self._cancel_reason

    def interrupt(self, notice: Notice) -> None:
        """A spot interruption notice: wind the job down by the cloud's
        deadline (``_wind_down``). Once per job; a job whose commands ended
        (uploading, draining) is left to finish."""
        if self._notice is not None or self.finished or not self.executing or self.refused:
            return
        self._notice = notice
        self._wind_down_task = asyncio.get_running_loop().create_task(self._wind_down(notice))

    async def wait_wound_down(self) -> None:
        if self._wind_down_task is not None:
            with contextlib.suppress(Exception):
                await self._wind_down_task

    async def checkpoint_now(self, reason: str) -> bool:
        """``sync_checkpoint`` for a notice or a recommendation, with a log
        line; never raises (a failed sync must not stop the wind-down)."""
        log.info("job %s: syncing the checkpoint (%s)", self.id, reason)
        try:
            return await self.sync_checkpoint(reason)
        except Exception:
            log.exception("job %s: checkpoint sync (%s) failed", self.id, reason)
            return False

    async def _wind_down(self, notice: Notice) -> None:
        """``_wind_down_job``, then the server is told the last sync was
        made: the job's next attempt need not wait for the deadline."""
        try:
            await self._wind_down_job(notice)
        finally:
            if self._checkpoint is not None:
                await self._checkpoint.done()

    async def _wind_down_job(self, notice: Notice) -> None:
        """1. The time goes into ``TRAINYARD_INTERRUPT_FILE`` and the process
        group gets SIGTERM (a job still preparing is abandoned: it never ran).
        2. ``interrupted`` is reported (after at most ``REPORT_DRAIN`` for the
        lines already written to be stored): the server moves the job now.
        3. The job writes its checkpoint until it exits or T-45 s; then it is
        synced. 4. Still running at T-10 s: SIGKILL; if it exited by then
        after that sync, one more sync."""
        reason = (
            notice.reason
            or f"spot interruption notice: the cloud will {notice.action or 'reclaim'} this machine at {notice.when}"
        )
        execution = self._execution
        if execution is None:
            self._interrupted_before_start = True
            self._confirmed.set()
            if self._prepare_task is not None:
                self._prepare_task.cancel()
            log.warning("job %s: interrupted before its commands started", self.id)
            await self._report_interrupted(notice, reason)
            return
        _write_interrupt_file(self.dir / INTERRUPT_DIR / INTERRUPT_FILE, notice)
        log.warning("job %s: SIGTERM (the machine is reclaimed at %s)", self.id, notice.when)
        execution.signal(signal.SIGTERM)
        await self._report_interrupted(notice, reason)
        exited = await execution.ended_within(notice.at - CHECKPOINT_MARGIN - time.time())
        await self.checkpoint_now("interruption")
        if exited:
            return
        if await execution.ended_within(notice.at - KILL_MARGIN - time.time()):
            if time.time() < notice.at - KILL_MARGIN:
                await self.checkpoint_now("interruption")
            return
        log.warning("job %s: still running %.0fs before the machine is reclaimed: killing it", self.id, KILL_MARGIN)
        execution.kill()
        if self.docker:
            await docker.kill_container(self.id)

    async def _report_interrupted(self, notice: Notice, reason: str) -> None:
        await self.stream.wait_acked(REPORT_DRAIN)
        state = JobState(job=self.id, attempt=self.attempt, state="interrupted", reason=reason, interrupt_at=notice.at)
        await self._report(state)
        # The server ends the attempt now and gives the job's next lines to the next attempt.
        self.stream.abandon()

    async def _interrupted_final(self, code: int | None) -> JobState:
        assert self._notice is not None
        await self.wait_wound_down()
        if not self.stream.closed:
            self.stream.close()
        reason = self._notice.reason or f"spot interruption notice: the machine is reclaimed at {self._notice.when}"
        state = JobState(
            job=self.id,
            attempt=self.attempt,
            state="interrupted",
            exit_code=code,
            reason=reason,
            interrupt_at=self._notice.at,
        )
        return state

    def cancel(self, reason: str, *, grace: float = 0.0) -> None:
        """Stop the job: SIGTERM its process group (SIGKILL after the grace
        period: ``grace`` seconds, announced in the interrupt file, when the
        server gives one; else ``CANCEL_GRACE``), or abandon the preparation.
        The checkpoint is synced once the commands ended (``_wait_execution``).
        Idempotent."""
        if self._cancel_reason is not None or not self.executing:
            return
        self._cancel_reason = reason or "cancelled"
        if grace > 0:
            self._cancel_grace = grace
            at = time.time() + grace
            when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            _write_interrupt_file(self.dir / INTERRUPT_DIR / INTERRUPT_FILE, Notice(action="stop", at=at, when=when))
        self._confirmed.set()  # a job waiting for its confirmation stops waiting
        log.info("job %s: cancelling (%s)", self.id, self._cancel_reason)
        if self._execution is not None:
            self._stop_execution()
        elif self._prepare_task is not None:
            self._prepare_task.cancel()

    def remove_files(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    async def kill_now(self) -> None:
        """SIGKILL the commands' process group (and a container) at once:
        the runner must stop and nothing of the job may outlive it."""
        if self._execution is not None:
            self._execution.kill()
            if self.docker:
                await docker.kill_container(self.id)

    # ---------------------------------------------------------------- steps

    async def _prepare(self) -> None:
        # One task, so that a cancel abandons whichever step is under way.
        self._prepare_task = asyncio.create_task(self._prepare_steps())
        await self._prepare_task

    async def _prepare_steps(self) -> None:
        started = time.monotonic()
        if self.docker:
            if not self.spec.image:
                raise DockerError("the docker provider needs an image")
            docker.checked_image(self.spec.image)
            version = await docker.check_engine()
            log.debug("job %s: docker engine %s", self.id, version)
            await docker.remove_container(self.id)
        if self.spec.secrets:
            self._secrets = await asyncio.to_thread(self._fetch_secrets)
        if not self.docker and jobuser.isolating():
            self.user = await asyncio.to_thread(jobuser.claim)
            self._enclose()
        tmp = self.dir / "tmp"
        tmp.mkdir(mode=0o700)
        work = self.dir / "work"
        code = self.spec.code
        if self._secrets.credential is not None:
            code = code.model_copy(update={"credential": self._secrets.credential})
        await prepare_code(code, work=work, cache_dir=self._cache_dir, tmp_dir=tmp, fresh_url=self._fresh_code_url)
        log.debug("job %s: code ready in %.0f ms", self.id, (time.monotonic() - started) * 1000)
        if self.spec.inputs:
            self._check_input_paths()
            inputs = await asyncio.to_thread(fetch_manifests, self.spec.inputs, self._input_page)
            await fetch_inputs(
                inputs,
                work,
                report=lambda reason: self._state("preparing", reason),
                fresh_url=self._fresh_input_url,
                absolute_ok=self._absolute_paths,
            )
        if self.spec.volumes:
            await self._state("preparing", "mounting volumes")
            self._volumes = await asyncio.to_thread(
                volumes.mount_all,
                self.spec.volumes,
                work_root=self._work_root,
                work=work,
                user=self.user,
                absolute_ok=self._absolute_paths,
            )
        if self._checkpoint is not None and self._checkpoint.spec.version:
            await self._state("preparing", f"restoring checkpoint {self._checkpoint.spec.version}")
            await self._checkpoint.restore()
        if any(c.files for c in self.spec.caches):
            await self._state("preparing", "restoring the cache")
            await restore_caches(self.spec.caches, work, fresh_url=self._fresh_cache_url, job=self.id, home=self._home)
        if self.user is not None:  # everything above was the runner's doing; from here on the job's
            await asyncio.to_thread(self.user.give, work)
            await asyncio.to_thread(self.user.give, self.dir / HOME_DIR)
        if self.spec.data:  # placed by the runner, read-only inputs staying root's (data.py)
            self._data_hold = await fetch_data(
                self.spec.data,
                work,
                cache_root=self._work_root / DATA_CACHE_DIR,
                page=self._data_page,
                fresh_url=self._fresh_data_url,
                report=lambda reason: self._state("preparing", reason),
                user=self.user,
            )
        if self.spec.environment is not None:
            await self._state("preparing", "preparing the environment")
            self.environment = await prepare_environment(
                self.spec.environment,
                root=self._environments_dir,
                checkout=work,
                env=self._job_env(),
                say=self._say,
                store=self,
                user=self.user,
            )
            if self.environment.built:  # for runners on other machines; awaited before the final state
                self._sharing = asyncio.create_task(share(self.environment, self, say=self._say_while_open))

    def _check_input_paths(self) -> None:
        """The runner (root) writes the inputs: for a job with a user of its
        own, only inside its working directory, never where that user could
        not write."""
        absolute = next((i.path for i in self.spec.inputs if i.path.startswith("/")), None)
        if self.user is not None and absolute is not None:
            raise InputError(
                f"could not fetch input {absolute}: a job runs as a user of its own on this machine (its runner is"
                " root) and gets its inputs inside its working directory only; use a relative path"
            )

    @property
    def _home(self) -> Path | None:
        """The job's home when it has a user of its own (``HOME``, ``~`` of its caches)."""
        return self.dir / HOME_DIR if self.user is not None else None

    def _enclose(self) -> None:
        """The job's folder is root's, and only its own user may pass through
        it (group = the job's gid, 0710): not another job's. Its home is its
        own, with a private temporary folder."""
        assert self.user is not None
        os.chown(self.dir, 0, self.user.gid)
        os.chmod(self.dir, 0o710)
        (self.dir / HOME_DIR / "tmp").mkdir(parents=True, mode=0o700)
        os.chmod(self.dir / HOME_DIR, 0o700)

    async def make_spare(self) -> None:
        """A clone of this job's repository made ahead for the next job (code.spare_checkout)."""
        await spare_checkout(self.spec.code, cache_dir=self._cache_dir)

    def _job_url(self, what: str, query: dict[str, str] | None = None) -> str:
        params = urlencode({"attempt": self.attempt, **(query or {})})
        return f"{self.spec.api_url.rstrip('/')}/runner/jobs/{self.id}/{what}/?{params}"

    def _fetch_secrets(self) -> JobSecrets:
        """GET the job's secrets (blocking); network errors and 5xx are
        retried, a refusal fails the job with the server's reason."""
        for attempt in range(1, SECRETS_ATTEMPTS + 1):
            try:
                return JobSecrets.model_validate(get_json(self._job_url("secrets"), token=self._token))
            except HttpError as e:
                if not e.recoverable or attempt == SECRETS_ATTEMPTS:
                    raise SecretsError(f"could not fetch the job's secrets: {e.server_message}") from e
                log.warning("job %s: fetching its secrets: %s (retrying)", self.id, e)
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def _input_page(self, path: str, after: str) -> InputPage:
        query = {"path": path, **({"after": after} if after else {})}
        return InputPage.model_validate(get_json(self._job_url("inputs", query), token=self._token))

    def _data_page(self, path: str, after: str) -> DataPage:
        query = {"path": path, **({"after": after} if after else {})}
        return DataPage.model_validate(get_json(self._job_url("data", query), token=self._token))

    def _fresh_data_url(self, path: str, file: str) -> str:
        body = {"path": path, "file": file}
        return str(post_json(self._job_url("data/url"), body, token=self._token)["url"])

    def _fresh_code_url(self, what: str) -> str:
        return self._fresh_url({"code": what})

    def _fresh_cache_url(self, cache: str, path: str) -> str:
        return self._fresh_url({"cache": cache, "file": path})

    def _fresh_input_url(self, artifact: str, path: str) -> str:
        return self._fresh_url({"input": artifact, "file": path})

    def _fresh_url(self, body: dict[str, object]) -> str:
        """A fresh signed URL for something AssignJob named (blocking: called
        from the download threads)."""
        url = f"{self.spec.api_url.rstrip('/')}/runner/jobs/{self.id}/urls/?attempt={self.attempt}"
        return str(post_json(url, body, token=self._token)["url"])

    async def _execute(self) -> int:
        if self._execution is not None:  # re-attached
            log.info("job %s: re-attached to its commands (shim pid %d)", self.id, self._execution.pid)
            self._start_metrics(self._execution)
            await self._state("running")
            return await self._wait_execution(self._execution)
        if not self._confirmed.is_set():
            log.info("job %s: ready, waiting for the server to confirm the acceptance", self.id)
            await self._confirmed.wait()
        if self._cancel_reason is not None or self._notice is not None:
            raise asyncio.CancelledError
        env_file = self.dir / "tmp" / "docker.env"
        try:
            self._save_spec()
            self._execution = await self._start(env_file)
            self._start_metrics(self._execution)
            if self._cancel_reason is not None:  # cancelled while the process was starting
                self._stop_execution()
            if self._interrupted_before_start:  # a notice while the process was starting
                self._execution.kill()
            self.phase = Lifecycle.RUNNING
            await self._state("running")
            return await self._wait_execution(self._execution)
        finally:
            env_file.unlink(missing_ok=True)

    async def _wait_execution(self, execution: Execution) -> int:
        if self._checkpoint is not None:
            self._checkpoint.start_periodic()
        for mount in self._mounts:
            mount.start_periodic()
        watching = self._watch_app()
        try:
            code = await execution.wait()
        finally:
            if watching is not None:
                watching.cancel()
            if self.metrics is not None:  # the file read to its end before the last frame
                await self.metrics.finish()
        log.info("job %s: process exited with %d", self.id, code)
        for mount in self._mounts:  # the final upload (a succeeded job) is the usual one
            await mount.stop_periodic()
        if self._checkpoint is not None:
            # The last state of the checkpoint, whatever the outcome (a stopped
            # or failed job may be retried from it).
            await self._checkpoint.stop_periodic()
            await self.sync_checkpoint("the commands ended")
        if self._stopper is not None and self.docker:
            await self._stopper  # a cancelled container is gone before the job ends
        return code

    def _save_spec(self) -> None:
        """``job.json``: the spec without what must not be at rest (the
        environment holds the workspace's secrets, the inputs', the code's
        and the restored checkpoint's URLs are signed) and is not needed once
        the commands run."""
        checkpoint = self.spec.checkpoint
        kept = self.spec.model_copy(
            update={
                "env": {},
                "inputs": [],
                "code": CodeSpec(kind=self.spec.code.kind, commit=self.spec.code.commit),
                "checkpoint": checkpoint.model_copy(update={"files": []}) if checkpoint is not None else None,
            }
        )
        path = self.dir / SPEC_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(kept.model_dump_json())
        os.replace(tmp, path)

    async def _start(self, env_file: Path) -> Execution:
        work = self.dir / "work"
        _make_artifact_folders(work, self.spec.artifacts, self.user)
        interrupt_dir = self.dir / INTERRUPT_DIR
        interrupt_dir.mkdir(exist_ok=True)
        metrics_dir = self.dir / METRICS_DIR
        metrics_dir.mkdir(mode=0o700, exist_ok=True)
        if self.user is not None:
            self.user.give(metrics_dir)
        self.metrics = self._new_metrics()  # before the output is read: its first lines are matched too
        job_vars = self._job_vars()
        if not self.docker:
            return await Execution.start(
                self.spec.commands,
                job_dir=self.dir,
                cwd=work,
                env=self._commands_env(),
                stream=self.stream,
                outlive=self._outlive,
                standby=self._standby,
                user=self.user,
                tap=self._tap,
            )
        # The container gets the job's variables only, not the runner's
        # (its PATH, HOME, … belong to the host).
        env = {
            **job_vars,
            "PYTHONUNBUFFERED": "1",
            INTERRUPT_FILE_VAR: f"{docker.INTERRUPT_MOUNT}/{INTERRUPT_FILE}",
            METRICS_FILE_VAR: f"{docker.METRICS_MOUNT}/{METRICS_FILE}",
        }
        pass_env = docker.write_env_file(env_file, env)
        argv = docker.run_argv(
            job=self.id,
            work=work,
            env_file=env_file,
            image=self.spec.image,
            script=script(self.spec.commands),
            pass_env=pass_env,
            interrupt_dir=interrupt_dir,
            metrics_dir=metrics_dir,
        )
        return await Execution.start(
            self.spec.commands,
            job_dir=self.dir,
            cwd=work,
            env=docker.client_env(env, pass_env),
            stream=self.stream,
            argv=argv,
            outlive=self._outlive,
            standby=self._standby,
            tap=self._tap,
        )

    def _commands_env(self) -> dict[str, str]:
        """The environment a bash job's commands get (its variables and
        secrets, PORT_n, the activated Python environment, the interrupt file)."""
        env = self._job_env()
        if self.environment is not None:
            env = self.environment.activate(env)
        env[INTERRUPT_FILE_VAR] = str(self.dir / INTERRUPT_DIR / INTERRUPT_FILE)
        env[METRICS_FILE_VAR] = str(self.dir / METRICS_DIR / METRICS_FILE)
        return env

    def _new_metrics(self) -> JobMetrics:
        return JobMetrics(
            self.spec, metrics_file=self.dir / METRICS_DIR / METRICS_FILE, work=self.dir / "work", user=self.user
        )

    def _start_metrics(self, execution: Execution) -> None:
        """Sample the commands' process tree and follow their metrics file from now on."""
        if self.metrics is not None:
            self.metrics.start(execution.pid)

    def _tap(self, texts: list[str]) -> None:
        if self.metrics is not None:
            self.metrics.lines(texts)

    def session_context(self) -> SessionContext:
        """What a session into the job (SSH, a terminal) runs with: the
        job's working tree, the environment its commands got, and its user.
        The session's processes carry the job's mark, so they end with it
        (``process.sweep``; on a root runner every process of its uid goes).
        Raises ``NoSession`` when the job is not running bash commands."""
        if self.docker:
            raise NoSession(f"job {self.id} runs in a container: sessions into docker jobs are not supported yet")
        if self._execution is None or self.phase != Lifecycle.RUNNING:
            raise NoSession(f"job {self.id} is not running (it is {self.phase.value})")
        if self._resumed is not None:  # its job.json kept no variable: they are read from its process
            env = commands_environ(self._execution.pid)
            if env is None:
                raise NoSession(f"job {self.id}: the environment of its commands cannot be read")
        else:
            env = {**self._commands_env(), MARK_VAR: self._execution.mark}
        if self.user is None:
            if jobuser.isolating():  # a root runner never lets a session run as root
                raise NoSession(f"job {self.id}: its user is held by another runner process")
            return SessionContext(cwd=self.dir / "work", env=env)
        return SessionContext(cwd=self.dir / "work", env=env, uid=self.user.uid, gid=self.user.gid)

    async def _say(self, stream: str, lines: list[str]) -> None:
        await self.stream.put(stream, lines)

    async def _say_while_open(self, stream: str, lines: list[str]) -> None:
        """Into the job's log while its commands run; the runner's log after."""
        if self.stream.closed:
            for line in lines:
                log.info("job %s: %s", self.id, line)
        else:
            await self.stream.put(stream, lines)

    # The workspace's packed environments (environments.Store), through the server.

    async def find(self, key: str) -> tuple[str, int, str] | None:
        try:
            found = await asyncio.to_thread(get_json, self._job_url("environment", {"key": key}), token=self._token)
        except HttpError as e:
            if e.status == 404:
                return None
            raise
        return str(found["url"]), int(found["size"]), str(found["sha256"])

    async def begin(self, key: str, size: int, sha256: str) -> tuple[str, dict[str, str]] | None:
        body = {"key": key, "size": size, "sha256": sha256}
        answer = await asyncio.to_thread(post_json, self._job_url("environment"), body, token=self._token)
        if not answer or answer.get("url") is None:
            return None
        return str(answer["url"]), {str(k): str(v) for k, v in (answer.get("headers") or {}).items()}

    async def done(self, key: str) -> None:
        await asyncio.to_thread(post_json, self._job_url("environment/done"), {"key": key}, token=self._token)

    def _job_vars(self) -> dict[str, str]:
        # The workflow's env wins, as on the server before v3; both win over the trackers' run ids.
        return {**job_metrics_env(self.id), **self._secrets.env, **self.spec.env}

    def _job_env(self) -> dict[str, str]:
        if self.user is None:
            return job_env(self._job_vars(), pip_cache_dir=self._pip_cache_dir)
        # A cache shared by jobs of different users would let one plant files for the next:
        # pip's goes in the job's home.
        home = self.dir / HOME_DIR
        own = {"HOME": str(home), "USER": jobuser.JOB_NAME, "LOGNAME": jobuser.JOB_NAME, "TMPDIR": str(home / "tmp")}
        return job_env({**own, **self._job_vars()})

    def _stop_execution(self) -> None:
        if self._stopper is None:
            self._stopper = asyncio.get_running_loop().create_task(self._terminate())

    async def _terminate(self) -> None:
        """SIGTERM the process group (the docker client passes it on to the
        container), SIGKILL after the grace period; a container is then killed
        too, since killing its client does not stop it."""
        assert self._execution is not None
        await self._execution.terminate(self._cancel_grace)
        if self.docker:
            await docker.kill_container(self.id)

    async def _upload(self, code: int) -> JobState:
        await self._drain()
        self.phase = Lifecycle.UPLOADING
        await self._state("uploading")
        reading = self.user.reading if self.user is not None else _call
        try:
            await asyncio.to_thread(
                reading,
                upload_artifacts,
                [a.path for a in self.spec.artifacts],
                work=self.dir / "work",
                absolute_ok=self._absolute_paths,
                job=self.id,
                attempt=self.attempt,
                api_url=self.spec.api_url,
                token=self._token,
            )
        except ArtifactError as e:
            where, until = kept.keep(
                self._work_root,
                self.dir,
                job=self.id,
                attempt=self.attempt,
                seconds=self._keep_failed_seconds,
                why=str(e),
                artifacts=[a.path for a in self.spec.artifacts],
                api_url=self.spec.api_url,
                job_token=self.spec.job_token,
                uid=self.user.uid if self.user is not None else None,
                retry=e.unanswered,
            )
            final = self.final("failed", None, f"{e}; {where}" if where else str(e))
            return final.model_copy(update={"kept_until": until})
        return self.final("succeeded", code)

    async def _finish(self, state: str, code: int | None, reason: str) -> JobState:
        if not self.stream.closed:
            self.stream.close()
        await self._drain()
        return self.final(state, code, reason)

    def final(self, state: str, code: int | None, reason: str = "") -> JobState:
        lines, digest = self.stream.shipped
        return JobState(
            job=self.id,
            attempt=self.attempt,
            state=state,  # type: ignore[arg-type]
            exit_code=code,
            reason=reason,
            log_lines=lines,
            log_digest=digest,
            environment=self.environment.report() if self.environment is not None else None,
        )

    async def _drain(self) -> None:
        # The final state promises every line is stored, so wait for the acks
        # however long it takes; a connection that stops acknowledging for
        # drain_timeout is replaced, and the lines are resent on the new one.
        self.phase = Lifecycle.DRAINING
        while not await self.stream.wait_drained(self._drain_timeout):
            log.warning("job %s: logs not acknowledged after %.0fs, reconnecting", self.id, self._drain_timeout)
            self._on_drain_stuck()

    async def _state(self, state: str, reason: str = "") -> None:
        # With ``running``, the environment the commands run in (also sent with the final state).
        environment = self.environment.report() if self.environment is not None and state == "running" else None
        await self._report(
            JobState(job=self.id, attempt=self.attempt, state=state, reason=reason, environment=environment)  # type: ignore[arg-type]
        )


def _write_interrupt_file(path: Path, notice: Notice) -> None:
    """Shell-sourceable (``. "$TRAINYARD_INTERRUPT_FILE"``), written whole or not at all."""
    at = datetime.fromtimestamp(notice.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = (
        f"TRAINYARD_INTERRUPT_AT={at}\n"
        f"TRAINYARD_INTERRUPT_AT_UNIX={notice.at:.0f}\n"
        f"TRAINYARD_INTERRUPT_ACTION={notice.action or 'terminate'}\n"
    )
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        log.error("could not write %s: %s", path, e)


def commands_environ(shim_pid: int) -> dict[str, str] | None:
    """The environment the job's commands started with: that of the shim's
    child (bash), as /proc shows it; None when it is gone or unreadable."""
    try:
        child = int(Path(f"/proc/{shim_pid}/task/{shim_pid}/children").read_text().split()[0])
        raw = Path(f"/proc/{child}/environ").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def environments_dir(work_dir: Path) -> Path:
    """Shared by the jobs of every runner given the same folder (the local
    backend: one per workspace on the server's host)."""
    return Path(os.environ.get(ENVIRONMENTS_VAR) or work_dir / "environments")


def _call(fn: Callable[..., object], *args: object, **kwargs: object) -> object:
    return fn(*args, **kwargs)


def _reset_dir(path: Path) -> None:
    # A job id seen again (re-assigned after a runner restart) starts clean.
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _make_artifact_folders(work: Path, artifacts: list[ArtifactSpec], user: JobUser | None = None) -> None:
    """An artifact path that names a folder (its last part has no ``.``:
    ``./output``, not ``./model.pt``) exists, empty, before the commands
    start, as in dstack 0.x (whose examples write ``output/hello.txt`` at
    once), the job's user's. A path that is already there is left as it is."""
    for artifact in artifacts:
        folder = work / artifact.path
        if "." in PurePosixPath(artifact.path).name or folder.exists() or folder.is_symlink():
            continue
        if folder.resolve().is_relative_to(work.resolve()):
            top = next(p for p in reversed([folder, *folder.parents]) if not p.exists())
            folder.mkdir(parents=True, exist_ok=True)
            if user is not None:
                user.give(top)
