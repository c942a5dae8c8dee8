"""Reads for runs, jobs and logs. Every selector requires ``workspace``."""

from __future__ import annotations

import uuid

from django.db.models import Q, QuerySet

from backend.accounts.models import Workspace
from backend.runs.models import LIVE_ATTEMPT, Attempt, Job, LogLine, Run


def run_list(
    *, workspace: Workspace, status: str = "", workflow: str = "", q: str = "", tag: str = ""
) -> QuerySet[Run]:
    runs = Run.objects.for_workspace(workspace).select_related("submitted_by").order_by("-created_at")
    if status:
        runs = runs.filter(status__in=status.split(","))
    if workflow:
        runs = runs.filter(workflow=workflow)
    if q:
        runs = runs.filter(Q(name__icontains=q) | Q(workflow__icontains=q) | Q(submitted_by__username__icontains=q))
    if tag:
        runs = runs.filter(tags__name=tag)
    return runs.prefetch_related("jobs", "tags")


def run_get(*, workspace: Workspace, ref: str) -> Run | None:
    """A run by short name or UUID, only within ``workspace``."""
    runs = Run.objects.for_workspace(workspace).select_related("submitted_by")
    if _is_uuid(ref):
        return runs.filter(pk=ref).first()
    return runs.filter(name=ref).first()


def job_get(*, workspace: Workspace, job_id: str) -> Job | None:
    if not _is_uuid(job_id):
        return None
    return Job.objects.for_workspace(workspace).filter(pk=job_id).first()


def job_log_lines(*, job: Job, after_seq: int, limit: int) -> list[tuple[int, float, str, str]]:
    """(seq, unix ts, stream, text) in seq order; the caller checked tenancy on ``job``."""
    rows = (
        LogLine.objects.filter(job_id=job.pk, seq__gt=after_seq)
        .order_by("seq")
        .values_list("seq", "ts", "stream", "text")[:limit]
    )
    return [(seq, ts.timestamp(), stream, text) for seq, ts, stream, text in rows]


def attempt_current(*, job_id: str, number: int, instance_id: str) -> Attempt | None:
    """The job's live attempt ``number`` on ``instance_id``, if it is the current one."""
    return (
        Attempt.objects.filter(job_id=job_id, number=number, instance_id=instance_id, status__in=LIVE_ATTEMPT)
        .filter(job__attempt=number)
        .first()
    )


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
