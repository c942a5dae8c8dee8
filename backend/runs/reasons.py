"""Why an attempt ended: one enum, the job status each reason leads to, and
the retry event it counts as (``retry: on_events``)."""

from __future__ import annotations

from django.db import models

from backend.runs.models import JobStatus


class TerminationReason(models.TextChoices):
    DONE = "done", "the commands succeeded"
    ERROR = "error", "the job failed"
    STOPPED_BY_USER = "stopped_by_user", "stopped"
    NO_CAPACITY = "no_capacity", "no capacity"
    INTERRUPTED = "interrupted", "the machine was interrupted"
    INSTANCE_LOST = "instance_lost", "the machine was lost"
    # The machine's image could not be pulled (a Kubernetes backend's
    # ``image``): it would never start, so the job fails, never retried (the
    # next attempt would pull the same image); the cloud's message names it.
    IMAGE_PULL = "image_pull", "the image could not be pulled"
    LEASE_EXPIRED = "lease_expired", "the runner did not accept in time"
    REJECTED = "rejected", "the runner refused the job"
    UNREACHABLE = "unreachable", "the runner was unreachable for too long"
    # The job ran longer than its workflow's max_duration: stopped, and failed
    # (its work is unfinished), never retried (another attempt would run as long).
    MAX_DURATION = "max_duration", "the max duration was reached"
    # Another job of its group (a master, a worker) was interrupted or lost:
    # stopped so the whole group resumes together; not counted as a retry.
    GROUP_RESTART = "group_restart", "restarted with its group"
    # Guards (docs/WORKFLOWS.md, "Guards"): the server stopped the job because
    # its GPUs all stayed below ``utilization_policy``'s threshold for the
    # window, or because it printed nothing and reported no training value for
    # ``stall``'s timeout. Each is its own retry event; ``stall: {action:
    # restart}`` is retried whatever ``on_events`` says (``lifecycle.retry``).
    LOW_GPU_UTILIZATION = "low_gpu_utilization", "the GPUs stayed idle (utilization_policy)"
    STALLED = "stalled", "no output for the stall timeout (stall)"
    # A budget that applies (the workspace's, its submitter's, the run's
    # max_cost) was reached: stopped like at a spot notice (its checkpoint
    # synced), the job ends stopped, never retried on its own; resumed from
    # that checkpoint once the budget allows (docs/COST.md, "Budgets").
    BUDGET_EXCEEDED = "budget_exceeded", "stopped by the budget"

    def to_status(self) -> JobStatus:
        """The job's status when this attempt is its last."""
        return _STATUS.get(self, JobStatus.FAILED)

    @property
    def retry_event(self) -> str | None:
        """The ``retry: on_events`` name this reason counts as; None: never retried."""
        return _EVENT.get(self)

    @property
    def counts_as_retry(self) -> bool:
        """Whether an attempt that ended so counts against ``retry: limit``.
        Those that do not are tried again whatever ``retry:`` says: the job's
        commands never started (a lease that ran out, a runner's refusal), or
        it was stopped only so that its group restarts together."""
        return self not in _NOT_A_RETRY


_NOT_A_RETRY = (
    TerminationReason.LEASE_EXPIRED,
    TerminationReason.REJECTED,
    TerminationReason.GROUP_RESTART,
    TerminationReason.BUDGET_EXCEEDED,
)
_STATUS = {
    TerminationReason.DONE: JobStatus.SUCCEEDED,
    TerminationReason.STOPPED_BY_USER: JobStatus.STOPPED,
    TerminationReason.BUDGET_EXCEEDED: JobStatus.STOPPED,
}
_EVENT = {
    TerminationReason.ERROR: "error",
    TerminationReason.NO_CAPACITY: "no_capacity",
    TerminationReason.INTERRUPTED: "interruption",
    TerminationReason.INSTANCE_LOST: "instance_lost",
    # Fenced after the grace while its machine was still there: the job may be
    # stuck on a machine we cannot reach; treated like a lost machine.
    TerminationReason.UNREACHABLE: "instance_lost",
    TerminationReason.LOW_GPU_UTILIZATION: "low_gpu_utilization",
    TerminationReason.STALLED: "stalled",
}
# The server stops a job for these and the retry policy then decides, as
# for an attempt that ended on its own (``max_duration`` is never retried).
GUARD_REASONS = (TerminationReason.LOW_GPU_UTILIZATION, TerminationReason.STALLED)
