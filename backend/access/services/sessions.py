"""Sessions into a running job: granting one, ending one, and ending them all
when their attempt ends (docs/ACCESS.md).

A grant is refused with an ``AccessRefused`` whose message names what to do.
A granted session is bound to the job's current attempt on its instance; its
runner is told to serve it (``OpenRelay``, after commit) and dials the relay.
Every session's start and end are in the workspace's audit trail
(``services/audit.py``).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from trainyard_runner import protocol

from backend.access.models import LIVE_SESSION, AccessSession, SessionKind, SessionState
from backend.access.services.audit import session_audit_end
from backend.access.services.notify import close_relay_on_commit, end_ends_on_commit
from backend.accounts import selectors as accounts_selectors
from backend.accounts.models import ROLE_RANK, Role, User, Workspace
from backend.clouds.models import Instance
from backend.core.errors import ApplicationError
from backend.core.tokens import SESSION_TOKEN_PREFIX, hash_token
from backend.runs.events import send_to_channel
from backend.runs.models import Attempt, AttemptStatus, Job, JobStatus, Run
from backend.runs.names import ssh_host_alias
from backend.runs.reasons import TerminationReason

logger = logging.getLogger(__name__)

APP_PROXY = "app proxy"  # the client label of the apps proxy's connections (backend/access/webapps)
GRANT_SECONDS = 60  # the client's first connect must come within this long of the grant
LIVE_RUNNER = ("idle", "busy")  # instance statuses whose runner is connected

# The close codes of the client's websocket (docs/ACCESS.md).
CLOSE_NORMAL = 1000
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_IDLE = 4408
CLOSE_ATTEMPT_ENDED = 4409
CLOSE_ENDED_BY_ADMIN = 4410
CLOSE_TOO_MANY = 4429

SPOT_REASON = "the machine is being reclaimed (spot); the job resumes elsewhere — start a new session then"


class AccessRefused(ApplicationError):
    """A grant refused: ``status_code`` is the HTTP status, the message says what to do."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail, status_code=status)


@dataclass(frozen=True)
class Grant:
    """A granted session. ``token`` is the client's credential, shown once."""

    session: AccessSession
    token: str
    expires_at: datetime
    run: str
    job: str
    attempt: int
    host_alias: str
    host_key: str


def grant_session(
    *,
    workspace: Workspace,
    user: User,
    run: Run,
    job_name: str | None,
    kind: str,
    port: int | None = None,
    client_address: str = "",
    client_label: str = "",
) -> Grant:
    """1. The user may run jobs here (a member or an admin).
    2. The job (named, or the run's only running one) runs on a live
       runner that serves sessions, on its current attempt.
    3. The caps: sessions per user and per job.
    4. The session is written, and its runner told to serve it after commit."""
    _check_role(workspace, user)
    _check_kind(kind, port)
    job = _job_of(run, job_name)
    with transaction.atomic():
        job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
        attempt, instance = _serving(job)
        keys = _keys_for(user) if kind == SessionKind.SSH else []
        _check_caps(user, job, client_label)
        token = SESSION_TOKEN_PREFIX + secrets.token_urlsafe(32)
        relay_key = secrets.token_urlsafe(32)
        session = AccessSession.objects.create(
            workspace=workspace,
            user=user,
            job=job,
            attempt=attempt,
            instance=instance,
            kind=kind,
            port=port,
            token_hash=hash_token(token),
            relay_key_hash=hash_token(relay_key),
            grant_expires_at=timezone.now() + timedelta(seconds=GRANT_SECONDS),
            client_address=client_address or None,
            client_label=client_label[:100],
        )
        fields = {"session": str(session.pk), "job": str(job.pk), "kind": kind, "port": port, "keys": keys}
        frame = protocol.OpenRelay.model_validate({**fields, "relay_key": relay_key})
        channel = instance.channel_name
        transaction.on_commit(lambda: _to_runner(channel, frame))
    return Grant(
        session=session,
        token=token,
        expires_at=session.grant_expires_at,
        run=run.name,
        job=job.name,
        attempt=attempt.number,
        host_alias=host_alias(run, job),
        host_key=instance.ssh_host_key if kind == SessionKind.SSH else "",
    )


def end_session(session_id: UUID | str, reason: str, *, code: int = CLOSE_NORMAL) -> bool:
    """End a live session (a compare-and-set: once). Both ends of its relay
    are told (they say ``reason`` to their sockets and close, the client's
    with ``code``); its runner stops serving it. False if it had ended."""
    now = timezone.now()
    with transaction.atomic():
        ended = AccessSession.objects.filter(pk=session_id, state__in=LIVE_SESSION).update(
            state=SessionState.ENDED, ended_at=now, end_reason=reason[:500]
        )
        if not ended:
            return False
        session = AccessSession.objects.select_related("instance").get(pk=session_id)
        end_ends_on_commit(session, reason=reason, code=code)
        close_relay_on_commit(session, reason=reason)
        if not session.client_channel and not session.runner_channel:
            session_audit_end(session)  # no end attached: none will close it
    logger.info("session %s ended: %s", session_id, reason)
    return True


def sessions_end_for_attempt(attempt_id: str, reason: str, message: str) -> None:
    """An attempt ended (``runs.events.on_attempt_end``): its sessions end,
    with a message saying why and, at a spot notice, what to do."""
    live = AccessSession.objects.filter(attempt_id=attempt_id, state__in=LIVE_SESSION).values_list("pk", flat=True)
    said = _attempt_end_words(reason, message)
    for session_id in list(live):
        end_session(session_id, said, code=CLOSE_ATTEMPT_ENDED)


def host_alias(run: Run, job: Job) -> str:
    """The job's ``Host`` in ``trainyard ssh-config`` (``names.ssh_host_alias``)."""
    return ssh_host_alias(run.name, job.name, jobs_in_run=run.jobs.count())


# ------------------------------------------------------------------ checks


def _check_role(workspace: Workspace, user: User) -> None:
    membership = accounts_selectors.membership_get(user=user, workspace_slug=workspace.slug)
    if membership is None:
        raise AccessRefused(404, f"Workspace {workspace.slug!r} not found.")
    if ROLE_RANK[Role(membership.role)] < ROLE_RANK[Role.MEMBER]:
        raise AccessRefused(
            403, f"Your role in {workspace.slug} is {membership.role}: only members and admins open sessions into jobs."
        )


def _check_kind(kind: str, port: int | None) -> None:
    if kind not in SessionKind.values:
        raise AccessRefused(400, f"kind must be one of {', '.join(SessionKind.values)}, not {kind!r}.")
    if kind == SessionKind.PORT and (port is None or not 1 <= port <= 65535):
        raise AccessRefused(400, "a port session names the job's port: a number from 1 to 65535.")
    if kind != SessionKind.PORT and port is not None:
        raise AccessRefused(400, f"a {kind} session takes no port (forward one with kind port).")


def _job_of(run: Run, job_name: str | None) -> Job:
    jobs = list(run.jobs.order_by("created_at"))
    if job_name:
        named = [j for j in jobs if j.name == job_name]
        if not named:
            names = ", ".join(j.name for j in jobs)
            raise AccessRefused(404, f"run {run.name} has no job {job_name!r}; its jobs: {names}.")
        return named[0]
    if len(jobs) == 1:
        return jobs[0]
    running = [j for j in jobs if j.status == JobStatus.RUNNING]
    if len(running) == 1:
        return running[0]
    names = ", ".join(j.name for j in (running or jobs))
    raise AccessRefused(400, f"run {run.name} has {len(running) or len(jobs)} jobs: name one (--job) of {names}.")


def _serving(job: Job) -> tuple[Attempt, Instance]:
    """The job's current attempt and its instance, when a session can reach
    them; else the refusal that says what to do."""
    _check_job_state(job)
    if (job.spec or {}).get("provider") == "docker":
        raise AccessRefused(
            409, f"job {job.name} runs in a Docker container: sessions into Docker jobs are not supported yet."
        )
    attempt = Attempt.objects.filter(job=job, number=job.attempt, status=AttemptStatus.RUNNING).first()
    instance = Instance.objects.filter(pk=job.instance_id).first() if job.instance_id else None
    if attempt is None or instance is None or attempt.instance_id != instance.pk:
        raise AccessRefused(409, f"job {job.name} is starting: wait until it runs and try again.")
    if instance.status not in LIVE_RUNNER or not instance.channel_name:
        raise AccessRefused(
            409, f"the runner of job {job.name} ({instance.name}) is not connected now: try again when it is back."
        )
    if instance.relay_version < protocol.RELAY_VERSION:
        raise AccessRefused(
            409,
            f"the runner of job {job.name} ({instance.name}, trainyard-runner {instance.runner_version or '?'}) "
            "cannot serve sessions: upgrade trainyard-runner on that machine to this server's release "
            "(its wheel is served at /runner/wheels/) and restart it.",
        )
    return attempt, instance


def _check_job_state(job: Job) -> None:
    if job.cached_from_id is not None:
        raise AccessRefused(
            409, f"job {job.name} was served from the cache and never ran: there is nothing to open a session into."
        )
    if job.status in (JobStatus.PENDING, JobStatus.ASSIGNED):
        raise AccessRefused(409, f"job {job.name} is {job.status}: wait until it runs (trainyard ps) and try again.")
    if job.status == JobStatus.STOPPING:
        raise AccessRefused(409, f"job {job.name} is stopping: sessions reach running jobs only.")
    if job.status != JobStatus.RUNNING:
        raise AccessRefused(
            409,
            f"job {job.name} has finished ({job.status}): sessions reach running jobs only; "
            "re-run it (trainyard rerun) to get a running one.",
        )


def _keys_for(user: User) -> list[str]:
    """The grantee's registered SSH public keys (``accounts.selectors.ssh_public_keys``)."""
    keys = accounts_selectors.ssh_public_keys(user)[: protocol.MAX_SESSION_KEYS]
    if not keys:
        raise AccessRefused(
            409,
            "you have no SSH key registered in Trainyard: register one: trainyard ssh-key add ~/.ssh/id_ed25519.pub",
        )
    return keys


def _check_caps(user: User, job: Job, client_label: str) -> None:
    """A person's own sessions (shells, terminals, forwards) and the apps
    proxy's connections for them are counted apart: one browser tab on a
    job's web app holds several connections, and must not use up the
    shells a person may open."""
    live = AccessSession.objects.filter(state__in=LIVE_SESSION)
    if client_label == APP_PROXY:
        per_user, theirs, what = (
            settings.TRAINYARD["APP_STREAMS_PER_USER"],
            live.filter(client_label=APP_PROXY),
            "connections to jobs' web apps",
        )
    else:
        per_user, theirs, what = (
            settings.TRAINYARD["SESSIONS_PER_USER"],
            live.exclude(client_label=APP_PROXY),
            "live sessions",
        )
    if theirs.filter(user=user).count() >= per_user:
        raise AccessRefused(
            429, f"you have {per_user} {what}, the most one user may hold: end one (or wait) and try again."
        )
    per_job = settings.TRAINYARD["SESSIONS_PER_JOB"]
    if live.filter(job=job).count() >= per_job:
        raise AccessRefused(429, f"job {job.name} has {per_job} live sessions, the most one job may have: try later.")


# ------------------------------------------------------------------ helpers


def _to_runner(channel: str, frame: protocol.OpenRelay) -> None:
    send_to_channel(channel, {"type": "runner.frame", "frame": frame.model_dump_json()})


def _attempt_end_words(reason: str, message: str) -> str:
    if reason == TerminationReason.INTERRUPTED and "runner stopped" not in message:
        return SPOT_REASON
    if reason == TerminationReason.DONE:
        return "the job's commands ended: its session ends with them"
    said = TerminationReason(reason).label if reason in TerminationReason.values else reason
    return f"the job's attempt ended ({message or said}): its session ends with it"
