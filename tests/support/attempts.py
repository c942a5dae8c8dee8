"""Driving a job's current attempt as a runner would, for unit tests."""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.test import APIClient
from trainyard_runner import protocol

from backend.runs.lifecycle import dispatch
from backend.runs.lifecycle.jobtoken import job_token
from backend.runs.lifecycle.transitions import job_accept, job_report_final
from backend.runs.models import Attempt, Job


def current_attempt(job: Job) -> Attempt:
    job.refresh_from_db()
    return Attempt.objects.get(job=job, number=job.attempt)


def job_credential(token: str, job: Job, attempt: int | None = None) -> str:
    """What a runner holding ``token`` sends for ``job``'s attempt (its
    current one unless given): the runner's token and the attempt's job
    token, as ``AssignJob.job_token`` gives it (``lifecycle/jobtoken.py``)."""
    job.refresh_from_db()
    row = Attempt.objects.filter(job=job, number=job.attempt if attempt is None else attempt).first()
    lease = row.lease if row is not None and row.job_token_hash else ""
    return f"{token}.{job_token(lease=lease)}" if lease else token


def accept(job: Job, instance_id: object, *, lease: str | None = None) -> bool:
    attempt = current_attempt(job)
    return job_accept(
        job_id=str(job.pk), instance_id=str(instance_id), attempt=attempt.number, lease=lease or attempt.lease
    )


def report(job: Job, instance_id: object, state: str, exit_code: int | None = None, reason: str = "") -> bool:
    job.refresh_from_db()
    return job_report_final(
        job_id=str(job.pk),
        instance_id=str(instance_id),
        attempt=job.attempt,
        state=state,
        exit_code=exit_code,
        reason=reason,
    )


def assign_frame(job: Job) -> protocol.AssignJob:
    return dispatch.assign_frame(Job.objects.select_related("run").get(pk=job.pk), current_attempt(job))


def runner_get(job: Job, token: str, what: str = "secrets", *, attempt: int | None = None, **query: str) -> Response:
    """GET ``/api/v1/runner/jobs/<job>/<what>/`` as the runner with ``token``
    (``?attempt=``: the job's current one unless given)."""
    job.refresh_from_db()
    client = APIClient()
    number = job.attempt if attempt is None else attempt
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {job_credential(token, job)}")
    answer: Response = client.get(f"/api/v1/runner/jobs/{job.pk}/{what}/", {"attempt": number, **query})
    return answer
