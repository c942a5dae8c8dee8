"""Transactions that lost a lock race are tried again, not failed.

Postgres aborts one of two transactions that wait on each other's row
locks (``deadlock detected``) or that conflict under a stricter isolation
(``could not serialize access``). Neither says anything about the request:
the same work, started again, succeeds. ``retry_on_conflict`` wraps the
outermost transaction of a service; nested inside another transaction it
re-raises at once (a savepoint cannot be retried: the outer transaction is
already aborted), and the outermost wrapper retries the whole.
docs/RUNS.md ("Locks") gives the order row locks are taken in.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import psycopg.errors
from django.conf import settings
from django.db import DatabaseError, connection

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
# Back-off before try n (seconds): base * 2^n, with full jitter, so the two
# losers of one race do not meet again at the same instant.
BACKOFF_BASE_SECONDS = 0.02


def is_conflict(exc: BaseException) -> bool:
    """A deadlock or serialization failure, as Django raises it (the psycopg
    error is its cause) or as psycopg does."""
    return isinstance(exc, CONFLICTS) or isinstance(exc.__cause__, CONFLICTS)


def retry_on_conflict(fn: Callable[P, T]) -> Callable[P, T]:
    """Call ``fn`` again (at most ``TRAINYARD_DB_CONFLICT_RETRIES`` more
    times, with jittered back-off) when its transaction lost a deadlock or
    serialization race. ``fn`` must be safe to run again: it opens its own
    transaction, and everything it did in the lost one was rolled back."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        retries = settings.TRAINYARD["DB_CONFLICT_RETRIES"]
        for attempt in range(retries + 1):
            try:
                return fn(*args, **kwargs)
            except DatabaseError as exc:
                if not is_conflict(exc) or connection.in_atomic_block or attempt == retries:
                    raise
                logger.warning("%s lost a lock race (%s); trying again (%d/%d)", fn.__name__, exc, attempt + 1, retries)
                time.sleep(random.uniform(0, BACKOFF_BASE_SECONDS * 2**attempt))
        raise AssertionError("unreachable")  # the loop returns or raises

    return wrapper
