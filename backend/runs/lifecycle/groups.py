"""Jobs that run together restart together (docs/RUNS.md, "Groups").

A group is the jobs of a run linked by ``after_running`` (a master and the
workers that start once it runs). When one of them goes back to pending
after its machine was interrupted or lost (or a guard ended its attempt:
``stall`` with ``action: restart``), the others are still running
against the old master (or without a worker they wait for): by default
(``JobPlan.on_interruption`` "restart_group", the run's provider decides)
they are stopped too (reason ``group_restart``, not counted as a retry) and
wait with it. The master then starts again first; the workers follow once
it runs, each restoring its own checkpoint and given the new master's
address (``scheduling._master_env``).

State-based and idempotent: every reconcile pass looks at the pending jobs
of groups whose last attempt ended that way, and stops the group's jobs
whose current attempt is older than that ending.
"""

from __future__ import annotations

import logging

from django.db.models import Q

from backend.runs.lifecycle.transitions import job_stop_by_server
from backend.runs.models import ACTIVE_JOB, Attempt, Job, JobStatus
from backend.runs.reasons import TerminationReason

logger = logging.getLogger(__name__)

# The endings of an attempt that restart its group: its machine went away
# under it, or a guard ended it (a stalled worker often is a hung collective:
# the others wait on it).
RESTARTING = (
    TerminationReason.INTERRUPTED,
    TerminationReason.INSTANCE_LOST,
    TerminationReason.UNREACHABLE,
    TerminationReason.STALLED,
    TerminationReason.LOW_GPU_UTILIZATION,
)
Through = Job.after_running.through


def groups_restart() -> int:
    """Stop the running jobs of every group one of whose jobs is waiting to
    resume after an interruption; returns how many were stopped."""
    # Only pending jobs that are in a group: the database picks them (every
    # reconcile pass runs this; the links of all runs ever are not loaded).
    in_group = Q(pk__in=Through.objects.values("from_job_id")) | Q(pk__in=Through.objects.values("to_job_id"))
    waiting = Job.objects.filter(in_group, status=JobStatus.PENDING, attempt__gt=0)
    stopped = 0
    for job in waiting:
        if job.spec.get("on_interruption", "restart_group") != "restart_group":
            continue
        last = Attempt.objects.filter(job=job, number=job.attempt).first()
        if last is None or last.termination_reason not in RESTARTING or last.finished_at is None:
            continue
        for other in _group_of(job):
            if other.status not in (JobStatus.ASSIGNED, JobStatus.RUNNING) or other.stop_reason:
                continue
            current = Attempt.objects.filter(job=other, number=other.attempt).first()
            if current is None or current.created_at >= last.finished_at:
                continue  # it started after the interruption: it already runs with the new group
            why = f"{job.name}'s attempt {last.number} ended: {TerminationReason(last.termination_reason).label}"
            if job_stop_by_server(job=other, reason=TerminationReason.GROUP_RESTART, message=why):
                stopped += 1
                logger.info("job %s: restarting with its group (%s)", other.pk, why)
    return stopped


def _group_of(job: Job) -> list[Job]:
    """The other jobs of ``job``'s group: its run's jobs reachable over
    ``after_running`` links in either direction."""
    links = list(Through.objects.filter(from_job__run_id=job.run_id).values_list("from_job_id", "to_job_id"))
    seen = {job.pk}
    frontier = [job.pk]
    while frontier:
        here = frontier.pop()
        for a, b in links:
            for near, far in ((a, b), (b, a)):
                if near == here and far not in seen:
                    seen.add(far)
                    frontier.append(far)
    seen.discard(job.pk)
    return list(Job.objects.filter(pk__in=seen, status__in=ACTIVE_JOB))
