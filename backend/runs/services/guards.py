"""The guards' watch (docs/WORKFLOWS.md, "Guards"): from Celery beat every
``TRAINYARD_GUARD_CHECK_SECONDS``, each running attempt of a job with a
guard on its placement (``lifecycle.guards``) is looked at once.

- ``utilization_policy``: the attempt has run for the whole window, its GPU
  samples cover the window (the first one at most ``_slack`` after its
  start, the latest at most ``_slack`` old) and no GPU reached the
  threshold in any of them → stopped ``low_gpu_utilization``. No samples, or
  a gap at either end: nothing is known, nothing is done.
- ``stall``: no log line stored and no training value
  (``metrics.selectors.last_training_value_at``) for the timeout, counted
  from when the commands started (``Attempt.last_output_at``, set when the
  runner says they run and by every stored batch) → stopped ``stalled``;
  with ``action: restart`` the job's next attempt resumes from its last
  checkpoint (the runner syncs it when the commands end, before it reports
  the attempt's end).

The stop is ``job_stop_by_server``: the runner is told to stop the job and
the retry policy decides what follows, as for an attempt that ended on its
own. A job someone else is stopping is left alone.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from backend.accounts.guards import duration_words
from backend.metrics.selectors import gpu_peak_since, last_training_value_at
from backend.runs.lifecycle.guards import Guards, StallGuard, UtilizationGuard
from backend.runs.lifecycle.transitions import job_stop_by_server
from backend.runs.models import Attempt, AttemptStatus, JobStatus
from backend.runs.reasons import TerminationReason

logger = logging.getLogger(__name__)

# The runner's sampling interval when the workflow sets none (AssignJob.metrics_interval).
DEFAULT_INTERVAL_SECONDS = 5.0
# A Metrics frame leaves the runner at most this long after its samples.
FRAME_SECONDS = 5.0
# Attempts looked at in one pass (the oldest first); the rest wait for the next.
BATCH = 2000


def jobs_guard(now: datetime | None = None) -> int:
    """One pass over the guarded running attempts; how many jobs were stopped."""
    now = now or timezone.now()
    watched = (
        Attempt.objects.filter(status=AttemptStatus.RUNNING, job__status=JobStatus.RUNNING, job__stop_reason="")
        .filter(Q(job__placement__has_key="utilization_policy") | Q(job__placement__has_key="stall"))
        .exclude(started_at=None)
        .select_related("job")
        .order_by("started_at")[:BATCH]
    )
    stopped = 0
    for attempt in watched:
        guards = Guards.of(attempt.job)
        message = None
        reason = TerminationReason.STALLED
        if guards.stall is not None:
            message = _stalled(attempt, guards.stall, now)
        if message is None and guards.utilization is not None:
            message = _idle(attempt, guards.utilization, now)
            reason = TerminationReason.LOW_GPU_UTILIZATION
        if message is None:
            continue
        logger.info("job %s attempt %d: %s", attempt.job_id, attempt.number, message)
        if job_stop_by_server(job=attempt.job, reason=reason, message=message):
            stopped += 1
    return stopped


def _stalled(attempt: Attempt, guard: StallGuard, now: datetime) -> str | None:
    """Why the attempt is stalled, None while it is not."""
    if attempt.last_output_at is None:
        return None  # the commands have not started: preparing is not watched
    limit = timedelta(seconds=guard.timeout)
    last = attempt.last_output_at
    if now - last < limit:
        return None
    value_at = last_training_value_at(attempt.pk)  # read only once the log is quiet
    if value_at is not None and now - value_at < limit:
        return None
    quiet = duration_words(int((now - max(last, value_at or last)).total_seconds()))
    then = "restarting it from its last checkpoint" if guard.action == "restart" else "stopping it"
    return (
        f"stalled: no log line and no metric value for {quiet} (stall timeout {duration_words(guard.timeout)}); {then}"
    )


def _idle(attempt: Attempt, guard: UtilizationGuard, now: datetime) -> str | None:
    """Why the attempt's GPUs count as idle for the whole window, None while they do not."""
    assert attempt.started_at is not None
    window = timedelta(seconds=guard.window)
    since = now - window
    if attempt.started_at > since:
        return None
    slack = _slack(attempt)
    peak = gpu_peak_since(attempt.pk, since)
    if peak is None or peak.first_at > since + slack:
        return None  # no GPU samples, or none from the window's start: not known to be idle
    if now - peak.last_at > slack:
        return None  # the samples stopped arriving: the GPUs' recent use is not known
    if peak.util >= guard.min_gpu_utilization:
        return None
    return (
        f"every GPU stayed below {guard.min_gpu_utilization}% for {duration_words(guard.window)} "
        f"(the highest was {peak.util:.0f}%; utilization_policy)"
    )


def _slack(attempt: Attempt) -> timedelta:
    """How far apart samples may be and still cover the window: two sampling
    intervals and the time a frame takes to leave the runner."""
    metrics = attempt.job.spec.get("metrics") or {}
    interval = float(metrics.get("interval") or DEFAULT_INTERVAL_SECONDS)
    return timedelta(seconds=2 * interval + FRAME_SECONDS)
