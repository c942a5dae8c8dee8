"""Publishing to the channel layer: how events cross web processes.

Group names: ``run.<run id>`` (a run's status and log lines) and
``workspace.<workspace id>`` (status changes of every run in it).

**Run publication: one outbox, flushed on commit.** A run's status reaches
its followers and its workspace's only through the outbox here:

- The state machine records each run it changes with
  ``publish_on_commit(run_id)``, in the transaction that changes it.
- When that transaction commits, its outbox is flushed: each run recorded
  is published once, in the order first recorded, with a snapshot read after
  the commit (so it shows every change the transaction made). A change
  rolled back, with its transaction or with the savepoint it was made in, is
  never published: Django drops its commit hook. Outside a transaction a
  change commits at once, and is published at once.
- A caller that must send something before the runs' publication (the
  runner's confirmation of an acceptance, on the warm start's critical path;
  a submission's answer, whose snapshot the followers get too) holds the
  flush: inside ``publishing_held()`` the runs of each commit are kept, in
  order, in the list it yields, and the caller publishes them with
  ``publish_runs`` once it has sent. If the code inside raises, what it held
  is published then.

The outbox and the hold are per thread, as Django's database connections
are: a commit runs its hooks in the thread that made it.

A run is shown as the API shows it, but this leaf imports no API module:
``RunsConfig.ready`` plugs the API's snapshot in (``snapshot_with``); until
then (a process without the app registry) nothing is published.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from django.db import transaction

from backend.core.channels import publish, send_to_channel
from backend.runs.models import Run

logger = logging.getLogger(__name__)

__all__ = [
    "attempt_ended_on_commit",
    "on_attempt_end",
    "publish",
    "publish_on_commit",
    "publish_runs",
    "publishing_held",
    "run_group",
    "send_to_channel",
    "snapshot_with",
    "workspace_group",
]

# How a run looks on the wire: the API's shape, plugged in by RunsConfig.ready.
_snapshot: Callable[[Run], dict[str, Any]] | None = None


def snapshot_with(snapshot: Callable[[Run], dict[str, Any]]) -> None:
    global _snapshot
    _snapshot = snapshot


class _Outbox:
    """The runs of one transaction that its commit has published (or handed
    to a hold) so far: each only once."""

    __slots__ = ("committed", "sent")

    def __init__(self) -> None:
        self.committed = False  # its commit hooks have started: later changes go to a new outbox
        self.sent: set[str] = set()

    def flush(self, run_id: str) -> None:
        """One change's commit hook: Django runs a transaction's hooks in the
        order they were recorded, once it has committed, so the first hook of
        a run publishes it, after every change of the transaction."""
        self.committed = True
        if run_id in self.sent:
            return
        self.sent.add(run_id)
        held: list[str] | None = getattr(_local, "held", None)
        if held is None:
            _publish_run(run_id)
        elif run_id not in held:
            held.append(run_id)


# Per thread: ``outbox`` (the current transaction's) and ``held`` (``publishing_held``).
_local = threading.local()


def publish_on_commit(run_id: str) -> None:
    """Record that ``run_id`` changed: its status is published when the
    current transaction commits (at once outside one), unless it rolls back."""
    outbox: _Outbox | None = getattr(_local, "outbox", None)
    if outbox is None or outbox.committed:
        outbox = _local.outbox = _Outbox()
    transaction.on_commit(partial(outbox.flush, run_id))


@contextmanager
def publishing_held() -> Iterator[list[str]]:
    """Inside, the runs that commits publish are kept in the list this
    yields, in order, each once; the caller publishes them with
    ``publish_runs`` once it has sent what must go first."""
    outer = getattr(_local, "held", None)
    held: list[str] = []
    _local.held = held
    try:
        yield held
    except BaseException:
        # What committed before the error is published now: the caller that
        # would have published it will not.
        _local.held = outer
        publish_runs(held)
        raise
    finally:
        _local.held = outer


def publish_runs(run_ids: Iterable[str], *, shown: tuple[Run, dict[str, Any]] | None = None) -> None:
    """Publish held runs, in order; ``shown`` is one run and the snapshot the
    caller read already (a submission's answer), not read again."""
    for run_id in run_ids:
        if shown is not None and str(shown[0].pk) == run_id:
            _publish(*shown)
        else:
            _publish_run(run_id)


def _publish_run(run_id: str) -> None:
    """The run's current state to its followers and its workspace's."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or _snapshot is None:
        return
    _publish(run, _snapshot(run))


def _publish(run: Run, data: dict[str, Any]) -> None:
    publish(run_group(run.pk), {"type": "run.status", "run": data})
    publish(workspace_group(run.workspace_id), {"type": "run.status", "run": data})


# Who is told when an attempt ends, after its transaction commits: the access
# app (it ends the attempt's sessions), plugged in by its ``AppConfig.ready``
# so that nothing of ``backend.runs`` imports it. Called with the attempt's
# id, its termination reason and message.
AttemptEndListener = Callable[[str, str, str], None]
_attempt_end_listeners: list[AttemptEndListener] = []


def on_attempt_end(listener: AttemptEndListener) -> None:
    if listener not in _attempt_end_listeners:
        _attempt_end_listeners.append(listener)


def attempt_ended_on_commit(*, attempt_id: str, reason: str, message: str) -> None:
    """Tell every listener that the attempt ended, once the current
    transaction commits (never if it rolls back). A listener's failure is
    logged: the attempt's end stands whatever it does."""
    for listener in _attempt_end_listeners:
        transaction.on_commit(partial(_tell, listener, attempt_id, reason, message))


def _tell(listener: AttemptEndListener, attempt_id: str, reason: str, message: str) -> None:
    try:
        listener(attempt_id, reason, message)
    except Exception:
        logger.exception("telling %s that attempt %s ended failed", getattr(listener, "__name__", listener), attempt_id)


def run_group(run_id: object) -> str:
    return f"run.{run_id}"


def workspace_group(workspace_id: object) -> str:
    return f"workspace.{workspace_id}"
