"""What the lifecycle tells a workspace's subscriptions (``backend.notify``):
a run that ended, an attempt interrupted, the next attempt of an
interrupted job running, a guard that stops a job, a job waiting long for
capacity. ``transitions`` and the scheduler call these inside the change's
transaction; ``notify_event`` records the deliveries once it commits."""

from __future__ import annotations

from typing import Any

from backend.notify.services import notify_event
from backend.runs.models import FINISHED_RUN, Attempt, Job, Run
from backend.runs.reasons import TerminationReason


def run_ended(run: Run) -> None:
    """``run.succeeded``, ``run.failed`` or ``run.stopped``, as the run now is."""
    if run.status in FINISHED_RUN:
        notify_event(workspace_id=run.workspace_id, type=f"run.{run.status}", data={"run": _run(run)})


def attempt_interrupted(run: Run | None, job: Job, attempt: Attempt, *, retried: bool) -> None:
    """The machine under ``attempt`` went away; ``retried``: the job waits for its next attempt."""
    if run is not None:
        data = {"run": _run(run), "attempt": {**_attempt(job, attempt.number), "retried": retried}}
        notify_event(workspace_id=run.workspace_id, type="attempt.interrupted", data=data)


def attempt_resumed(run: Run | None, job_id: str, number: int) -> None:
    """Attempt ``number`` is running and the one before it was interrupted."""
    before = Attempt.objects.filter(job_id=job_id, number=number - 1).values_list("termination_reason", flat=True)
    if run is None or number < 2 or before.first() != TerminationReason.INTERRUPTED:
        return
    job = Job.objects.only("name").get(pk=job_id)
    data = {"run": _run(run), "attempt": _attempt(job, number)}
    notify_event(workspace_id=run.workspace_id, type="attempt.resumed", data=data)


def guard_fired(run: Run | None, job: Job, *, reason: TerminationReason, message: str) -> None:
    """A guard (``stall``, ``utilization_policy``) stops ``job``: what it saw."""
    if run is not None:
        data = {
            "run": _run(run),
            "job": {"name": job.name, "id": str(job.pk)},
            "guard": reason.value,
            "message": message,
        }
        notify_event(workspace_id=run.workspace_id, type="guard.fired", data=data)


def job_waiting_capacity(run: Run, job: Job, *, since: str, minutes: int, reason: str) -> None:
    """``job`` has waited ``minutes`` for capacity since ``since`` (ISO 8601): why it still waits."""
    data = {
        "run": _run(run),
        "job": {"name": job.name, "id": str(job.pk)},
        "waiting_since": since,
        "waited_minutes": minutes,
        "reason": reason,
    }
    notify_event(workspace_id=run.workspace_id, type="job.waiting_capacity", data=data)


def _run(run: Run) -> dict[str, Any]:
    return {"id": str(run.pk), "name": run.name, "status": run.status, "reason": run.status_reason}


def _attempt(job: Job, number: int) -> dict[str, Any]:
    return {"job": job.name, "job_id": str(job.pk), "number": number}
