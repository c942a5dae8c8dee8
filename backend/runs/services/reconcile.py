"""The reconciler: time-based transitions nobody else triggers.

Runs every ``TRAINYARD_RECONCILE_SECONDS`` from Celery beat. Each step is a
compare-and-set, so two reconcilers (or a reconciler racing a runner's
report) never double-act.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from backend.clouds.models import Instance, InstanceStatus
from backend.clouds.services import instance_job_done
from backend.runs.models import Job, JobStatus
from backend.runs.services.scheduling import instance_retire, instance_terminate
from backend.runs.services.transitions import job_finish, job_release

logger = logging.getLogger(__name__)


def reconcile() -> bool:
    """Returns True when pending work may now be schedulable."""
    released = _expire_leases()
    lost = _lose_silent_runners()
    _fail_stuck_provisioning()
    _finish_unconfirmed_stops()
    _retire_idle_runners()
    pending = Job.objects.filter(status=JobStatus.PENDING).exists()
    return bool(released or lost or pending)


def _expire_leases() -> int:
    now = timezone.now()
    expired = Job.objects.filter(status=JobStatus.ASSIGNED, lease_expires_at__lt=now)
    return sum(
        job_release(job_id=str(j.pk), reason="the runner did not accept the job in time; finding another")
        for j in expired
    )


def _lose_silent_runners() -> int:
    timeout = settings.TRAINYARD["HEARTBEAT_TIMEOUT_SECONDS"]
    cutoff = timezone.now() - timedelta(seconds=timeout)
    silent = Instance.objects.filter(
        status__in=[InstanceStatus.IDLE, InstanceStatus.BUSY, InstanceStatus.TERMINATING],
        last_heartbeat_at__lt=cutoff,
    )
    count = 0
    for instance in silent:
        reason = f"runner {instance.name} stopped responding (no heartbeat for {timeout:.0f}s)"
        logger.warning(reason)
        instance_terminate(instance=instance, reason=reason, status=InstanceStatus.LOST)
        count += 1
    return count


def _fail_stuck_provisioning() -> None:
    timeout = settings.TRAINYARD["PROVISION_TIMEOUT_SECONDS"]
    cutoff = timezone.now() - timedelta(seconds=timeout)
    for instance in Instance.objects.filter(status=InstanceStatus.PROVISIONING, created_at__lt=cutoff):
        instance_terminate(instance=instance, reason=f"runner {instance.name} did not connect within {timeout:.0f}s")


def _finish_unconfirmed_stops() -> None:
    grace = settings.TRAINYARD["STOP_GRACE_SECONDS"]
    cutoff = timezone.now() - timedelta(seconds=grace)
    for job in Job.objects.filter(status=JobStatus.STOPPING, stop_requested_at__lt=cutoff):
        job_finish(
            job_id=str(job.pk),
            status=JobStatus.STOPPED,
            exit_code=None,
            reason=f"{job.status_reason}; the runner did not confirm within {grace:.0f}s",
        )
        if job.instance_id:
            instance_job_done(instance_id=str(job.instance_id))


def _retire_idle_runners() -> None:
    idle_for = settings.TRAINYARD["LOCAL_RUNNER_IDLE_SECONDS"]
    cutoff = timezone.now() - timedelta(seconds=idle_for)
    stale = Instance.objects.filter(status=InstanceStatus.IDLE, backend="local", idle_since__lt=cutoff)
    for instance in stale:
        instance_retire(instance=instance, reason=f"retired after {idle_for:.0f}s idle")
