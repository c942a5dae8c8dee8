"""A job whose artifacts could not be uploaded, its files kept on its machine
(runner/trainyard_runner/kept.py): the server records until when
(``Job.kept_until``), which lets that machine's runner upload that attempt's
declared artifacts later (``runs.api.runner_auth``), and rewrites the job's
reason once the files are uploaded or removed, so it never says they are
kept when they are not."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from backend.clouds.models import ENDED_STATUSES
from backend.clouds.services.instances import kept_bound
from backend.runs.events import publish_on_commit
from backend.runs.models import Job, JobStatus, Run

# The runner's sentence (kept.keep): "the job's files are kept on HOST in PATH until YYYY-MM-DD HH:MM UTC".
KEPT_SENTENCE = re.compile(r"the job's files are kept on (?P<host>\S+) in .*? until \d{4}-\d\d-\d\d \d\d:\d\d UTC")
OUTCOMES = {
    "uploaded": "the job's files kept on {host} were uploaded as its artifacts at {at}",
    "removed": "the job's files kept on {host} were removed at {at} (their time was up)",
    "gone": "the job's files kept on {host} were lost with the machine at {at}",
}
RUNNER_OUTCOMES = ("uploaded", "removed")  # what a runner may report
# A runner reports the removal when its time is up; past this, the server says it itself.
REPORT_GRACE = timedelta(minutes=15)


def job_keep(*, job_id: str, instance_id: str, attempt: int, kept_until: float) -> bool:
    """The runner of ``attempt`` failed it and kept its files until
    ``kept_until`` (unix time, bounded by ``kept_bound``). Only a failed job
    whose current attempt that is, on that instance."""
    failed = _failed_held_by(job_id=job_id, instance_id=instance_id, attempt=attempt)
    return bool(failed.update(kept_until=kept_bound(kept_until)))


def job_kept(*, job_id: str, instance_id: str, attempt: int, expired_ok: bool = False) -> Job | None:
    """The job, if its files of ``attempt`` are kept on ``instance_id``: now
    (uploads are admitted until their time is up), or with ``expired_ok``
    still recorded as kept (their removal may be reported after it)."""
    kept = _failed_held_by(job_id=job_id, instance_id=instance_id, attempt=attempt)
    if expired_ok:
        return kept.filter(kept_until__isnull=False).first()
    return kept.filter(kept_until__gt=timezone.now()).first()


def job_kept_end(*, job_id: str, instance_id: str, attempt: int, outcome: str) -> bool:
    """The runner uploaded (``uploaded``) or removed (``removed``) the kept
    files: the job no longer admits its uploads, and its reason says what
    became of them. Idempotent: False when nothing was kept."""
    kept = _failed_held_by(job_id=job_id, instance_id=instance_id, attempt=attempt)
    job = kept.filter(kept_until__isnull=False).first()
    return job is not None and _end(job, outcome)


def _failed_held_by(*, job_id: str, instance_id: str, attempt: int) -> QuerySet[Job]:
    """The job, failed, whose last attempt ``attempt`` ran on ``instance_id``
    (``held_by``: a job retried or moved since keeps nothing of this runner's)."""
    return Job.objects.held_by(instance_id=instance_id, attempt=attempt).filter(pk=job_id, status=JobStatus.FAILED)


def jobs_kept_expire() -> int:
    """The reconciler's step for runners that cannot say: files kept on a
    machine that has ended are gone with it, and files past their time by
    ``REPORT_GRACE`` were removed by their runner (which did not report it)."""
    kept = Job.objects.filter(status=JobStatus.FAILED, kept_until__isnull=False)
    gone = kept.filter(Q(instance__isnull=True) | Q(instance__status__in=ENDED_STATUSES))
    ended = sum(_end(job, "gone") for job in gone[:100])
    past = kept.filter(kept_until__lt=timezone.now() - REPORT_GRACE)
    return ended + sum(_end(job, "removed") for job in past[:100])


def _end(job: Job, outcome: str) -> bool:
    reason = kept_reason(job.status_reason, outcome=outcome, at=timezone.now())
    with transaction.atomic():
        changed = Job.objects.filter(pk=job.pk, kept_until__isnull=False).update(kept_until=None, status_reason=reason)
        # A finished run keeps its status; the reason it took from this job is rewritten with it.
        Run.objects.filter(pk=job.run_id, status_reason=job.status_reason).update(status_reason=reason)
        if changed:
            publish_on_commit(str(job.run_id))
    return bool(changed)


def kept_reason(reason: str, *, outcome: str, at: datetime) -> str:
    """``reason`` with the runner's "files are kept" sentence replaced by
    what became of them (appended when the sentence is not found whole)."""
    found = KEPT_SENTENCE.search(reason)
    host = found["host"] if found else "its machine"
    said = OUTCOMES[outcome].format(host=host, at=at.strftime("%Y-%m-%d %H:%M UTC"))
    if found:
        return (reason[: found.start()] + said + reason[found.end() :])[
            : Job._meta.get_field("status_reason").max_length
        ]
    cut = reason.split("; the job's files are kept on", 1)[0]
    return f"{cut}; {said}"[: Job._meta.get_field("status_reason").max_length]
