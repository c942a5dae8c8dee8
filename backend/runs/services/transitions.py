"""Every state change of a job or a run, in one place.

Each change is an atomic compare-and-set (``UPDATE … WHERE status IN old``)
and acts only when it changed a row, so two processes racing on the same job
(the runner's report and the reconciler's timeout, say) cannot both win.
After a job changes, ``run_refresh`` derives the run's status from its jobs
and publishes the run to its channel groups. docs/RUNS.md draws the graph.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backend.clouds.models import Instance, InstanceStatus
from backend.runs.events import publish, run_group, workspace_group
from backend.runs.models import FINISHED_JOB, FINISHED_RUN, Job, JobStatus, Run, RunStatus
from backend.runs.services.reasons import job_reason_clean

logger = logging.getLogger(__name__)


def job_accept(*, job_id: str, instance_id: str, lease: str) -> bool:
    """assigned → running, only for the runner holding the lease."""
    now = timezone.now()
    changed = _cas_job(
        job_id,
        [JobStatus.ASSIGNED],
        extra=Q(instance_id=instance_id, lease=lease),
        status=JobStatus.RUNNING,
        started_at=now,
        lease_expires_at=None,
    )
    if changed:
        _after_job_change(job_id)
    return changed


def job_release(*, job_id: str, reason: str, instance_id: str | None = None, lease: str | None = None) -> bool:
    """assigned → pending: the runner refused the job or its lease ran out.
    With ``instance_id``/``lease`` (a runner's refusal) only the lease holder may."""
    job = Job.objects.filter(pk=job_id).only("instance_id").first()
    owner = Q(instance_id=instance_id, lease=lease) if instance_id else Q()
    changed = _cas_job(
        job_id,
        [JobStatus.ASSIGNED],
        extra=owner,
        status=JobStatus.PENDING,
        status_reason=reason,
        instance=None,
        lease="",
        lease_expires_at=None,
    )
    if changed and job is not None and job.instance_id:
        instance_mark_idle(instance_id=str(job.instance_id))
    if changed:
        _after_job_change(job_id)
    return changed


def job_set_reason(*, job_id: str, instance_id: str, reason: str) -> None:
    """A progress note (``preparing the code``) from the runner running the job."""
    reason = job_reason_clean(job_id=job_id, reason=reason)
    running = Job.objects.filter(pk=job_id, instance_id=instance_id, status=JobStatus.RUNNING)
    if running.exclude(status_reason=reason[:1000]).update(status_reason=reason[:1000]):
        _after_job_change(job_id)


def job_request_stop(*, job: Job, reason: str) -> bool:
    """assigned/running → stopping (the runner is told), pending → stopped."""
    now = timezone.now()
    if _cas_job(job.pk, [JobStatus.PENDING], status=JobStatus.STOPPED, status_reason=reason, finished_at=now):
        _after_job_change(job.pk)
        return True
    changed = _cas_job(
        job.pk,
        [JobStatus.ASSIGNED, JobStatus.RUNNING],
        status=JobStatus.STOPPING,
        status_reason=reason,
        stop_requested_at=now,
    )
    if changed:
        _after_job_change(job.pk)
    return changed


def job_finish(
    *,
    job_id: str,
    status: JobStatus,
    exit_code: int | None,
    reason: str,
    instance_id: str | None = None,
) -> bool:
    """An active job ends. ``instance_id`` (when the runner reports) makes sure
    a runner cannot end a job that was taken from it."""
    assert status in FINISHED_JOB
    extra = Q(instance_id=instance_id) if instance_id else Q()
    changed = _cas_job(
        job_id,
        [JobStatus.ASSIGNED, JobStatus.RUNNING, JobStatus.STOPPING],
        extra=extra,
        status=status,
        exit_code=exit_code,
        status_reason=reason[:1000],
        finished_at=timezone.now(),
        lease_expires_at=None,
    )
    if changed:
        _after_job_change(job_id)
    return changed


def job_fail_pending(*, job_id: str, reason: str) -> bool:
    """pending → failed: it can never run (a dependency failed)."""
    changed = _cas_job(
        job_id, [JobStatus.PENDING], status=JobStatus.FAILED, status_reason=reason, finished_at=timezone.now()
    )
    if changed:
        _after_job_change(job_id)
    return changed


def job_reuse(*, job_id: str, source: Job) -> bool:
    """pending → succeeded without running: an identical job already did the work."""
    now = timezone.now()
    changed = _cas_job(
        job_id,
        [JobStatus.PENDING],
        status=JobStatus.SUCCEEDED,
        exit_code=0,
        cached_from=source,
        status_reason=f"reused from {source.run.name} (cached)",
        started_at=now,
        finished_at=now,
    )
    if changed:
        _after_job_change(job_id)
    return changed


def instance_mark_idle(*, instance_id: str) -> bool:
    return bool(
        Instance.objects.filter(pk=instance_id, status=InstanceStatus.BUSY).update(
            status=InstanceStatus.IDLE, idle_since=timezone.now()
        )
    )


def run_refresh(*, run_id: str) -> Run:
    """Derive the run's status from its jobs; publish it when it changed.

    1. Any job active → running (stopping while a stop is in progress).
    2. All jobs finished → failed if one failed (its exit code), stopped if one
       was stopped, else succeeded.
    3. Otherwise pending, with the first pending job's reason.
    """
    run = Run.objects.get(pk=run_id)
    jobs = list(run.jobs.order_by("created_at"))
    status, reason, exit_code = _derive(run, jobs)
    updates: dict[str, Any] = {"status": status, "status_reason": reason, "exit_code": exit_code}
    started = [j.started_at for j in jobs if j.started_at]
    if started and run.started_at is None:
        updates["started_at"] = min(started)
    if status in FINISHED_RUN and run.finished_at is None:
        updates["finished_at"] = timezone.now()
    if all(getattr(run, k) == v for k, v in updates.items()):
        return run
    # Compare-and-set on the old status: a finished run never changes again.
    if run.status in FINISHED_RUN:
        return run
    if Run.objects.filter(pk=run.pk, status=run.status).update(**updates):
        run.refresh_from_db()
        transaction.on_commit(lambda: publish_run(run))
    return run


def publish_run(run: Run) -> None:
    from backend.runs.api.serializers import run_to_dict

    data = run_to_dict(Run.objects.get(pk=run.pk))
    publish(run_group(run.pk), {"type": "run.status", "run": data})
    publish(workspace_group(run.workspace_id), {"type": "run.status", "run": data})


def _derive(run: Run, jobs: Iterable[Job]) -> tuple[RunStatus, str, int | None]:
    jobs = list(jobs)
    stopping = any(j.status == JobStatus.STOPPING for j in jobs) or run.status == RunStatus.STOPPING
    if any(j.status in (JobStatus.ASSIGNED, JobStatus.RUNNING, JobStatus.STOPPING) for j in jobs):
        active = next(j for j in jobs if j.status not in FINISHED_JOB and j.status != JobStatus.PENDING)
        return (RunStatus.STOPPING if stopping else RunStatus.RUNNING), active.status_reason, None
    if jobs and all(j.status in FINISHED_JOB for j in jobs):
        failed = next((j for j in jobs if j.status == JobStatus.FAILED), None)
        if failed is not None:
            return RunStatus.FAILED, _failure_reason(failed), failed.exit_code
        stopped = next((j for j in jobs if j.status == JobStatus.STOPPED), None)
        if stopped is not None:
            return RunStatus.STOPPED, stopped.status_reason, None
        return RunStatus.SUCCEEDED, "", 0
    pending = next((j for j in jobs if j.status == JobStatus.PENDING), None)
    return RunStatus.PENDING, pending.status_reason if pending else "", None


def _failure_reason(job: Job) -> str:
    if job.status_reason:
        return job.status_reason
    return f"job {job.name} exited with code {job.exit_code}"


def _cas_job(job_id: object, old: list[JobStatus], *, extra: Q | None = None, **updates: Any) -> bool:
    if "status_reason" in updates:
        updates["status_reason"] = job_reason_clean(job_id=job_id, reason=updates["status_reason"])
    query = Job.objects.filter(Q(pk=job_id, status__in=old) & (extra or Q()))
    changed = query.update(**updates) == 1
    if changed:
        logger.info("job %s → %s %s", job_id, updates.get("status"), updates.get("status_reason", ""))
    return changed


def _after_job_change(job_id: object) -> None:
    run_id = Job.objects.filter(pk=job_id).values_list("run_id", flat=True).first()
    if run_id is not None:
        run_refresh(run_id=str(run_id))
