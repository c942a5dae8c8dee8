"""Scheduling passes: every pending job, oldest first, matched to a machine
or given one to wait for.

Passes run in Celery tasks (``runs.tasks.schedule``, coalesced by
``scheduler.coalesce``), never in a request. They are safe to run
concurrently in several workers: one pass at a time holds the scheduler's
lock (a try-lock: a pass that cannot take it returns at once,
``ScheduleResult.busy``, and the coalescer runs another after the holder's),
each job is decided in a transaction of its own, and pending jobs, their
runs and idle instances are claimed with ``SELECT … FOR UPDATE SKIP
LOCKED``: a pass never waits on a row another transaction holds
(docs/RUNS.md, "Locks").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, transaction

from backend.clouds.models import Instance
from backend.core.db import retry_on_conflict
from backend.core.deliveries import note_subject
from backend.runs.lifecycle.transitions import (
    job_assign,
    job_set_waiting_reason,
)
from backend.runs.models import Attempt, Job, JobStatus
from backend.runs.scheduler.capacity import OffersMemo, capacity, offers_worth_showing
from backend.runs.scheduler.claim import place
from backend.runs.scheduler.holds import Holds
from backend.runs.scheduler.volumes import assignment_send
from backend.runs.scheduler.waiting import capacity_wait_check

# Key of the Postgres advisory lock that serialises scheduling passes.
SCHEDULER_LOCK = 0x7472_6169_6E79  # "trainy"


@dataclass(frozen=True)
class ScheduleResult:
    assigned: list[str]
    provisioned: list[str]
    waiting: list[str]
    busy: bool = False  # another pass held the scheduler's lock: nothing was done


def jobs_schedule(*, limit: int = 100, on_lock: Callable[[], object] | None = None) -> ScheduleResult:
    """1. Claim pending jobs, oldest first. 2. Fail those whose dependencies
    failed; skip those whose dependencies are not done; hold those a budget
    or a GPU quota keeps waiting (``scheduler.holds``, read once per pass). 3. Reuse a cached
    result where one exists. 4. Give the rest an idle instance of their
    workspace that fits (the one started for it first). 5. For the others,
    ask ``clouds`` for a machine from the cheapest offer not tried yet, or say
    why they wait. Each job is decided in a transaction of its own, and its
    assignment is sent (its launch enqueued by ``instance_request``) when
    that commits: a job does not wait for the pass to go through all the
    others, and a pass holds one job's lock at a time, so a runner handed
    its next job (``instance_assign_next``) or a submission is not kept off
    the pending jobs for the length of a pass.

    Returns at once with ``busy`` when another pass holds the lock;
    ``on_lock`` is called once this pass holds it, before it reads a job."""
    result = ScheduleResult([], [], [])
    with _scheduler_lock() as held:
        if not held:
            return ScheduleResult([], [], [], busy=True)
        if on_lock is not None:
            on_lock()
        pending = list(
            Job.objects.filter(status=JobStatus.PENDING).order_by("created_at").values_list("pk", flat=True)[:limit]
        )
        offers: OffersMemo = {}
        holds = Holds.read(pending)
        for job_id in pending:
            assigned, requested, waits = _schedule_job(job_id, offers, holds)
            if assigned is not None:
                assignment_send(assigned)  # its transaction has committed
                result.assigned.append(str(job_id))
            if requested is not None:
                result.provisioned.append(str(requested.pk))
            if waits:
                result.waiting.append(str(job_id))
    return result


@contextmanager
def _scheduler_lock() -> Iterator[bool]:
    """One pass at a time across all workers: pool-size checks and new
    Instance rows must not race (two passes once started 7 of 4). A
    try-lock (yields False when another pass holds it): a pass never queues
    behind another, the caller runs one more after it instead. Held by the
    session, across the pass's per-job transactions; a connection that dies
    takes it along, and one that cannot release it is closed, so that it
    never stays held by a pooled connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [SCHEDULER_LOCK])
        held = bool(cursor.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [SCHEDULER_LOCK])
            except DatabaseError:
                connection.close()


@retry_on_conflict
def _schedule_job(job_id: Any, offers: OffersMemo, holds: Holds) -> tuple[Attempt | None, Instance | None, bool]:
    """One pending job's turn in a pass, in its own transaction: (the attempt
    it was assigned, to be sent once this returns, the instance requested for
    it, whether it waits). A job another transaction holds (a submission, a
    runner handed its next job, a stop), or that is no longer pending, is
    passed over."""
    with transaction.atomic():
        # The job with its run, skipping both when another transaction holds
        # either (a stop of the run locks the run, then its jobs): run before
        # job, and no wait, so the pass never deadlocks with a stop.
        job = (
            Job.objects.select_for_update(skip_locked=True, of=("self", "run"), no_key=True)
            .filter(pk=job_id, status=JobStatus.PENDING)
            .select_related("run", "run__patch_blob", "run__archive_blob")
            .prefetch_related("needs", "after_running")
            .first()
        )
        if job is None:
            return None, None, False
        note_subject(f"job:{job.pk}")  # a worker that dies here is charged to this job (core.deliveries)
        placed = place(job, holds=holds)
        if not placed.runnable:
            return None, None, False
        if placed.waits:
            job_set_waiting_reason(job, placed.waits)
            return None, None, True
        holds.took(job)  # its GPUs count against its submitter's quota for the rest of the pass
        if placed.instance is not None:
            return job_assign(job=job, instance=placed.instance, offers_tried=offers_worth_showing(job)), None, False
        held = placed.held
        reason, requested = capacity(job, offers, holding=bool(held))
        reason = f"{held}; {reason}" if held and reason else held or reason
        job_set_waiting_reason(job, reason)
        capacity_wait_check(job, reason)
        return None, requested, True
