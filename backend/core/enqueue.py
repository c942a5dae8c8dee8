"""The one way the backend queues Celery work: ``enqueue(name, ...)``.

Rules it keeps:

- A task is sent by its registered name, never imported: services do not
  import ``tasks`` modules (an import contract holds it), so a ``tasks``
  module may import the services it wraps without closing a circle. A name
  that is not registered is a programming error and raises at the call,
  before anything commits (``tests/core/test_enqueue.py`` checks every name
  the backend enqueues).
- By default the message goes out once the caller's transaction commits
  (``after_commit=True``): a worker never looks for rows that are not there
  yet, and a rolled-back change queues nothing. Outside a transaction it is
  sent at once.
- One failure policy: a send that fails (the broker is down or stops
  answering) is logged with the task's name and never raised. The caller's
  data has committed by then; what the task was for is found again from
  the database by a periodic pass (the reconciler, the beat schedule), so
  the work waits for that pass and is not lost.

The task's own options (``expires``, time limits) apply: the message is sent
through the registered task's ``apply_async``.
"""

from __future__ import annotations

import importlib
import logging
from functools import partial
from typing import Any

from celery import Task, current_app
from celery.exceptions import NotRegistered
from django.db import transaction

logger = logging.getLogger(__name__)


def enqueue(task_name: str, *args: Any, after_commit: bool = True, **kwargs: Any) -> bool:
    """Queue ``task_name`` with these arguments, after the caller's commit
    unless ``after_commit`` is False. Returns False when a send made now
    failed (logged); True when it was sent or will be on commit."""
    _task(task_name)  # a name no worker knows raises here, before anything commits
    if after_commit:
        transaction.on_commit(partial(send, task_name, args, kwargs))
        return True
    return send(task_name, args, kwargs)


def send(task_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Send now; a failure is logged, never raised (the module's policy)."""
    try:
        _task(task_name).apply_async(args=args, kwargs=kwargs)
    except Exception:
        logger.warning("could not enqueue %s; a periodic pass will do its work", task_name, exc_info=True)
        return False
    return True


def _task(task_name: str) -> Task[..., Any]:
    """The registered task. A process that has not loaded the task's module
    (a web process) loads it: its ``shared_task`` registers itself then."""
    tasks = current_app.tasks
    if task_name not in tasks:
        module = task_name.rpartition(".")[0]
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            raise NotRegistered(task_name) from None
    return tasks[task_name]
