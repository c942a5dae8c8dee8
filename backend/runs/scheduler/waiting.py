"""A job that waits long for capacity is told once per wait (``job.waiting_capacity``).

A job waits for capacity when its offers had none: its latest attempt ended
``no_capacity`` (it backs off, or tries the next offer), or every offer is
blocked after failed launches. Past ``TRAINYARD_NOTIFY_WAITING_MINUTES``
since it began waiting (``placement.waiting_since``: its submission, or the
end of its last attempt that had a machine), the workspace's subscriptions
are told, and ``Job.capacity_wait_told_at`` keeps the pass from telling them
again; ``job_assign`` clears it, so a later wait is told anew.

Cheap on every pass: a job already told, or younger than the threshold,
costs no query.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from backend.runs.lifecycle import notices
from backend.runs.lifecycle.placement import waiting_since
from backend.runs.models import Attempt, Job, JobStatus
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.capacity import ALL_BLOCKED


def capacity_wait_check(job: Job, reason: str) -> bool:
    """Tell the subscriptions when ``job`` (pending, row locked by the pass,
    its run loaded) has waited too long for capacity; whether it told them."""
    if job.capacity_wait_told_at is not None or job.run is None:
        return False
    threshold = timedelta(minutes=settings.TRAINYARD["NOTIFY_WAITING_MINUTES"])
    now = timezone.now()
    if now - job.created_at < threshold:
        return False
    since = waiting_since(job)
    if now - since < threshold or not _short_of_capacity(job, reason):
        return False
    if not Job.objects.filter(pk=job.pk, status=JobStatus.PENDING, capacity_wait_told_at=None).update(
        capacity_wait_told_at=now
    ):
        return False
    minutes = int((now - since).total_seconds() // 60)
    # A pass that ended an attempt no_capacity gives no reason: the attempt's end wrote it on the job.
    said = reason or Job.objects.filter(pk=job.pk).values_list("status_reason", flat=True).first() or ""
    notices.job_waiting_capacity(job.run, job, since=since.isoformat(), minutes=minutes, reason=said)
    return True


def _short_of_capacity(job: Job, reason: str) -> bool:
    if ALL_BLOCKED in reason:
        return True
    last = Attempt.objects.filter(job_id=job.pk).order_by("-number").values_list("termination_reason", flat=True)
    return last.first() == TerminationReason.NO_CAPACITY
