"""Who may open an app, and the two credentials of the apps origin.

1. ``app_open`` (the dashboard's ``/open/…``, signed in): the session is
   granted (``grant_session``: role, job state, runner, caps) and a code
   made, good once and for ``CODE_SECONDS``, that the app's origin swaps for
2. the app pass (``code_redeem``): a cookie of that origin only naming the
   app, the user, the attempt, the port and the user's dashboard session.

Both are sealed (encrypted and authenticated with the server's secret), so
Redis carries no authority (decision 0090): it holds only which codes were
used (a write there can spend a code, never make one) and the granted
session left for the app's first stream, which is used only if the
database says it is this user's, for this app, and still unused.
3. ``pass_refusal``, on every request the proxy forwards: the dashboard
   session is still signed in, the user still a member who may run jobs,
   the attempt still the job's running one. Signing out of the dashboard,
   losing the role or the attempt ending closes the app.

The pass never leaves the apps origin's proxy: it is HttpOnly and taken out
of every request before it reaches the job.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import asdict, dataclass

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

from backend.access.models import AccessSession, SessionKind, SessionState
from backend.access.services.sessions import APP_PROXY, AccessRefused, grant_session
from backend.access.webapps.auth import app_request_headers
from backend.access.webapps.origin import AppsOrigin, app_label
from backend.accounts.models import ROLE_RANK, Role, User, Workspace
from backend.accounts.selectors import AccessLost, access_lost, membership_get
from backend.core.redis import redis_client
from backend.runs.models import Attempt, AttemptStatus, Job, Run

CODE_SECONDS = 60
PASS_SECONDS = 12 * 3600  # at most; never past the dashboard session's own expiry
FRESH_MARGIN_SECONDS = 5  # the granted session is left for the first stream until shortly before it lapses
CLIENT_LABEL = APP_PROXY
_USED_KEY = "apps:code-used:"
MAX_CODE = 4000
_FRESH_KEY = "apps:fresh:"


@dataclass(frozen=True)
class AppPass:
    """What the app cookie says (sealed): the app and everything its checks need."""

    label: str
    user_id: int
    workspace_id: str
    workspace_slug: str
    run_id: str
    run_name: str
    job_id: str
    job_name: str
    attempt_id: str
    port: int
    session_key: str
    expires_at: int

    @property
    def says(self) -> str:
        """The app, for people: "port 8888 in job train of run funny-cat-1"."""
        return f"port {self.port} in job {self.job_name} of run {self.run_name}"


@dataclass(frozen=True)
class Redeemed:
    app_pass: AppPass
    path: str


def app_open(
    *,
    apps: AppsOrigin,
    workspace: Workspace,
    user: User,
    run: Run,
    job: Job,
    port: int,
    session_key: str,
    session_expires_at: float,
    client_address: str,
    path: str = "/",
) -> str:
    """The URL that opens the app (``<app origin>/_trainyard/enter?code=…``).
    Raises ``AccessRefused`` (the grant's refusals; a port the job does not serve)."""
    if port not in (job.ports or []):
        served = ", ".join(str(p) for p in job.ports) if job.ports else "none (the workflow declares no ports:)"
        raise AccessRefused(404, f"job {job.name} serves no port {port}: its ports are {served}.")
    grant = grant_session(
        workspace=workspace,
        user=user,
        run=run,
        job_name=job.name,
        kind="port",
        port=port,
        client_address=client_address,
        client_label=CLIENT_LABEL,
    )
    session = grant.session
    label = app_label(secret=settings.SECRET_KEY, attempt_id=str(session.attempt_id), port=port)
    app_pass = AppPass(
        label=label,
        user_id=user.pk,
        workspace_id=str(workspace.pk),
        workspace_slug=workspace.slug,
        run_id=str(run.pk),
        run_name=run.name,
        job_id=str(job.pk),
        job_name=job.name,
        attempt_id=str(session.attempt_id),
        port=port,
        session_key=session_key,
        expires_at=int(min(time.time() + PASS_SECONDS, session_expires_at)),
    )
    record = {
        "pass": asdict(app_pass),
        "path": path,
        "session": str(session.pk),
        "session_until": grant.expires_at.timestamp(),
    }
    code = _fernet().encrypt(json.dumps(record).encode()).decode()
    return f"{apps.origin(label)}/_trainyard/enter?code={code}"


def code_redeem(*, code: str, label: str) -> Redeemed | None:
    """The pass a code was made for, once; None for a code not made here,
    older than ``CODE_SECONDS``, used already or made for another app. The
    session granted with it is left for the app's first stream
    (``fresh_session``)."""
    if not code or len(code) > MAX_CODE:
        return None
    try:
        record = json.loads(_fernet().decrypt(code.encode(), ttl=CODE_SECONDS))
        app_pass = AppPass(**record["pass"])
    except (InvalidToken, ValueError, TypeError, KeyError):
        return None
    if app_pass.label != label:
        return None
    if not redis_client().set(_USED_KEY + _digest(code), b"1", nx=True, ex=CODE_SECONDS + 5):
        return None
    unused_for = int(record["session_until"] - time.time()) - FRESH_MARGIN_SECONDS
    if unused_for > 0:
        redis_client().set(_fresh_key(app_pass), record["session"], ex=unused_for)
    return Redeemed(app_pass=app_pass, path=record["path"])


def pass_seal(app_pass: AppPass) -> str:
    return _fernet().encrypt(json.dumps(asdict(app_pass)).encode()).decode()


def pass_unseal(value: str, *, label: str) -> AppPass | None:
    """The pass of a cookie value, if sealed here, for this app and not expired."""
    try:
        app_pass = AppPass(**json.loads(_fernet().decrypt(value.encode())))
    except (InvalidToken, ValueError, TypeError):
        return None
    if app_pass.label != label or app_pass.expires_at <= time.time():
        return None
    return app_pass


@dataclass(frozen=True)
class Checked:
    """A pass checked: ``refusal`` says why it no longer opens its app (for
    people), else ``headers`` are what the app gets on each request for the user."""

    refusal: str | None
    headers: dict[str, str]


def pass_check(app_pass: AppPass) -> Checked:
    refusal = pass_refusal(app_pass)
    if refusal is not None:
        return Checked(refusal=refusal, headers={})
    job = Job.objects.get(pk=app_pass.job_id)
    return Checked(refusal=None, headers=app_request_headers(job, app_pass.port))


def pass_refusal(app_pass: AppPass) -> str | None:
    """Why the pass no longer opens its app (for people), or None."""
    user = User.objects.filter(pk=app_pass.user_id).first()
    if user is None:
        return "the account is gone"
    lost = access_lost(user=user, token=None, session_key=app_pass.session_key, workspace_slug=app_pass.workspace_slug)
    if lost is AccessLost.SIGNED_OUT:
        return f"{lost.value}. Sign in to the dashboard and open the app from the job's page again"
    if lost is not None:
        return lost.value
    membership = membership_get(user=user, workspace_slug=app_pass.workspace_slug)
    if membership is None or ROLE_RANK[Role(membership.role)] < ROLE_RANK[Role.MEMBER]:
        return "only members and admins of the workspace open its jobs' apps"
    if not _attempt_running(app_pass):
        return (
            f"job {app_pass.job_name} of run {app_pass.run_name} no longer runs this attempt; "
            "open the app again from the job's page if it runs again"
        )
    return None


def fresh_session(app_pass: AppPass) -> str | None:
    """The session granted at ``app_open``, once, if it is still this
    user's unused grant into this very app."""
    raw = redis_client().getdel(_fresh_key(app_pass))
    if raw is None:
        return None
    session_id = raw.decode() if isinstance(raw, bytes) else str(raw)
    unused = AccessSession.objects.filter(
        pk=session_id,
        user_id=app_pass.user_id,
        attempt_id=app_pass.attempt_id,
        kind=SessionKind.PORT,
        port=app_pass.port,
        state=SessionState.GRANTED,
    )
    return session_id if unused.exists() else None


def stream_grant(app_pass: AppPass) -> str:
    """A new session into the pass's app for one more stream (the grant's
    own checks and caps apply); raises ``AccessRefused``."""
    workspace = Workspace.objects.get(pk=app_pass.workspace_id)
    user = User.objects.get(pk=app_pass.user_id)
    run = Run.objects.for_workspace(workspace).get(pk=app_pass.run_id)
    grant = grant_session(
        workspace=workspace,
        user=user,
        run=run,
        job_name=app_pass.job_name,
        kind="port",
        port=app_pass.port,
        client_label=CLIENT_LABEL,
    )
    if str(grant.session.attempt_id) != app_pass.attempt_id:
        raise AccessRefused(409, f"job {app_pass.job_name} runs another attempt now: open the app again.")
    return str(grant.session.pk)


def _attempt_running(app_pass: AppPass) -> bool:
    attempt = Attempt.objects.filter(pk=app_pass.attempt_id, status=AttemptStatus.RUNNING).select_related("job").first()
    return attempt is not None and attempt.job.attempt == attempt.number and str(attempt.job_id) == app_pass.job_id


def _fresh_key(app_pass: AppPass) -> str:
    return f"{_FRESH_KEY}{app_pass.label}:{app_pass.user_id}"


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def _fernet() -> Fernet:
    key = hashlib.sha256(b"trainyard-app-pass:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))
