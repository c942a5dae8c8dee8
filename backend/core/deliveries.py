"""A task that kills its worker is parked, not redelivered forever.

Tasks run with ``acks_late`` and ``reject_on_worker_lost``: a worker that
dies mid-task (out of memory, a crash in a native library, ``os._exit``)
has the message redelivered. Right for a worker killed by a deploy; a
task that kills every worker it reaches would be redelivered forever.

``GuardedTask`` (the base of the project's tasks) counts the deliveries of
each message in Redis: +1 when it starts, forgotten when it returns or
raises, so only deaths add up (a ``self.retry`` keeps the task id and starts
again from zero). A message whose worker died ``TRAINYARD_TASK_MAX_DELIVERIES``
times is parked on its next delivery: not run; logged at error level;
recorded as a ``ParkedTask`` row (Django admin); and the handler its app
registered with ``on_park`` marks what it was for failed.

A task whose arguments do not say what it works on (a scheduling pass has
none) names it with ``note_subject`` (the job at hand): the subject noted
by the delivery that died is handed to the park handler. It is written to
Redis only on a redelivery, so a healthy pass costs nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Task
from django.conf import settings
from redis.exceptions import RedisError

from backend.core.redis import redis_client

logger = logging.getLogger(__name__)

DELIVERIES_KEY = "trainyard:task-deliveries:{}"
SUBJECT_KEY = "trainyard:task-subject:{}"
# A count outlives any redelivery (the broker's visibility timeout is 10 minutes).
KEY_TTL_SECONDS = 86400


@dataclass(frozen=True)
class Parked:
    task_name: str
    task_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    deaths: int
    subject: str  # what the task noted it was working on when it died, or ""


# task name → marks what the task was for failed; returns what it did (for the row and the log).
ParkHandler = Callable[[Parked], str]
_HANDLERS: dict[str, ParkHandler] = {}
# (task id, delivery number) of the task this worker runs now.
_current: ContextVar[tuple[str, int] | None] = ContextVar("trainyard_task_delivery", default=None)


def on_park(task_name: str) -> Callable[[ParkHandler], ParkHandler]:
    """Register what to fail when ``task_name`` is parked."""

    def register(handler: ParkHandler) -> ParkHandler:
        _HANDLERS[task_name] = handler
        return handler

    return register


def internal_error(parked: Parked) -> str:
    """The reason given to what a parked task was for."""
    name = parked.task_name.rsplit(".", 1)[-1]
    return f"internal error: task {name} [{parked.task_id}] killed its worker {parked.deaths} times; it was parked"


def delivery_number() -> int:
    """Which delivery of its message the running task is (1: the first;
    also outside a task)."""
    current = _current.get()
    return current[1] if current is not None else 1


def note_subject(label: str) -> None:
    """The running task now works on ``label`` ("job:<id>"). A no-op outside
    a task and on a first delivery."""
    current = _current.get()
    if current is None:
        return
    task_id, delivery = current
    if delivery > 1:
        _redis_call(lambda r: r.set(SUBJECT_KEY.format(task_id), label, ex=KEY_TTL_SECONDS))
    _test_crash(label, task_id)


class GuardedTask(Task):
    """Counts its deliveries and parks itself after too many deaths."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task_id = self.request.id
        if self.request.called_directly or self.request.is_eager or not task_id:
            return super().__call__(*args, **kwargs)
        delivery = _redis_call(lambda r: r.incr(DELIVERIES_KEY.format(task_id))) or 1
        _redis_call(lambda r: r.expire(DELIVERIES_KEY.format(task_id), KEY_TTL_SECONDS))
        if delivery > settings.TRAINYARD["TASK_MAX_DELIVERIES"]:
            return _park(self.name, task_id, args, kwargs, deaths=delivery - 1)
        token = _current.set((task_id, delivery))
        try:
            # run, not super().__call__: the worker has pushed the request
            # (id, retries); Task.__call__ would push a bare one over it.
            return self.run(*args, **kwargs)
        finally:
            _current.reset(token)
            _forget(task_id)


# ------------------------------------------------------------------ helpers


def _park(name: str, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, deaths: int) -> None:
    from backend.core.models import ParkedTask  # the Celery app loads this module before Django's apps

    raw = _redis_call(lambda r: r.get(SUBJECT_KEY.format(task_id)))
    parked = Parked(name, task_id, tuple(args), dict(kwargs), deaths, raw.decode() if raw else "")
    outcome = _run_handler(parked)
    ParkedTask.objects.create(
        task_name=name[:200],
        task_id=task_id[:100],
        args=list(parked.args),
        kwargs=parked.kwargs,
        deaths=deaths,
        subject=parked.subject[:200],
        outcome=outcome,
    )
    logger.error(
        "task %s [%s] killed its worker %d times: parked, not run again (subject %s): %s",
        name,
        task_id,
        deaths,
        parked.subject or "-",
        outcome,
    )
    _forget(task_id)


def _run_handler(parked: Parked) -> str:
    handler = _HANDLERS.get(parked.task_name)
    if handler is None:
        return "nothing to mark failed (no park handler for this task)"
    try:
        return handler(parked)
    except Exception as exc:  # the row and the log line are written all the same
        logger.exception("the park handler of %s failed", parked.task_name)
        return f"its park handler failed: {exc}"


def _forget(task_id: str) -> None:
    _redis_call(lambda r: r.delete(DELIVERIES_KEY.format(task_id), SUBJECT_KEY.format(task_id)))


def _redis_call(call: Callable[[Any], Any]) -> Any:
    """Counting is best effort: with Redis down the broker is down too, and
    a task that does run is not refused for want of a count."""
    try:
        return call(redis_client())
    except RedisError:
        logger.warning("task delivery count unavailable", exc_info=True)
        return None


def _test_crash(label: str, task_id: str) -> None:
    """Test hook (TRAINYARD_TEST_CRASH_SUBJECTS=<file>): a task that notes a
    subject listed in the file kills its worker, as a crash in a native
    library would. Never set in production."""
    path = settings.TRAINYARD["TEST_CRASH_SUBJECTS"]
    if not path or not Path(path).exists() or label not in Path(path).read_text().split():
        return
    # Recorded first, so the parked delivery knows (a first delivery records nothing otherwise).
    _redis_call(lambda r: r.set(SUBJECT_KEY.format(task_id), label, ex=KEY_TTL_SECONDS))
    logger.error("test hook: task %s dies on %s", task_id, label)
    os._exit(70)
