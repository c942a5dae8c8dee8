"""One idempotent Celery task launches an instance, one terminates it.

Both take the instance id only, re-read the row, and are safe to run twice
(``acks_late``: a worker SIGKILLed mid-task gets the task redelivered, and the
backend's idempotency key makes the second launch find the first machine).
Retries are bounded and only for transient errors. A launch whose worker
died under it too often is parked (backend/core/deliveries.py) and its row
ends as a failed launch.
"""

from __future__ import annotations

from celery import shared_task

from backend.clouds.services.accountpass import ACCOUNT_TASK_SECONDS
from backend.clouds.services.accountpass import account_reconcile as account_reconcile_service
from backend.clouds.services.facts import accounts_refresh_facts
from backend.clouds.services.provisioning import (
    LaunchOutcome,
    instance_launch_parked,
    instance_launch_run,
    instance_terminate_run,
)
from backend.clouds.services.volumes import volumes_reconcile as volumes_reconcile_service
from backend.clouds.services.volumes import volumes_release as volumes_release_service
from backend.core.deliveries import on_park
from backend.core.enqueue import enqueue

LAUNCH_RETRIES = 3
TERMINATE_RETRIES = 60  # a machine that takes long to go down is checked again and again


@shared_task(bind=True, acks_late=True, time_limit=120, soft_time_limit=100, max_retries=LAUNCH_RETRIES)
def instance_launch(self, instance_id: str) -> str:  # type: ignore[no-untyped-def]
    outcome = instance_launch_run(instance_id=instance_id, last_try=self.request.retries >= LAUNCH_RETRIES)
    if isinstance(outcome, LaunchOutcome) and outcome.retry_after is not None:
        raise self.retry(countdown=outcome.retry_after)
    return outcome.status if isinstance(outcome, LaunchOutcome) else str(outcome)


@shared_task(bind=True, acks_late=True, time_limit=120, soft_time_limit=100, max_retries=TERMINATE_RETRIES)
def instance_terminate(self, instance_id: str) -> str:  # type: ignore[no-untyped-def]
    retry_after = instance_terminate_run(instance_id=instance_id)
    if retry_after is not None:
        raise self.retry(countdown=retry_after)
    return "done"


@shared_task(acks_late=True, time_limit=ACCOUNT_TASK_SECONDS, soft_time_limit=ACCOUNT_TASK_SECONDS - 20, expires=30)
def account_reconcile(account_id: str, view: bool = False, sweep: bool = False) -> int:
    """One account's cloud calls of a reconcile pass, under their own time
    limit (``clouds.services.accountpass``); queued by every pass. A machine
    it fences is ended by the next pass; it asks for a scheduling pass when
    it changed something."""
    changed = account_reconcile_service(account_id=account_id, view=view, sweep=sweep)
    if changed:
        enqueue("backend.runs.tasks.reconcile", after_commit=False)
    return changed


@shared_task(acks_late=True, time_limit=300, soft_time_limit=280, expires=300)
def facts_refresh(account_id: str | None = None) -> int:
    """Account facts older than TRAINYARD_FACTS_REFRESH_SECONDS (or one
    account's, right after it was connected); from Celery beat."""
    return accounts_refresh_facts(account_id=account_id)


@shared_task(acks_late=True, time_limit=180, soft_time_limit=160)
def volumes_release(job_id: str) -> int:
    """Detach the volumes of a job whose attempt ended (``volumes.volumes_release``), then ask for a pass."""
    detached = volumes_release_service(job_id=job_id)
    enqueue("backend.runs.tasks.schedule", after_commit=False)
    return detached


@shared_task(acks_late=True, time_limit=300, soft_time_limit=280, expires=60)
def volumes_reconcile() -> int:
    """The volumes' pass (``volumes.volumes_reconcile``); from Celery beat."""
    changed = volumes_reconcile_service()
    if changed:
        enqueue("backend.runs.tasks.schedule", after_commit=False)
    return changed


on_park("backend.clouds.tasks.instance_launch")(instance_launch_parked)
