"""Authentication and fencing of the runner's REST calls (``api/v1/runner/jobs/…``).

A runner calls with its machine's token (``Authorization: Bearer <runner
token>``) and names the attempt it holds (``?attempt=N``, runner protocol 2).
``RunnerTokenAuthentication`` turns the token into the runner's ``Instance``;
the permissions let a call through only for the job's current attempt on that
instance (fencing: ``Job.objects.held_by``), or, for the checkpoint uploads of
an attempt interrupted at a notice, that attempt while it winds down; for
the artifact uploads of a job that failed because its upload failed, the
attempt whose files the caller's machine keeps (``Job.kept_until`` in the
future, ``runs.lifecycle.kept``). Every endpoint refuses with the same statuses and messages (docs/API.md):

- 401 ``Unknown runner token.``: no token, an unknown one, or one whose
  instance has ended;
- 400 ``Say which attempt: …``: no ``?attempt=N``;
- 404 ``No such active job on this runner.``;
- 409 ``Attempt N of this job is no longer current (attempt M is): stop it.``
- 401 ``This attempt's job token is missing or wrong: …``: an attempt that
  has a job token (``lifecycle/jobtoken.py``) is reached only with
  ``Bearer <runner token>.<job token>``, never with the runner's token alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar
from uuid import UUID

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from backend.accounts.auth import token_from_header
from backend.clouds.models import Instance
from backend.clouds.services.instances import instance_for_token
from backend.core.errors import ApplicationError, NotFound
from backend.runs.lifecycle.jobtoken import job_token_matches
from backend.runs.lifecycle.kept import job_kept
from backend.runs.lifecycle.transitions import attempt_winding_down
from backend.runs.models import ACTIVE_JOB, Attempt, Job


@dataclass(frozen=True)
class RunnerPrincipal:
    """``request.user`` of a runner's call: the runner of ``instance``.
    Not a Django user, so no user endpoint accepts it."""

    instance: Instance
    job_token: str = ""  # the attempt's token the call carries after "." ("" for none)
    is_authenticated: ClassVar[bool] = True
    is_anonymous: ClassVar[bool] = False

    @property
    def pk(self) -> UUID:
        """The runner's identity where a user's id is asked for (rate limits count by it)."""
        return self.instance.pk


class RunnerTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer <runner token>`` of a live instance:
    ``request.user`` is its ``RunnerPrincipal``, ``request.auth`` the
    ``Instance``. The runner endpoints take no other credential, so a missing
    or wrong one is refused here (401), not passed on to another scheme."""

    def authenticate(self, request: Request) -> tuple[RunnerPrincipal, Instance]:
        token = token_from_header(request.META.get("HTTP_AUTHORIZATION", ""))
        # A runner token has no "." (tyrun_ and URL-safe base64): what follows one is a job token.
        runner_token, _, job_token = (token or "").partition(".")
        instance = instance_for_token(token=runner_token) if runner_token else None
        if instance is None:
            raise exceptions.AuthenticationFailed("Unknown runner token.")
        return RunnerPrincipal(instance, job_token[:128]), instance

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class RunnerTokenScheme(OpenApiAuthenticationExtension):
    """The runner endpoints' security scheme in the OpenAPI schema."""

    target_class = RunnerTokenAuthentication
    name = "runnerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "A runner's own token (tyrun_…)."}


@dataclass(frozen=True)
class RunnerCall:
    """Who calls and about which attempt: the runner's instance, the
    ``?attempt=N`` it names and the job token it carries."""

    instance: Instance
    attempt: int
    job_token: str = ""


@dataclass(frozen=True)
class Held:
    """The job of the URL as the calling runner holds it: ``attempt`` is the
    job's current attempt on the runner's instance, or (``winding_down``) one
    interrupted there whose checkpoint the runner still syncs, or (``kept``)
    the failed job's last attempt, whose files the runner keeps and may
    still upload as its artifacts."""

    job: Job
    attempt: int
    winding_down: bool
    kept: bool = False


class NamesAttempt(BasePermission):
    """A runner (``RunnerTokenAuthentication``) naming an attempt
    (``?attempt=N``; 400 without). Sets ``view.call``."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        _runner_view(view).call = runner_call(request)
        return True


class HoldsCurrentAttempt(BasePermission):
    """The attempt named is the current one of the URL's job on the caller's
    instance (404 if the job is not active there, 409 if another attempt is
    current). Sets ``view.call`` and ``view.held``."""

    winding_down_ok: ClassVar[bool] = False
    kept_ok: ClassVar[bool] = False

    def has_permission(self, request: Request, view: APIView) -> bool:
        runner_view = _runner_view(view)
        runner_view.call = runner_call(request)
        job_id = str(view.kwargs["job"])
        runner_view.held = job_held(
            runner_view.call, job_id=job_id, winding_down_ok=self.winding_down_ok, kept_ok=self.kept_ok
        )
        return True


class HoldsCurrentOrWindingDownAttempt(HoldsCurrentAttempt):
    """As ``HoldsCurrentAttempt``, or the attempt named was interrupted at a
    notice on the caller's instance and may still sync the job's checkpoint
    (until the machine's deadline: ``attempt_winding_down``)."""

    winding_down_ok = True


class HoldsCurrentOrKeptAttempt(HoldsCurrentAttempt):
    """As ``HoldsCurrentAttempt``, or the attempt named is the failed job's
    last one on the caller's instance, whose files that runner keeps
    (``job_kept``): it may upload that attempt's declared artifacts."""

    kept_ok = True


class HoldsUploadingAttempt(HoldsCurrentAttempt):
    """Any attempt that may be uploading on the caller's instance: current,
    winding down or kept (the views narrow what each may reach)."""

    winding_down_ok = True
    kept_ok = True


class HoldsKeptAttempt(NamesAttempt):
    """Only an attempt whose files the caller's instance keeps, or kept
    until a time now past (404 otherwise)."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        runner_view = _runner_view(view)
        call = runner_view.call = runner_call(request)
        job_id = str(view.kwargs["job"])
        job = job_kept(job_id=job_id, instance_id=str(call.instance.pk), attempt=call.attempt, expired_ok=True)
        if job is None:
            raise NotFound("No job whose files this runner keeps.")
        _check_job_token(call, job_id)
        runner_view.held = Held(job=job, attempt=runner_view.call.attempt, winding_down=False, kept=True)
        return True


class RunnerAPIView(APIView):
    """Authenticated by the runner's own token; only its active jobs."""

    authentication_classes = [RunnerTokenAuthentication]
    permission_classes = [HoldsCurrentAttempt]
    # Set by the permissions before the handler runs.
    call: RunnerCall
    held: Held


def runner_call(request: Request) -> RunnerCall:
    """The calling runner's instance and the attempt it names; 400 without
    ``?attempt=N`` (decimal digits, at most 9)."""
    instance = request.auth
    if not isinstance(instance, Instance):  # a view without RunnerTokenAuthentication
        raise exceptions.NotAuthenticated()
    attempt = request.query_params.get("attempt", "")
    if not attempt.isdecimal() or len(attempt) > 9:  # an attempt's number is a database integer
        raise ApplicationError("Say which attempt: ?attempt=N (runner protocol 2).", status_code=400)
    principal = request.user
    job_token = principal.job_token if isinstance(principal, RunnerPrincipal) else ""
    return RunnerCall(instance=instance, attempt=int(attempt), job_token=job_token)


def job_held(call: RunnerCall, *, job_id: str, winding_down_ok: bool, kept_ok: bool = False) -> Held:
    """The job as ``call`` holds it (fencing), or the refusal: 404 when the
    job is not active on the caller's instance, 409 when another attempt is."""
    instance_id = str(call.instance.pk)
    if winding_down_ok and attempt_winding_down(job_id=job_id, instance_id=instance_id, attempt=call.attempt):
        _check_job_token(call, job_id)
        return Held(job=Job.objects.get(pk=job_id), attempt=call.attempt, winding_down=True)
    if kept_ok and (kept := job_kept(job_id=job_id, instance_id=instance_id, attempt=call.attempt)) is not None:
        _check_job_token(call, job_id)
        return Held(job=kept, attempt=call.attempt, winding_down=False, kept=True)
    active = Job.objects.filter(pk=job_id, status__in=ACTIVE_JOB)
    job = active.held_by(instance_id=call.instance.pk, attempt=call.attempt).first()
    if job is not None:
        _check_job_token(call, job_id)
        return Held(job=job, attempt=call.attempt, winding_down=False)
    current = active.filter(instance=call.instance).values_list("attempt", flat=True).first()
    if current is None:
        raise NotFound("No such active job on this runner.")
    raise ApplicationError(
        f"Attempt {call.attempt} of this job is no longer current (attempt {current} is): stop it.", status_code=409
    )


def _check_job_token(call: RunnerCall, job_id: str) -> None:
    """An attempt with a job token is reached only with it (401 otherwise)."""
    stored = Attempt.objects.filter(job_id=job_id, number=call.attempt).values_list("job_token_hash", flat=True).first()
    if not stored or job_token_matches(stored_hash=stored, presented=call.job_token):
        return
    raise exceptions.AuthenticationFailed(
        "This attempt's job token is missing or wrong: send Authorization: Bearer <runner token>.<job token>"
        " (AssignJob.job_token)."
    )


def _runner_view(view: APIView) -> RunnerAPIView:
    if not isinstance(view, RunnerAPIView):
        raise TypeError(f"{type(view).__name__}: the runner permissions guard RunnerAPIView subclasses only")
    return view
