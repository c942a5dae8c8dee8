"""Asking for a scheduling pass: many requests, few passes.

Everything that may let a job start (a submission, a runner's hello, a job
that ended, a machine that came up, the reconciler) asks for a pass with
``schedule_soon`` (after the caller's commit) or ``schedule_request`` (now).
A request sets a dirty flag in Redis and enqueues the ``schedule`` task
unless one is queued already: at most one waits, and it runs every request
made before it starts (``backend.runs.scheduler.coalesce`` says how a pass
reads the flag).

A leaf: it imports no scheduler, no service and no task module, so anything
in ``backend.runs`` may ask for a pass. A request that cannot be sent (the
broker is down) is logged and the reconciler asks again: it requests a pass
whenever a job is pending.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction
from redis.exceptions import RedisError

from backend.core.enqueue import enqueue
from backend.core.redis import redis_client

logger = logging.getLogger(__name__)

DIRTY_KEY = "trainyard:schedule:dirty"
QUEUED_KEY = "trainyard:schedule:queued"
# Passes run so far (all processes): a counter for operators and tests.
PASSES_KEY = "trainyard:schedule:passes"
# A queued task whose message was lost (a broker flush) stops blocking new ones after this long.
QUEUED_TTL_SECONDS = 30


def schedule_soon() -> None:
    """Ask for a pass once the caller's transaction commits (at once outside one)."""
    transaction.on_commit(schedule_request)


def schedule_request() -> bool:
    """Ask for a pass now; True when this request enqueued the task. Never
    raises: a request the broker did not take is logged, and the queued mark
    is cleared so that the next request sends again."""
    queued = flags_call(_mark_dirty)
    if queued is not None and not queued:
        return False  # a task is queued and has not started: it will see the flag
    if enqueue("backend.runs.tasks.schedule", after_commit=False, flagged=True):
        return True
    flags_call(lambda r: r.delete(QUEUED_KEY))
    return False


def flags_call(call: Callable[[Any], Any]) -> Any:
    """``call(redis)``, or None when Redis is unreadable: the flags only
    coalesce requests, and a pass is better run twice than skipped."""
    try:
        return call(redis_client())
    except RedisError:
        logger.warning("the scheduler's flags are unavailable; scheduling without coalescing", exc_info=True)
        return None


def _mark_dirty(r: Any) -> bool:
    """Set the flag; True when no task was queued (this request queues one)."""
    pipe = r.pipeline(transaction=False)
    pipe.set(DIRTY_KEY, 1)
    pipe.set(QUEUED_KEY, 1, nx=True, ex=QUEUED_TTL_SECONDS)
    return bool(pipe.execute()[1])
