"""The reconciler: time-based transitions nobody else triggers.

Runs every ``TRAINYARD_RECONCILE_SECONDS`` from Celery beat. First the
clouds' pass (machines: silent, unreachable, gone, stuck, idle), then the
work's: attempts whose lease ran out, attempts on machines that ended,
stops the runner never confirmed, and runs left unfinished although all
their jobs have finished. Each step is a compare-and-set, so two
reconcilers (or a reconciler racing a runner's report) never double-act.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now
from django.utils import timezone

from backend.clouds.models import ENDED_STATUSES, Instance, InstanceReason, InstanceStatus
from backend.clouds.services.instances import instance_request_termination
from backend.clouds.services.reconcile import clouds_reconcile
from backend.runs.lifecycle.groups import groups_restart
from backend.runs.lifecycle.kept import jobs_kept_expire
from backend.runs.lifecycle.placement import Placement
from backend.runs.lifecycle.transitions import attempt_end, attempts_wind_down_expire, job_stop_by_server, run_refresh
from backend.runs.models import (
    ACTIVE_JOB,
    FINISHED_JOB,
    FINISHED_RUN,
    LIVE_ATTEMPT,
    Attempt,
    AttemptStatus,
    Job,
    JobStatus,
    Run,
)
from backend.runs.reasons import TerminationReason

logger = logging.getLogger(__name__)


def reconcile() -> bool:
    """Returns True when pending work may now be schedulable."""
    changed = clouds_reconcile()
    released = _expire_leases()
    ended = _end_attempts_on_ended_instances()
    stopped = _stop_past_max_duration()
    _finish_unconfirmed_stops()
    _retire_unwanted_launches()
    attempts_wind_down_expire()
    jobs_kept_expire()
    restarted = groups_restart()
    runs_repair_finished()
    pending = Job.objects.filter(status=JobStatus.PENDING).exists()
    return bool(changed or released or ended or stopped or restarted or pending)


def _expire_leases() -> int:
    # Leases are written and expired by the database's clock (backend.core.clock).
    expired = Attempt.objects.filter(status=AttemptStatus.ASSIGNED, lease_expires_at__lt=Now())
    return sum(
        attempt_end(
            attempt_id=str(a.pk),
            reason=TerminationReason.LEASE_EXPIRED,
            message="the runner did not accept the job in time; finding another",
            tell_runner=True,
        )
        for a in expired
    )


def _end_attempts_on_ended_instances() -> int:
    """An attempt cannot outlive its machine: lost or terminated → the
    attempt ends with what happened to the machine."""
    doomed = Attempt.objects.filter(status__in=LIVE_ATTEMPT, instance__status__in=ENDED_STATUSES).select_related(
        "instance"
    )
    count = 0
    for attempt in doomed:
        assert attempt.instance is not None
        count += attempt_end_with_instance(attempt=attempt, instance=attempt.instance)
    return count


def attempt_end_with_instance(*, attempt: Attempt, instance: Instance) -> bool:
    """End ``attempt`` with what happened to its (lost or terminated) machine."""
    reason = _ENDED_BY.get(instance.termination_reason, TerminationReason.INSTANCE_LOST)
    message = instance.status_reason or f"machine {instance.name} {instance.status}"
    return attempt_end(attempt_id=str(attempt.pk), reason=reason, message=message)


# The attempt's reason for its machine's; any other end is a lost machine.
_ENDED_BY: dict[str, TerminationReason] = {
    InstanceReason.INTERRUPTED: TerminationReason.INTERRUPTED,
    InstanceReason.UNREACHABLE_GRACE: TerminationReason.UNREACHABLE,
    InstanceReason.IMAGE_PULL: TerminationReason.IMAGE_PULL,
}


def _stop_past_max_duration(now: datetime | None = None) -> int:
    """Jobs whose workflow's ``max_duration`` has passed since they first
    started are stopped (the runner is told) and end failed with
    ``max_duration``; one waiting for its next attempt fails at once."""
    now = now or timezone.now()
    count = 0
    started = Job.objects.filter(status__in=[*ACTIVE_JOB, JobStatus.PENDING], stop_reason="").exclude(started_at=None)
    for job in started.filter(placement__has_key="max_duration").select_related("instance"):
        limit = Placement.of(job).max_duration
        if limit is None or job.started_at is None or now - job.started_at < timedelta(seconds=limit):
            continue
        message = f"max_duration reached: the job ran longer than {limit}s (max_duration in the workflow)"
        if job_stop_by_server(job=job, reason=TerminationReason.MAX_DURATION, message=message):
            count += 1
    return count


def _finish_unconfirmed_stops() -> None:
    grace = settings.TRAINYARD["STOP_GRACE_SECONDS"]
    cutoff = timezone.now() - timedelta(seconds=grace)
    for job in Job.objects.filter(status=JobStatus.STOPPING, stop_requested_at__lt=cutoff):
        for attempt in Attempt.objects.filter(job=job, status__in=LIVE_ATTEMPT):
            attempt_end(
                attempt_id=str(attempt.pk),
                reason=TerminationReason.STOPPED_BY_USER,
                message=f"{job.status_reason}; the runner did not confirm within {grace:.0f}s",
                tell_runner=True,
            )


def _retire_unwanted_launches() -> None:
    """A machine still starting for a job that has ended (its run was
    stopped during provisioning) is terminated, not left to come up and
    idle: on a cloud it costs money from the first second."""
    unwanted = Instance.objects.filter(status=InstanceStatus.PROVISIONING, requested_for__status__in=FINISHED_JOB)
    for instance in unwanted.select_related("requested_for")[:50]:
        job = instance.requested_for
        assert job is not None
        instance_request_termination(
            instance_id=str(instance.pk),
            reason=InstanceReason.TERMINATE_REQUESTED,
            message=f"not needed any more: job {job.name} {job.status} while this machine was starting",
        )


def runs_repair_finished(*, limit: int = 100) -> int:
    """Runs still pending, running or stopping whose jobs have all finished
    get their status derived again (a job's end derives its run in the same
    transaction, so this finds only a bug's leftovers). Returns how many changed."""
    has_jobs = Exists(Job.objects.filter(run=OuterRef("pk")))
    unfinished = Exists(Job.objects.filter(run=OuterRef("pk")).exclude(status__in=FINISHED_JOB))
    stuck = Run.objects.exclude(status__in=FINISHED_RUN).filter(has_jobs).exclude(unfinished)
    repaired = 0
    for run in stuck.order_by("created_at")[:limit]:
        now = run_refresh(run_id=str(run.pk))
        if now.status in FINISHED_RUN:
            logger.warning("run %s was %s with all its jobs finished: now %s", run.pk, run.status, now.status)
            repaired += 1
    return repaired
