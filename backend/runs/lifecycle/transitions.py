"""Every state change of a job, its attempts or a run, in one place.

Each change is an atomic compare-and-set (``UPDATE … WHERE status IN old``)
and acts only when it changed a row, so two processes racing on the same job
(the runner's report and the reconciler's timeout, say) cannot both win.

A job is the logical unit; each try of it on an instance is an ``Attempt``.
``attempt_end`` is the one place an attempt ends: it records the reason and
asks ``retry`` whether the job is tried again (back to pending) or ends with
the status the reason maps to. After a job changes, ``run_refresh`` derives
the run's status from its jobs and publishes it. docs/RUNS.md draws the graph.

Locks are taken in one order everywhere (docs/RUNS.md, "Locks"): the run,
then its jobs by id, then their attempts, then instances. A transaction
that changes a job locks its run first (``_lock_run_of``), and
``run_refresh`` reads the jobs only while it holds the run's lock, so two
jobs of one run finishing at once cannot both derive "still running".
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backend.artifacts.exports import exports_begin_reused_on_commit
from backend.clouds.models import Instance
from backend.clouds.services.instances import (
    MAX_RECLAIM_WAIT,
    instance_mark_interrupted,
    instance_set_busy,
    instance_set_idle,
    instance_set_idle_duration,
)
from backend.core.clock import db_now
from backend.runs.events import attempt_ended_on_commit, publish_on_commit
from backend.runs.lifecycle import notices
from backend.runs.lifecycle.cachewhy import decision_reused
from backend.runs.lifecycle.dispatch import attempt_refuse_on_commit, job_cancel_on_commit
from backend.runs.lifecycle.guards import guard_restarts
from backend.runs.lifecycle.jobtoken import job_token_hash
from backend.runs.lifecycle.placement import Placement, waiting_since
from backend.runs.lifecycle.redaction import REASON_READ_MAX, job_reason_clean
from backend.runs.lifecycle.retry import Decision, RetryPolicy, retry_decide
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
    RunStatus,
)
from backend.runs.reasons import GUARD_REASONS, TerminationReason
from backend.runs.wakeups import schedule_soon

logger = logging.getLogger(__name__)

REASON_MAX = 1000


# ------------------------------------------------------------------ attempts


def job_assign(*, job: Job, instance: Instance, offers_tried: list[dict[str, Any]] | None = None) -> Attempt:
    """pending → assigned: a new attempt on ``instance`` under a fresh lease.
    Its log lines continue the job's: they start after ``job.last_seq``."""
    number = job.attempt + 1
    lease = uuid.uuid4().hex
    attempt = Attempt.objects.create(
        workspace_id=job.workspace_id,
        job=job,
        number=number,
        instance=instance,
        lease=lease,
        job_token_hash=job_token_hash(lease=lease),
        # The reconciler expires it by the same clock (backend.core.clock).
        lease_expires_at=db_now() + timedelta(seconds=settings.TRAINYARD["LEASE_SECONDS"]),
        first_seq=job.last_seq + 1,
        offers_tried=offers_tried or [],
    )
    changed = _cas_job(
        job.pk,
        [JobStatus.PENDING],
        status=JobStatus.ASSIGNED,
        attempt=number,
        instance=instance,
        status_reason=_attempt_note(number, f"assigned to runner {instance.name}"),
        capacity_wait_told_at=None,  # its wait is over: a later one is told anew
    )
    assert changed, "job_assign is called with the job row locked"
    instance_set_busy(instance_id=str(instance.pk), message=f"attempt {number} of job {job.name}")
    run_refresh(run_id=str(job.run_id))
    return attempt


def job_accept(*, job_id: str, instance_id: str, attempt: int, lease: str, ports: list[int] | None = None) -> bool:
    """assigned → running, only for the runner holding the current attempt's
    lease. ``ports``: those its runner picked for ``ports: N``; from now on
    they are the job's ``ports`` (shown, and its workers' master port)."""
    now = timezone.now()
    # The runner waits for this transaction's commit before the commands
    # start (a warm start's critical path): the run is refreshed under the
    # lock taken first, not looked up and locked again.
    with transaction.atomic():
        run = _lock_run_of(job_id)
        job = Job.objects.select_for_update(no_key=True).filter(pk=job_id).only("started_at").first()
        changed = Attempt.objects.filter(
            job_id=job_id, number=attempt, instance_id=instance_id, lease=lease, status=AttemptStatus.ASSIGNED
        ).update(status=AttemptStatus.RUNNING, started_at=now, lease_expires_at=None)
        if not changed:
            return False
        _cas_job(
            job_id,
            [JobStatus.ASSIGNED],
            extra=Q(attempt=attempt),
            status=JobStatus.RUNNING,
            started_at=(job.started_at if job and job.started_at else now),
            **({"ports": list(ports)} if ports else {}),
        )
        notices.attempt_resumed(run, job_id, attempt)
        if run is not None:
            _run_refresh_locked(run)
    return True


def job_awaited_running(*, job_id: str) -> bool:
    """A pending job waits for this one to be running (``after_running``:
    the workers of a master): its acceptance is then worth a scheduling pass."""
    waits = Job.after_running.through.objects.filter(to_job_id=uuid.UUID(job_id), from_job__status=JobStatus.PENDING)
    return waits.exists()


def job_set_reason(*, job_id: str, instance_id: str, attempt: int, reason: str) -> None:
    """A progress note (``preparing the code``) from the runner running the job.
    Another runner's is not read at all; the holder's is cut to REASON_READ_MAX
    characters before it is cleaned (docs/decisions/0081-linear-redaction.md)."""
    running = Job.objects.filter(pk=job_id, status=JobStatus.RUNNING).held_by(instance_id=instance_id, attempt=attempt)
    if not running.exists():
        return
    reason = job_reason_clean(job_id=job_id, reason=_attempt_note(attempt, reason[:REASON_READ_MAX]))[:REASON_MAX]
    if running.exclude(status_reason=reason).update(status_reason=reason):
        _after_job_change(job_id)


def job_set_waiting_reason(job: Job, reason: str) -> None:
    """Why a pending job waits (``waiting for a runner: …``), shown on the job and its run."""
    if reason and job.status_reason != reason:
        Job.objects.filter(pk=job.pk, status=JobStatus.PENDING).update(status_reason=reason)
        run_refresh(run_id=str(job.run_id))


def job_request_stop(*, job: Job, reason: str) -> bool:
    """assigned/running → stopping (the runner is told), pending → stopped."""
    with transaction.atomic():
        _lock_run_of(job.pk)
        return _job_request_stop(job, reason)


def _job_request_stop(job: Job, reason: str, *, by_server: bool = False) -> bool:
    now = timezone.now()
    if not by_server and Job.objects.filter(pk=job.pk, status=JobStatus.STOPPING, stop_reason__in=GUARD_REASONS).update(
        stop_reason="", status_reason=reason
    ):
        # A person's stop while a guard stops the job: it ends stopped, never restarted.
        _after_job_change(job.pk)
        return True
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
        Attempt.objects.filter(job_id=job.pk, status__in=LIVE_ATTEMPT).update(status=AttemptStatus.STOPPING)
        _after_job_change(job.pk)
        job_cancel_on_commit(job_id=job.pk)  # its runner kills the commands; ``attempt_end`` follows its report
    return changed


def job_stop_by_server(*, job: Job, reason: TerminationReason, message: str) -> bool:
    """The server stops a job for a reason of its own (``max_duration``, a
    guard): like a user's stop, but the attempt ends with ``reason`` and the
    job with the status it maps to (a guard's reason: what ``retry`` decides,
    as for an attempt that ended on its own). A pending job (no attempt
    live) fails at once; one the reason leaves stopped (``budget_exceeded``)
    is stopped at once."""
    with transaction.atomic():
        run = _lock_run_of(job.pk)
        if reason in GUARD_REASONS:
            # Only a job that runs and that nobody is stopping yet: a person's stop stays theirs.
            live = [JobStatus.ASSIGNED, JobStatus.RUNNING]
            if not Job.objects.filter(pk=job.pk, status__in=live, stop_reason="").update(stop_reason=reason):
                return False
            job.stop_reason = reason
            notices.guard_fired(run, job, reason=reason, message=message)
            return _job_request_stop(job, message, by_server=True)
        Job.objects.filter(pk=job.pk, status__in=[*ACTIVE_JOB, JobStatus.PENDING]).update(stop_reason=reason)
        if job.status == JobStatus.PENDING and reason.to_status() != JobStatus.STOPPED:
            return job_fail_pending(job_id=str(job.pk), reason=message)
        if job.status == JobStatus.STOPPING:
            return False
        job.stop_reason = reason
        return _job_request_stop(job, message, by_server=True)


def job_report_final(
    *,
    job_id: str,
    instance_id: str,
    attempt: int,
    state: str,
    exit_code: int | None,
    reason: str,
    interrupt_at: float | None = None,
) -> bool:
    """The runner's final state of its attempt. False when that attempt is not
    the job's current one on this instance (a fenced runner's late report).

    ``interrupted`` comes at the cloud's notice, while the runner still winds
    the job down: the machine takes no new work and is terminated from
    ``interrupt_at`` on (``instance_mark_interrupted``), the attempt ends
    ``interrupted`` now, and ``retry`` gives the job its next attempt at once
    (placement skips the zone). The runner's later frames for it are refused."""
    current = Attempt.objects.current(job_id=job_id, number=attempt, instance_id=instance_id).first()
    if current is None:
        return False
    if state == "interrupted":
        at = datetime.fromtimestamp(interrupt_at, UTC) if interrupt_at is not None else None
        instance_mark_interrupted(instance_id=instance_id, message=reason or "interrupted by the cloud", reclaim_at=at)
        _hold_for_wind_down(current, at)
    why = {
        "succeeded": TerminationReason.DONE,
        "stopped": TerminationReason.STOPPED_BY_USER,
        "interrupted": TerminationReason.INTERRUPTED,
    }.get(state, TerminationReason.ERROR)
    if why == TerminationReason.STOPPED_BY_USER and current.status != AttemptStatus.STOPPING:
        # Nobody asked: the runner itself was stopped (its machine shutting
        # down, SIGTERM): the work was interrupted, not cancelled.
        why = TerminationReason.INTERRUPTED
        reason = f"the runner stopped the job: {reason}" if reason else "the runner stopped the job"
    if why == TerminationReason.ERROR and not reason and exit_code is not None:
        reason = f"exited with code {exit_code}"
    return attempt_end(attempt_id=str(current.pk), reason=why, message=reason, exit_code=exit_code)


def _hold_for_wind_down(attempt: Attempt, reclaim_at: datetime | None) -> None:
    """A job with a checkpoint, interrupted at a notice: its runner syncs the
    checkpoint once more before the machine goes, so the next attempt waits
    for that sync (``attempt_wind_down_end``) or for the deadline."""
    if not Job.objects.filter(pk=attempt.job_id).exclude(spec__checkpoint="").exclude(spec__checkpoint=None).exists():
        return
    now = timezone.now()
    until = min(max(reclaim_at or now, now), now + MAX_RECLAIM_WAIT)
    Attempt.objects.filter(pk=attempt.pk).update(wind_down_until=until)


def attempt_winding_down(*, job_id: str, instance_id: str, attempt: int) -> bool:
    """Attempt ``attempt`` of the job, on this instance, ended at a notice and
    its runner may still sync the job's checkpoint."""
    return Attempt.objects.filter(
        job_id=job_id, number=attempt, instance_id=instance_id, wind_down_until__gt=timezone.now()
    ).exists()


def attempt_wind_down_end(*, job_id: str, instance_id: str, attempt: int) -> bool:
    """The interrupted attempt's runner made its last sync: the job's next
    attempt may be assigned now (a scheduling pass is queued). False when
    nothing was held for it."""
    ended = Attempt.objects.filter(
        job_id=job_id, number=attempt, instance_id=instance_id, wind_down_until__isnull=False
    ).update(wind_down_until=None)
    if ended:
        logger.info("job %s: attempt %d wound down; its next attempt may start", job_id, attempt)
        schedule_soon()
    return bool(ended)


def attempts_wind_down_expire() -> int:
    """Holds whose deadline passed (the runner never said it was done): the
    jobs' next attempts may be assigned. Returns how many ended."""
    return Attempt.objects.filter(wind_down_until__lte=timezone.now()).update(wind_down_until=None)


def attempt_end(
    *,
    attempt_id: str,
    reason: TerminationReason,
    message: str = "",
    exit_code: int | None = None,
    tell_runner: bool = False,
) -> bool:
    """End a live attempt, then decide the job's fate:

    1. The attempt ends with ``reason`` (a compare-and-set: only once).
    2. A job being stopped ends stopped; ``done`` ends it succeeded.
    3. Otherwise ``retry`` decides: back to pending for another attempt, or
       the status ``reason`` maps to, with the message as the job's reason.
    4. The instance is idle again unless it ended or has another attempt.
    5. ``tell_runner`` (the server ended it, not the runner's report): the
       runner is sent ``Refused`` for the attempt, so one that still holds
       it (an acceptance lost on the way) drops it instead of waiting.
    """
    now = timezone.now()
    job_id = Attempt.objects.filter(pk=attempt_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return False
    with transaction.atomic():
        run = _lock_run_of(job_id)  # the run, then the job, then the attempt: the order every transaction takes
        job = Job.objects.select_for_update(no_key=True).get(pk=job_id)
        attempt = Attempt.objects.select_for_update(no_key=True).filter(pk=attempt_id, status__in=LIVE_ATTEMPT).first()
        if attempt is None:
            return False
        if reason == TerminationReason.STOPPED_BY_USER and job.stop_reason:
            reason = TerminationReason(job.stop_reason)  # the server stopped it (max_duration), not a user
            if reason in GUARD_REASONS and job.status == JobStatus.STOPPING:
                message = job.status_reason  # the guard's words (what it saw), not the runner's "stopped"
        Attempt.objects.filter(pk=attempt.pk).update(
            status=AttemptStatus.ENDED,
            termination_reason=reason,
            termination_message=job_reason_clean(job_id=job.pk, reason=message)[:REASON_MAX],
            exit_code=exit_code,
            finished_at=now,
            last_seq=job.last_seq,
            lease_expires_at=None,
        )
        attempt_ended_on_commit(attempt_id=str(attempt.pk), reason=reason, message=message)
        if job.attempt == attempt.number and job.status in ACTIVE_JOB:
            _job_after_attempt(job, attempt, reason, message, exit_code)
        if reason == TerminationReason.INTERRUPTED:
            retried = Job.objects.filter(pk=job.pk, status=JobStatus.PENDING).exists()
            notices.attempt_interrupted(run, job, attempt, retried=retried)
        if run is not None:
            # In the job's transaction: no reader sees the job finished and its run still running.
            _run_refresh_locked(run)
    if attempt.instance_id:
        _instance_job_done(str(attempt.instance_id), job, retire=reason == TerminationReason.BUDGET_EXCEEDED)
        if tell_runner:
            attempt_refuse_on_commit(str(attempt.instance_id), str(job.pk), attempt.number, message or reason.label)
    return True


def job_fail_no_capacity(*, job: Job, offers_tried: list[dict[str, Any]], message: str) -> bool:
    """Every offer that fits failed to launch: an attempt records the offers
    tried and ends ``no_capacity``; ``retry`` decides whether the job waits."""
    return job_fail_unstarted(job=job, reason=TerminationReason.NO_CAPACITY, offers_tried=offers_tried, message=message)


def job_fail_unstarted(
    *, job: Job, reason: TerminationReason, offers_tried: list[dict[str, Any]], message: str
) -> bool:
    """A pending job's machines never started it (no capacity; an image that
    cannot be pulled): an attempt that never ran records the offers tried and
    ends with ``reason``; ``retry`` decides whether the job waits."""
    number = job.attempt + 1
    now = timezone.now()
    attempt = Attempt.objects.create(
        workspace_id=job.workspace_id,
        job=job,
        number=number,
        status=AttemptStatus.ENDED,
        termination_reason=reason,
        termination_message=message[:REASON_MAX],
        first_seq=job.last_seq + 1,
        last_seq=job.last_seq,
        finished_at=now,
        offers_tried=offers_tried,
    )
    decision = _decide(job, reason, counted=number)
    if decision.retry:
        changed = _cas_job(job.pk, [JobStatus.PENDING], attempt=number, status_reason=f"{message}; {decision.why}")
    else:
        said = f"{message}; {decision.why}" if decision.why else message
        changed = _cas_job(
            job.pk, [JobStatus.PENDING], attempt=number, status=JobStatus.FAILED, status_reason=said, finished_at=now
        )
    if not changed:
        attempt.delete()
    _after_job_change(job.pk)
    return changed


# ---------------------------------------------------------------- jobs alone


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
        cache_decision=decision_reused(source),
        started_at=now,
        finished_at=now,
    )
    if changed:
        # Its source's artifacts go to this run's ``to:`` destinations.
        exports_begin_reused_on_commit(job_id=job_id, source_id=source.pk)
        _after_job_change(job_id)
    return changed


# ---------------------------------------------------------------------- runs


def run_refresh(*, run_id: str) -> Run:
    """Derive the run's status from its jobs; publish it when it changed.

    1. Any job active → running (stopping while a stop is in progress).
    2. All jobs finished → failed if one failed (its exit code), stopped if one
       was stopped, else succeeded.
    3. Otherwise pending, with the first pending job's reason.

    The run's row is locked before its jobs are read: a transaction that
    changed another job of the run has committed by then (it held the lock),
    so the last of two jobs finishing at once sees both finished.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
        return _run_refresh_locked(run)


def _run_refresh_locked(run: Run) -> Run:
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
        for field, value in updates.items():  # what the row now holds: no read back
            setattr(run, field, value)
        publish_on_commit(str(run.pk))
        notices.run_ended(run)
    return run


def run_lock(*, run_id: UUID | str) -> Run | None:
    """Lock the run's row (inside a transaction): first, before any of its
    jobs, attempts or instances (docs/RUNS.md, "Locks"). ``FOR NO KEY
    UPDATE``, like every lock of ours on a run, job or attempt: it does not
    block the key-share locks that inserting a row pointing at it takes (an
    artifact, an attempt), so those cannot join a lock cycle."""
    return Run.objects.select_for_update(no_key=True).filter(pk=run_id).first()


def run_resume_budget_stopped(*, run_id: UUID | str) -> list[str]:
    """The run's jobs the budget stopped (``budget_exceeded``) are pending
    again, each to continue as its next attempt from the job's latest
    checkpoint; the run, stopped by them, is no longer finished. The names of
    the jobs resumed ([]: none was stopped by the budget; nothing changes).
    Whether they start is the scheduler's budget hold's to say."""
    with transaction.atomic():
        run = run_lock(run_id=run_id)
        if run is None:
            return []
        stopped = list(
            Job.objects.select_for_update(no_key=True)
            .filter(run_id=run.pk, status=JobStatus.STOPPED, stop_reason=TerminationReason.BUDGET_EXCEEDED)
            .order_by("pk")
        )
        for job in stopped:
            _cas_job(
                job.pk,
                [JobStatus.STOPPED],
                status=JobStatus.PENDING,
                instance=None,
                stop_reason="",
                stop_requested_at=None,
                finished_at=None,
                exit_code=None,
                status_reason="resuming from its checkpoint after the budget stop",
            )
        if not stopped:
            return []
        if run.status in FINISHED_RUN:
            # The one way back from finished: the budget, not the work, ended it.
            Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, finished_at=None, exit_code=None)
            run.status, run.finished_at, run.exit_code = RunStatus.RUNNING, None, None
        _run_refresh_locked(run)
        publish_on_commit(str(run.pk))
    schedule_soon()
    return [job.name for job in stopped]


def run_request_stop(*, run: Run) -> bool:
    """pending/running → stopping; its jobs are stopped by ``job_request_stop``."""
    return bool(
        Run.objects.filter(pk=run.pk, status__in=[RunStatus.PENDING, RunStatus.RUNNING]).update(
            status=RunStatus.STOPPING
        )
    )


# ------------------------------------------------------------------ helpers


def _job_after_attempt(
    job: Job, attempt: Attempt, reason: TerminationReason, message: str, exit_code: int | None
) -> None:
    now = timezone.now()
    if job.stop_reason == TerminationReason.GROUP_RESTART and job.status in ACTIVE_JOB:
        # Stopped for its group's restart (``groups``): however this attempt
        # ended, the job waits for its next one with the rest of the group.
        _cas_job(
            job.pk,
            list(ACTIVE_JOB),
            status=JobStatus.PENDING,
            instance=None,
            stop_reason="",
            stop_requested_at=None,
            status_reason=f"waiting to restart with its group: {job.status_reason}"[:REASON_MAX],
        )
        return
    guarded = reason in GUARD_REASONS and job.stop_reason == reason
    if (job.status == JobStatus.STOPPING or reason == TerminationReason.STOPPED_BY_USER) and not guarded:
        stop_reason = job.status_reason if job.status == JobStatus.STOPPING else message
        # A stop the server made for a reason of its own ends as that reason says.
        stopped = reason.to_status() if job.stop_reason and reason == job.stop_reason else JobStatus.STOPPED
        _cas_job(
            job.pk,
            list(ACTIVE_JOB),
            status=stopped,
            status_reason=stop_reason,
            exit_code=exit_code,
            finished_at=now,
        )
        return
    if reason == TerminationReason.DONE:
        _cas_job(
            job.pk, list(ACTIVE_JOB), status=JobStatus.SUCCEEDED, exit_code=exit_code, status_reason="", finished_at=now
        )
        return
    counted = _counted_attempts(job) if reason.counts_as_retry else 0
    decision = _decide(job, reason, counted=counted, restart=guarded and guard_restarts(job, reason))
    ended = f"attempt {attempt.number} ended: {reason.label}" + (f" ({message})" if message else "")
    if decision.retry:
        _cas_job(
            job.pk,
            list(ACTIVE_JOB),
            status=JobStatus.PENDING,
            instance=None,
            status_reason=f"{decision.why}: {ended}"[:REASON_MAX],
            **_guard_stop_over(guarded),
        )
        return
    final = message or ended
    _cas_job(
        job.pk,
        list(ACTIVE_JOB),
        status=reason.to_status(),
        exit_code=exit_code,
        status_reason=(f"{final}; {decision.why}" if decision.why else final)[:REASON_MAX],
        finished_at=now,
    )


def _guard_stop_over(guarded: bool) -> dict[str, Any]:
    """The updates that end a guard's stop, so the job's next attempt is watched afresh."""
    return {"stop_reason": "", "stop_requested_at": None} if guarded else {}


def _decide(job: Job, reason: TerminationReason, *, counted: int, restart: bool = False) -> Any:
    first = Attempt.objects.filter(job_id=job.pk).exclude(started_at=None).order_by("number").first()
    placement = Placement.of(job)
    now = timezone.now()
    if reason == TerminationReason.NO_CAPACITY and placement.spot_policy == "auto" and job.on_demand_since is None:
        # spot_policy auto reads max_wait as how long to try spot (placement.choose): no spot
        # capacity is waited out until then, and on-demand comes after, never a failure.
        return Decision(True, "waiting for spot capacity; on-demand once max_wait is over")
    max_wait = placement.max_wait if placement.spot_policy != "auto" else None
    return retry_decide(
        policy=RetryPolicy.from_spec(job.retry_policy),
        reason=reason,
        attempts=counted,
        first_started_at=first.started_at if first else None,
        now=now,
        max_wait=max_wait,
        waited=(now - waiting_since(job)).total_seconds(),
        restart=restart,
    )


def _counted_attempts(job: Job) -> int:
    """Attempts that count against ``retry: limit`` (``TerminationReason.counts_as_retry``)."""
    free = [reason for reason in TerminationReason if not reason.counts_as_retry]
    return Attempt.objects.filter(job_id=job.pk).exclude(termination_reason__in=free).count()


def _instance_job_done(instance_id: str, job: Job, *, retire: bool = False) -> None:
    """The runner finished its attempt: idle again unless it still has one,
    for as long as the job's ``idle_duration`` says; ``retire`` (the budget
    stopped the job): not kept for reuse, the reconciler retires it at once
    unless another job takes it first (an idle machine is money too)."""
    if Attempt.objects.filter(instance_id=instance_id, status__in=LIVE_ATTEMPT).exists():
        return
    seconds = 0 if retire else Placement.of(job).idle_duration
    instance_set_idle_duration(instance_id=instance_id, seconds=seconds)
    instance_set_idle(instance_id=instance_id, message=f"job {job.name} done")


def _attempt_note(number: int, text: str) -> str:
    return text if number <= 1 else f"attempt {number}: {text}"


def _derive(run: Run, jobs: Iterable[Job]) -> tuple[RunStatus, str, int | None]:
    jobs = list(jobs)
    stopping = any(j.status == JobStatus.STOPPING for j in jobs) or run.status == RunStatus.STOPPING
    if any(j.status in ACTIVE_JOB for j in jobs):
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
    # A job waiting for its next attempt keeps the run running.
    if pending is not None and pending.attempt > 0 and run.status == RunStatus.RUNNING:
        return RunStatus.RUNNING, pending.status_reason, None
    return RunStatus.PENDING, pending.status_reason if pending else "", None


def _failure_reason(job: Job) -> str:
    if job.status_reason:
        return job.status_reason
    return f"job {job.name} exited with code {job.exit_code}"


def _cas_job(job_id: UUID | str, old: list[JobStatus], *, extra: Q | None = None, **updates: Any) -> bool:
    if "status_reason" in updates:
        updates["status_reason"] = job_reason_clean(job_id=job_id, reason=updates["status_reason"])
    query = Job.objects.filter(Q(pk=job_id, status__in=old) & (extra or Q()))
    changed = query.update(**updates) == 1
    if changed:
        logger.info("job %s → %s %s", job_id, updates.get("status"), updates.get("status_reason", ""))
    return changed


def _lock_run_of(job_id: UUID | str) -> Run | None:
    """Lock the run of ``job_id`` before the job itself (the caller holds a
    transaction): the order every transaction that changes a job takes.
    Returns the run, read under its lock."""
    return Run.objects.select_for_update(no_key=True, of=("self",)).filter(jobs__pk=job_id).first()


def _after_job_change(job_id: UUID | str) -> None:
    run_id = Job.objects.filter(pk=job_id).values_list("run_id", flat=True).first()
    if run_id is not None:
        run_refresh(run_id=str(run_id))
