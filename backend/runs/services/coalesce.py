"""Scheduling requests coalesce: many requests, few passes.

Everything that may let a job start (a submission, a runner's hello, a job
that ended, a machine that came up, the reconciler) asks for a pass with
``schedule_request``, after its commit. A request sets a dirty flag in Redis
and enqueues a ``schedule`` task unless one is queued already (at most one
waits; it runs all the requests made before it starts). The task runs
``schedule_passes``:

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
from collections.abc import Callable
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from backend.core.deliveries import Parked, delivery_number, internal_error
from backend.core.redis import redis_client
from backend.runs.services.scheduling import jobs_schedule
from backend.runs.services.transitions import job_fail_pending

logger = logging.getLogger(__name__)

DIRTY_KEY = "trainyard:schedule:dirty"
QUEUED_KEY = "trainyard:schedule:queued"
# Passes run so far (all processes): a counter for operators and tests.
PASSES_KEY = "trainyard:schedule:passes"
# A queued task whose message was lost (a broker flush) stops blocking new ones after this long.
QUEUED_TTL_SECONDS = 30


def schedule_request() -> bool:
    """Ask for a scheduling pass (call it after commit); True when this
    request enqueued a task. May raise what the broker raises when the task
    cannot be enqueued."""
    queued = _redis(_mark_dirty)
    if queued is not None and not queued:
        return False  # a task is queued and has not started: it will see the flag
    from backend.runs.tasks import schedule

    schedule.delay(flagged=True)
    return True


def schedule_passes(*, requested: bool = False) -> int:
    """Run passes while requests are pending (see the module's steps);
    returns how many ran. ``requested``: the caller asks for one itself."""
    _redis(lambda r: r.delete(QUEUED_KEY))  # requests from now on queue the next task
    if requested:
        _redis(lambda r: r.set(DIRTY_KEY, 1))
    passes = 0
    force = delivery_number() > 1
    while passes < settings.TRAINYARD["SCHEDULE_MAX_PASSES"]:
        if not (force or _dirty()):
            return passes
        force = False
        try:
            result = jobs_schedule(on_lock=_clear)
        except BaseException:
            _redis(lambda r: r.set(DIRTY_KEY, 1))  # the pass did not finish: the request it cleared stands
            raise
        if result.busy:
            return passes
        passes += 1
        _redis(lambda r: r.incr(PASSES_KEY))
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


def _mark_dirty(r: Any) -> bool:
    """Set the flag; True when no task was queued (this request queues one)."""
    pipe = r.pipeline(transaction=False)
    pipe.set(DIRTY_KEY, 1)
    pipe.set(QUEUED_KEY, 1, nx=True, ex=QUEUED_TTL_SECONDS)
    return bool(pipe.execute()[1])


def _dirty() -> bool:
    found = _redis(lambda r: r.exists(DIRTY_KEY))
    return found is None or bool(found)  # Redis unreadable: run the pass rather than skip one


def _clear() -> None:
    _redis(lambda r: r.delete(DIRTY_KEY))


def _redis(call: Callable[[Any], Any]) -> Any:
    try:
        return call(redis_client())
    except RedisError:
        logger.warning("the scheduler's flags are unavailable; scheduling without coalescing", exc_info=True)
        return None
