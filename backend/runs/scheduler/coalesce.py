"""Scheduling passes, run for the requests ``backend.runs.wakeups`` flags.

A request sets a dirty flag and enqueues the ``schedule`` task unless one
is queued; the task runs ``schedule_passes``:

1. No flag: nothing was asked since the last pass began; return.
2. The pass takes the scheduler's try-lock (``jobs_schedule``); another
   pass holds it: return at once. The flag stays set, and the holder looks
   at it again when its pass has committed.
3. Holding the lock, the pass clears the flag, then reads the pending jobs:
   a request made after the clear sets the flag again and step 1 of the
   next round sees it. A job submitted during a pass is scheduled by the
   next one; no request is lost.

A redelivered task (its worker died mid-pass, after the pass had cleared
the flag) runs a pass whatever the flag says. After
``TRAINYARD_SCHEDULE_MAX_PASSES`` passes in a row a task hands over to a
fresh one, so one worker is not held forever by a busy installation.
"""

from __future__ import annotations

import logging

from django.conf import settings

from backend.core.deliveries import Parked, delivery_number, internal_error
from backend.runs.lifecycle.transitions import job_fail_pending
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.wakeups import DIRTY_KEY, PASSES_KEY, QUEUED_KEY, flags_call, schedule_request

logger = logging.getLogger(__name__)


def schedule_passes(*, requested: bool = False) -> int:
    """Run passes while requests are pending (see the module's steps);
    returns how many ran. ``requested``: the caller asks for one itself."""
    flags_call(lambda r: r.delete(QUEUED_KEY))  # requests from now on queue the next task
    if requested:
        flags_call(lambda r: r.set(DIRTY_KEY, 1))
    passes = 0
    force = delivery_number() > 1
    while passes < settings.TRAINYARD["SCHEDULE_MAX_PASSES"]:
        if not (force or _dirty()):
            return passes
        force = False
        try:
            result = jobs_schedule(on_lock=_clear)
        except BaseException:
            flags_call(lambda r: r.set(DIRTY_KEY, 1))  # the pass did not finish: the request it cleared stands
            raise
        if result.busy:
            return passes
        passes += 1
        flags_call(lambda r: r.incr(PASSES_KEY))
    if _dirty():
        logger.info("%d scheduling passes in a row; a fresh task takes over", passes)
        schedule_request()
    return passes


def schedule_parked(parked: Parked) -> str:
    """The schedule task killed its worker too often: the job its pass was
    at fails with an internal error, and a fresh pass schedules the others."""
    kind, _, job_id = parked.subject.partition(":")
    try:
        if kind != "job":
            return "no job was noted by the pass that died; nothing failed"
        reason = f"{internal_error(parked)} while scheduling this job"
        failed = job_fail_pending(job_id=job_id, reason=reason)
        return f"job {job_id} failed: {reason}" if failed else f"job {job_id} was no longer pending; nothing failed"
    finally:
        schedule_request()


# ------------------------------------------------------------------ helpers


def _dirty() -> bool:
    found = flags_call(lambda r: r.exists(DIRTY_KEY))
    return found is None or bool(found)  # Redis unreadable: run the pass rather than skip one


def _clear() -> None:
    flags_call(lambda r: r.delete(DIRTY_KEY))
