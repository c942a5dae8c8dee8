"""Celery tasks: thin wrappers that call one service each.

Tasks take ids only (or nothing), are idempotent and safe to run twice.
Each is a ``GuardedTask`` (backend/core/deliveries.py): parked after its
worker died under it too often; ``on_park`` says what then fails.
"""

from __future__ import annotations

from celery import shared_task

from backend.core.deliveries import on_park
from backend.runs.scheduler.coalesce import schedule_parked, schedule_passes
from backend.runs.services.budgets import budgets_enforce as budgets_enforce_service
from backend.runs.services.guards import jobs_guard as jobs_guard_service
from backend.runs.services.logarchive import logs_archive as logs_archive_service
from backend.runs.services.loglimits import logs_prune as logs_prune_service
from backend.runs.services.reconcile import reconcile as reconcile_service
from backend.runs.services.submissions import submission_keys_expire as submission_keys_expire_service
from backend.runs.wakeups import schedule_request


@shared_task(acks_late=True, time_limit=60, soft_time_limit=50)
def schedule(flagged: bool = False) -> int:
    """Coalesced passes (``runs.scheduler.coalesce``); returns how many ran.
    ``flagged``: enqueued by ``schedule_request``, which set the dirty flag;
    enqueued any other way (by name, from ``clouds``) it is a request itself."""
    return schedule_passes(requested=not flagged)


@shared_task(acks_late=True, time_limit=60, soft_time_limit=50, expires=10)
def reconcile() -> None:
    if reconcile_service():
        schedule_request()


@shared_task(acks_late=True, time_limit=120, soft_time_limit=100, expires=30)
def jobs_guard() -> int:
    """Jobs past a guard (``utilization_policy``, ``stall``) are stopped; bounded per call."""
    return jobs_guard_service()


@shared_task(acks_late=True, time_limit=60, soft_time_limit=50, expires=15)
def budgets_enforce() -> int:
    """Budgets over the running jobs: notices at the warning and at 100 %, the budget's stop; runs stopped."""
    return len(budgets_enforce_service().stopped)


@shared_task(acks_late=True, time_limit=600, soft_time_limit=540, expires=3600)
def logs_prune() -> int:
    """Retention (TRAINYARD_LOG_RETENTION_DAYS), hourly from the beat; bounded per call."""
    return logs_prune_service()


@shared_task(acks_late=True, time_limit=120, soft_time_limit=100, expires=3600)
def submission_keys_expire() -> int:
    """Idempotency keys past their window, hourly from the beat."""
    return submission_keys_expire_service()


@shared_task(acks_late=True, time_limit=300, soft_time_limit=270, expires=60)
def logs_archive() -> int:
    """Finished jobs' logs into their workspace's storage, every 30 s from the beat; bounded per call."""
    return logs_archive_service()


on_park("backend.runs.tasks.schedule")(schedule_parked)
