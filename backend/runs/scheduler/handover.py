"""The warm paths: a job assigned without waiting for a pass.

A submission gives its ready jobs an idle runner in its own transaction
(``run_assign_on_submit``), and a runner that finished a job takes the next
one it fits (``instance_assign_next``). Both decide a job by the pass's own
steps (``scheduler.claim.place``) and send the assignment on commit; what
they cannot place is left to the next pass (docs/RUNS.md, "Warm start").
"""

from __future__ import annotations

from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import Case, IntegerField, Value, When

from backend.clouds.models import Instance, InstanceStatus
from backend.runs.lifecycle.transitions import (
    job_assign,
)
from backend.runs.models import Attempt, Job, JobStatus, Run
from backend.runs.scheduler.claim import place
from backend.runs.scheduler.holds import Holds
from backend.runs.scheduler.volumes import assignments_send

# A runner that finished a job looks at most this many of the oldest pending
# jobs of its workspace for one it fits (``instance_assign_next``).
HAND_OVER_LOOK_AHEAD = 20


def run_assign_on_submit(*, run: Run) -> list[Attempt]:
    """Inside the submission's transaction: the run's jobs that are ready get
    an idle runner of the workspace that fits, as a pass would give them one
    (the cache and the readiness checks included), and their assignments go
    out when the submission commits. This is the warm path: no Celery hop and
    no scheduler lock, so concurrent submissions do not queue behind each
    other or behind a pass; the instance is claimed ``SKIP LOCKED``, so two
    submissions never get the same runner and neither waits for the other.
    A job nothing idle fits stays pending for the pass, which launches
    machines (docs/RUNS.md, "Warm start"). Returns the attempts made."""
    if not settings.TRAINYARD["ASSIGN_ON_SUBMIT"]:
        return []
    assigned: list[Attempt] = []
    jobs = list(Job.objects.filter(run=run, status=JobStatus.PENDING).order_by("created_at"))
    holds = Holds.read([job.pk for job in jobs])
    for job in jobs:
        # The submission's own run, not a copy: it is named at the end of the
        # transaction, and the assignment frames are built from it on commit.
        job.run = run
        instance = place(job, holds=holds).instance
        if instance is None:
            continue
        holds.took(job)
        if not assigned:
            # Registered before the first assignment's own hooks: on commit the
            # assignments go out first, then the run's events are published.
            transaction.on_commit(partial(assignments_send, assigned))
        assigned.append(job_assign(job=job, instance=instance))
    return assigned


def instance_assign_next(*, instance_id: str) -> Attempt | None:
    """A runner that has just finished a job (or said hello) takes the next
    one at once: the job it was started for if still pending, else the
    oldest pending job of its workspace that it fits, decided by the pass's
    own steps (readiness, the cache, a wind-down hold,
    placement and resources), in one short transaction whose assignment is
    sent on commit. The hand-over from one job to the next waits for no
    Celery hop and no pass (a pass over many pending jobs took 0.5–1 s). The
    runner and the jobs are claimed ``SKIP LOCKED``, as by a pass and a
    submission: a runner another transaction holds (a pass giving it a job)
    is left to it. Looks at the ``HAND_OVER_LOOK_AHEAD`` oldest pending
    jobs; None when none of them fits, and the pass asked for next decides
    (docs/RUNS.md, "Warm start")."""
    if not settings.TRAINYARD["ASSIGN_ON_IDLE"]:
        return None
    with transaction.atomic():
        instance = (
            Instance.objects.select_for_update(skip_locked=True)
            .filter(pk=instance_id, status=InstanceStatus.IDLE)
            .exclude(channel_name="")
            .first()
        )
        if instance is None:
            return None
        # The job it was started for first (if still pending), then the oldest.
        started_for = Case(
            When(pk=instance.requested_for_id, then=Value(0)), default=Value(1), output_field=IntegerField()
        )
        candidates = (
            Job.objects.select_for_update(skip_locked=True, of=("self", "run"), no_key=True)
            .filter(workspace_id=instance.workspace_id, status=JobStatus.PENDING)
            .select_related("run", "run__patch_blob", "run__archive_blob")
            .order_by(started_for, "created_at")[:HAND_OVER_LOOK_AHEAD]
        )
        jobs = list(candidates)
        holds = Holds.read([job.pk for job in jobs])
        for job in jobs:
            if place(job, only=instance.pk, holds=holds).instance is None:
                continue
            # Registered before the assignment's own hooks (the run's events):
            # the frame goes out first. It is filled in once the attempt is made.
            attempts: list[Attempt] = []
            transaction.on_commit(partial(assignments_send, attempts))
            attempts.append(job_assign(job=job, instance=instance))
            return attempts[0]
    return None
